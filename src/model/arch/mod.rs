//! What differs between model families, said once per family: each family is one file holding
//! its [`Family`], and the shared loader (`model::load`) and forward (`model::transformer`) read
//! nothing else. A new family is a new file here and a line in [`FAMILIES`].

mod gemma3;
mod llama;
mod phi3;
mod qwen2;
mod qwen3;

pub use llama::llama3_factors;

use crate::backend::Activation;
use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    Phi3,
}

/// Which layers of a family attend through a sliding window, where its file sets one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Windows {
    /// None: the family attends globally whatever the file says.
    Never,
    /// Every layer.
    All,
    /// All but every `n`-th layer (layers `n - 1`, `2n - 1`, ... attend globally).
    AllButEvery(usize),
}

/// A family's architecture: the layout of its files and the shape of its forward.
#[derive(Debug)]
pub struct Family {
    pub arch: Arch,
    /// `general.architecture` in a GGUF file.
    pub gguf: &'static str,
    /// The `model_type` values of a Hugging Face `config.json`.
    pub hf: &'static [&'static str],
    /// Q, K and V projections have biases.
    pub qkv_bias: bool,
    /// Q and K are RMS-normed per head before RoPE.
    pub qk_norm: bool,
    /// The attention and feed-forward outputs are RMS-normed before the residual add.
    pub post_norms: bool,
    pub activation: Activation,
    /// Embeddings are multiplied by `sqrt(d_model)`.
    pub scaled_embeddings: bool,
    /// GGUF files store Q/K rows with each RoPE pair adjacent (llama.cpp's "normal" RoPE); the
    /// forward's rotate-half RoPE needs them `rotary_dim / 2` apart.
    pub gguf_interleaved_qk: bool,
    /// The files hold Q, K and V as one matrix, and gate and up as another.
    pub fused: bool,
    /// Which layers attend through the file's sliding window.
    pub windows: Windows,
    /// The RoPE base of windowed layers, where it differs from the file's.
    pub local_rope_theta: Option<f32>,
    /// Hugging Face checkpoints store RMSNorm weights as `w - offset`.
    pub hf_norm_offset: f32,
}

/// Every supported family.
static FAMILIES: [&Family; 5] = [&llama::FAMILY, &qwen2::FAMILY, &qwen3::FAMILY, &gemma3::FAMILY, &phi3::FAMILY];

fn supported() -> String {
    FAMILIES.iter().map(|f| f.gguf).collect::<Vec<_>>().join(", ")
}

impl Arch {
    pub fn family(self) -> &'static Family {
        FAMILIES.iter().find(|f| f.arch == self).expect("every Arch has a family")
    }

    /// The family of a GGUF `general.architecture`.
    pub fn from_gguf(name: &str) -> Result<Self> {
        FAMILIES
            .iter()
            .find(|f| f.gguf == name)
            .map(|f| f.arch)
            .ok_or_else(|| Error::Unsupported(format!("architecture '{name}' (supported: {})", supported())))
    }

    /// The family of a Hugging Face `model_type`.
    pub fn from_hf(model_type: &str) -> Result<Self> {
        FAMILIES.iter().find(|f| f.hf.contains(&model_type)).map(|f| f.arch).ok_or_else(|| {
            let known: Vec<&str> = FAMILIES.iter().flat_map(|f| f.hf.iter().copied()).collect();
            Error::Unsupported(format!("model_type '{model_type}' (supported: {})", known.join(", ")))
        })
    }
}

/// The fields most families share, for the family files to override.
pub(crate) const BASE: Family = Family {
    arch: Arch::Llama,
    gguf: "",
    hf: &[],
    qkv_bias: false,
    qk_norm: false,
    post_norms: false,
    activation: Activation::Silu,
    scaled_embeddings: false,
    gguf_interleaved_qk: false,
    fused: false,
    windows: Windows::Never,
    local_rope_theta: None,
    hf_norm_offset: 0.0,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_arch_has_one_family_and_names_round_trip() {
        for f in FAMILIES {
            assert_eq!(f.arch.family().gguf, f.gguf, "{:?}", f.arch);
            assert_eq!(Arch::from_gguf(f.gguf).unwrap(), f.arch);
            for name in f.hf {
                assert_eq!(Arch::from_hf(name).unwrap(), f.arch);
            }
        }
    }

    #[test]
    fn an_unknown_architecture_names_the_supported_ones() {
        let e = Arch::from_gguf("mamba").unwrap_err().to_string();
        assert!(e.contains("'mamba'") && e.contains("gemma3") && e.contains("qwen3") && e.contains("phi3"), "{e}");
    }
}
