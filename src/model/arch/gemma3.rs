//! Gemma 3: RMS norms before and after attention and the feed-forward, Q/K norms, GeGLU,
//! embeddings scaled by `sqrt(d_model)`, and five sliding-window layers (RoPE base 10,000) to
//! each global one (the file's RoPE base and scaling). GGUF files store norm weights as used;
//! Hugging Face checkpoints store `w - 1`.

use crate::backend::Activation;

use super::{Arch, Family, Windows, BASE};

pub(super) const FAMILY: Family = Family {
    arch: Arch::Gemma3,
    gguf: "gemma3",
    hf: &["gemma3_text"],
    qk_norm: true,
    post_norms: true,
    activation: Activation::GeluTanh,
    scaled_embeddings: true,
    windows: Windows::AllButEvery(6),
    local_rope_theta: Some(10000.0),
    hf_norm_offset: 1.0,
    ..BASE
};
