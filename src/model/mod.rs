//! What a model is: its config, its weights as stored (GGUF or safetensors), its tokenizer.

pub mod config;
pub mod gguf;
pub mod quant;
pub mod weights;
