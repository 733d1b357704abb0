//! What a transformer is, independent of the file it came from.

use crate::backend::{AttnShape, Rope};
use crate::error::{Error, Result};
pub use crate::model::arch::{Arch, Family, Windows};

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
    /// How many values of each head RoPE rotates (`head_dim`, or fewer for partial rotary).
    pub rotary_dim: usize,
    /// Linear RoPE position scaling (1: none).
    pub rope_freq_scale: f32,
    /// What RoPE's cos and sin are scaled by (long RoPE's attention factor; 1: none).
    pub rope_attn_factor: f32,
    /// The sliding window of the family's windowed layers, in positions.
    pub sliding_window: Option<usize>,
    /// What each attention score is multiplied by (`1 / sqrt(head_dim)` for most families).
    pub attn_scale: f32,
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
            rotary_dim: 8,
            rope_freq_scale: 1.0,
            rope_attn_factor: 1.0,
            sliding_window: None,
            attn_scale: 8f32.sqrt().recip(),
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
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!("{} heads not divisible by {} kv heads", self.n_heads, self.n_kv_heads));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head dimension {} must be even", self.head_dim));
        }
        if self.rotary_dim == 0 || !self.rotary_dim.is_multiple_of(2) || self.rotary_dim > self.head_dim {
            return bad(format!("RoPE dimension {} must be even and within the head's {}", self.rotary_dim, self.head_dim));
        }
        if self.sliding_window == Some(0) || self.sliding_window.is_some_and(|w| w > u32::MAX as usize) {
            return bad("a sliding window of 0 positions".into());
        }
        let positive = [
            ("rope_theta", self.rope_theta),
            ("rms_eps", self.rms_eps),
            ("rope_freq_scale", self.rope_freq_scale),
            ("rope_attn_factor", self.rope_attn_factor),
            ("attn_scale", self.attn_scale),
        ];
        for (name, value) in positive {
            if !(value.is_finite() && value > 0.0) {
                return bad(format!("{name} = {value} must be a positive number"));
            }
        }
        Ok(())
    }
    pub fn family(&self) -> &'static Family {
        self.arch.family()
    }

    /// Whether layer `layer` attends through the sliding window.
    fn windowed(&self, layer: usize) -> bool {
        self.sliding_window.is_some()
            && match self.family().windows {
                Windows::Never => false,
                Windows::All => true,
                Windows::AllButEvery(n) => !(layer + 1).is_multiple_of(n),
            }
    }

    /// Layer `layer`'s attention: its scale and window.
    pub fn attn_shape(&self, layer: usize) -> AttnShape {
        AttnShape {
            scale: self.attn_scale,
            window: self.sliding_window.filter(|_| self.windowed(layer)).map(|w| w as u32),
            ..AttnShape::new(self.n_heads, self.n_kv_heads, self.head_dim)
        }
    }

    /// Layer `layer`'s RoPE, with the file's frequency `factors`. A windowed layer of a family
    /// with a local RoPE base rotates at that base, unscaled.
    pub fn rope<'a>(&self, layer: usize, factors: Option<&'a [f32]>) -> Rope<'a> {
        let global = Rope {
            head_dim: self.head_dim,
            rotary_dim: self.rotary_dim,
            theta: self.rope_theta,
            freq_scale: self.rope_freq_scale,
            attn_factor: self.rope_attn_factor,
            factors,
        };
        match self.family().local_rope_theta {
            Some(theta) if self.windowed(layer) => {
                Rope { theta, freq_scale: 1.0, attn_factor: 1.0, factors: None, ..global }
            }
            _ => global,
        }
    }

    /// What embeddings are multiplied by.
    pub fn embed_scale(&self) -> f32 {
        if self.family().scaled_embeddings {
            (self.d_model as f32).sqrt()
        } else {
            1.0
        }
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_window_or_rope_shape_is_refused_by_name() {
        let bad = |c: ModelConfig| c.validate().unwrap_err().to_string();
        assert!(bad(ModelConfig { sliding_window: Some(0), ..ModelConfig::tiny() }).contains("a sliding window of 0 positions"));
        for rotary_dim in [0, 3, 10] {
            let msg = bad(ModelConfig { rotary_dim, ..ModelConfig::tiny() });
            assert!(msg.contains(&format!("RoPE dimension {rotary_dim} must be even")), "{msg}");
        }
        let msg = bad(ModelConfig { attn_scale: f32::NAN, ..ModelConfig::tiny() });
        assert!(msg.contains("attn_scale = NaN must be a positive number"), "{msg}");
    }
}
