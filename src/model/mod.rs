//! What a model is: its family ([`arch`]), its config, its weights as stored (GGUF or
//! safetensors), its tokenizer, and the transformer forward over a backend.

pub mod arch;
pub mod config;
pub mod gguf;
pub mod load;
pub mod runner;
pub mod slim;
pub mod tokenizer;
pub mod transformer;
pub mod weights;
