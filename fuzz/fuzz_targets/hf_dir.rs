//! A Hugging Face model directory from anywhere: config.json, tokenizer.json, the safetensors
//! file and the optional JSON files must either load or fail with an error, never panic.
//!
//! The input holds the files in the order of `FILES`, separated by `SEPARATOR`; a file the input
//! does not reach is absent from the directory (scripts/fuzz-corpus.py writes seeds this way).
#![no_main]

use std::collections::HashMap;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use saguaro::model::load::{from_hf, FileSource};
use saguaro::storage::Storage;
use saguaro::Result;

#[global_allocator]
static ALLOC: saguaro_fuzz::Bounded = saguaro_fuzz::Bounded;

const SEPARATOR: &[u8] = b"\n@@saguaro-file@@\n";
const FILES: [&str; 6] = [
    "config.json",
    "tokenizer.json",
    "model.safetensors",
    "tokenizer_config.json",
    "generation_config.json",
    "model.safetensors.index.json",
];

struct Files(HashMap<&'static str, Storage>);

impl FileSource for Files {
    fn read(&self, name: &str) -> Result<Option<Storage>> {
        Ok(self.0.get(name).cloned())
    }
}

fn split<'a>(mut data: &'a [u8], sep: &[u8]) -> Vec<&'a [u8]> {
    let mut parts = Vec::new();
    while let Some(i) = data.windows(sep.len()).position(|w| w == sep) {
        parts.push(&data[..i]);
        data = &data[i + sep.len()..];
    }
    parts.push(data);
    parts
}

fuzz_target!(|data: &[u8]| {
    let files = FILES
        .iter()
        .zip(split(data, SEPARATOR))
        .map(|(&name, bytes)| (name, Arc::new(bytes.to_vec()) as Storage))
        .collect();
    let _ = from_hf(&Files(files));
});
