//! A GGUF file from anywhere: parsing, the tokenizer from its metadata, the configuration and
//! the weights must either load or fail with an error; never panic, hang or allocate wildly. The
//! same bytes also arrive as a download does, piece by piece (`model::stream`), onto the CPU.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use saguaro::backend::cpu::CpuBackend;
use saguaro::model::load::from_gguf;
use saguaro::model::stream::GgufStream;

#[global_allocator]
static ALLOC: saguaro_fuzz::Bounded = saguaro_fuzz::Bounded;

fuzz_target!(|data: &[u8]| {
    let _ = from_gguf(Arc::new(data.to_vec()));
    let Ok(cpu) = CpuBackend::new(1) else { return };
    let mut stream = GgufStream::new(cpu, Some(data.len() as u64));
    // Pieces of a size the input picks, so that every split of the header and tensors comes up.
    let piece = 1 + data.first().map_or(0, |&b| b as usize) * 17;
    if data.chunks(piece).all(|p| stream.push(p).is_ok()) {
        let _ = stream.finish();
    }
});
