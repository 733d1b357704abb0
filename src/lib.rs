//! Saguaro: LLM inference on WebGPU, natively through wgpu, or on the CPU, made fast with
//! speculative speculative decoding (SSD).
//!
//! Layering (top to bottom): [`decode`] strategies drive models through [`model::runner::Lm`];
//! [`model`] holds what a model is and its forward pass, written once over [`backend::Backend`];
//! backends run the ops. [`kv`] is KV-cache bookkeeping, [`sampling`] turns logits into tokens.
//! [`engine::Engine`] ties them together (models placed on backends, tokenizer, chat template,
//! mode choice, streaming text); the CLI and the JS API are thin front-ends over it.

pub mod backend;
pub mod contract;
pub mod decode;
pub mod engine;
pub mod error;
pub mod grammar;
pub mod kv;
pub mod model;
#[cfg(feature = "native")]
pub mod openai;
pub mod pool;
pub mod remote;
pub mod runtime;
pub mod sampling;
pub mod storage;
#[cfg(all(target_arch = "wasm32", feature = "wasm"))]
pub mod wasm;

pub use engine::{Completion, Engine, EngineOptions, GenerateOptions, Prompt};
pub use error::{Error, Result};
