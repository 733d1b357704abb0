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
    /// A one-layer, 16-token model's shape for unit tests that never run its weights.
    #[cfg(test)]
    pub(crate) fn tiny() -> Self {
        ModelConfig {
            arch: Arch::Llama,
            n_layers: 1,
            d_model: 8,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 8,
            d_ffn: 8,
            vocab_size: 16,
            rope_theta: 1e4,
            rms_eps: 1e-5,
            context_length: 64,
            tied_embeddings: true,
        }
    }

    /// Every dimension nonzero, consistent and within sane bounds (far above any model this
    /// engine runs, far below sizes whose products could overflow), before anything is
    /// allocated from them.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::invalid_model(m));
        let limits = [
            ("n_layers", self.n_layers, 1024),
            ("d_model", self.d_model, 1 << 16),
            ("n_heads", self.n_heads, 1024),
            ("n_kv_heads", self.n_kv_heads, 1024),
            ("head_dim", self.head_dim, 1024),
            ("d_ffn", self.d_ffn, 1 << 20),
            ("vocab_size", self.vocab_size, 1 << 22),
            ("context_length", self.context_length, 1 << 24),
        ];
        for (name, value, max) in limits {
            if value == 0 || value > max {
                return bad(format!("model dimension {name} = {value} is outside 1..={max}"));
            }
        }
        if self.n_heads % self.n_kv_heads != 0 {
            return bad(format!("{} heads not divisible by {} kv heads", self.n_heads, self.n_kv_heads));
        }
        if self.head_dim % 2 != 0 {
            return bad(format!("head dimension {} must be even", self.head_dim));
        }
        for (name, value) in [("rope_theta", self.rope_theta), ("rms_eps", self.rms_eps)] {
            if !(value.is_finite() && value > 0.0) {
                return bad(format!("{name} = {value} must be a positive number"));
            }
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
