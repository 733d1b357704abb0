//! A GGUF file from anywhere: parsing, the tokenizer from its metadata, the configuration and
//! the weights must either load or fail with an error; never panic, hang or allocate wildly.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use saguaro::model::load::from_gguf;

#[global_allocator]
static ALLOC: saguaro_fuzz::Bounded = saguaro_fuzz::Bounded;

fuzz_target!(|data: &[u8]| {
    let _ = from_gguf(Arc::new(data.to_vec()));
});
