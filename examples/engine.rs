//! The library's `Engine` in a few lines (the README's Rust example): the Qwen pair from models/
//! (scripts/fetch-models.sh), one greedy generation in the engine's default mode, streamed to
//! stdout.
//!
//! cargo run --release --example engine

use futures::executor::block_on;
use saguaro::{model::load::open, Engine, EngineOptions, GenerateOptions, Prompt};

fn main() -> saguaro::Result<()> {
    let target = open("models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf".as_ref())?;
    let draft = open("models/qwen2.5-coder-0.5b-instruct.gguf".as_ref())?;
    let mut engine = block_on(Engine::new(target, Some(draft), &EngineOptions::default()))?;
    let opts = GenerateOptions { max_tokens: 128, ..GenerateOptions::default() };
    let prompt = Prompt::Text("def quicksort(arr):".into());
    let out = block_on(engine.generate(&prompt, &opts, &mut |piece, _| { print!("{piece}"); true }))?;
    println!("\n{} tokens at {:.1} tok/s ({})", out.stats.generated, out.stats.tokens_per_s, out.stats.mode);
    Ok(())
}
