//! What a transformer is, independent of the file it came from.

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Arch {
    Llama,
    Qwen2,
}

impl Arch {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            other => Err(Error::Unsupported(format!(
                "architecture '{other}' (supported: llama, qwen2)"
            ))),
        }
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub d_ffn: usize,
    pub vocab_size: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    pub context_length: usize,
    pub tied_embeddings: bool,
}

impl ModelConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::invalid_model(m));
        if self.n_layers == 0 || self.d_model == 0 || self.n_heads == 0 || self.n_kv_heads == 0 {
            return bad(format!("degenerate model dimensions: {self:?}"));
        }
        if self.n_heads % self.n_kv_heads != 0 {
            return bad(format!("{} heads not divisible by {} kv heads", self.n_heads, self.n_kv_heads));
        }
        if self.head_dim % 2 != 0 || self.head_dim == 0 {
            return bad(format!("head dimension {} must be even", self.head_dim));
        }
        if self.n_layers > 1024 || self.d_model > 1 << 16 || self.vocab_size > 1 << 22 {
            return bad(format!("implausible model dimensions: {self:?}"));
        }
        Ok(())
    }
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
