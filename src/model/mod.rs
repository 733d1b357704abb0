//! What a model is: its family ([`arch`]), its config, its weights as stored (GGUF or
//! safetensors, or streamed onto a backend as it downloads), its tokenizer, and the transformer
//! forward over a backend.

pub mod arch;
pub mod config;
pub mod gguf;
pub mod gguf_writer;
pub mod load;
pub mod runner;
pub mod shared;
pub mod slim;
pub mod split;
pub mod stream;
#[cfg(feature = "native")]
pub mod synth;
pub mod tokenizer;
pub mod transformer;
pub mod weights;
