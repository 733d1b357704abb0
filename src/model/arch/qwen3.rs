//! Qwen3: no Q/K/V biases, Q and K RMS-normed per head before RoPE.

use super::{Arch, Family, BASE};

pub(super) const FAMILY: Family = Family { arch: Arch::Qwen3, gguf: "qwen3", hf: &["qwen3"], qk_norm: true, ..BASE };
