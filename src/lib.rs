//! Saguaro: LLM inference on WebGPU, natively through wgpu, or on the CPU, made fast with
//! speculative speculative decoding (SSD).
//!
//! Layering (top to bottom): [`decode`] strategies drive models through [`model::runner::Lm`];
//! [`model`] holds what a model is and its forward pass, written once over [`backend::Backend`];
//! backends run the ops. [`kv`] is KV-cache bookkeeping, [`sampling`] turns logits into tokens.

pub mod backend;
pub mod decode;
pub mod error;
pub mod kv;
pub mod model;
pub mod runtime;
pub mod sampling;

pub use error::{Error, Result};
