//! Phi-3 and Phi-4-mini: Q, K, V fused into one matrix and gate and up into another in GGUF
//! files, partial rotary embeddings (Phi-4-mini rotates 3/4 of each head), and long RoPE's
//! per-frequency factors.

use super::{Arch, Family, BASE};

pub(super) const FAMILY: Family = Family { arch: Arch::Phi3, gguf: "phi3", hf: &["phi3"], fused: true, ..BASE };
