//! Saguaro: LLM inference on WebGPU, natively through wgpu, or on the CPU, made fast with
//! speculative speculative decoding (SSD).

pub mod error;
pub mod model;

pub use error::{Error, Result};
