//! Qwen2 and Qwen2.5: Llama's layout with biases on Q, K and V.

use super::{Arch, Family, BASE};

pub(super) const FAMILY: Family = Family { arch: Arch::Qwen2, gguf: "qwen2", hf: &["qwen2"], qkv_bias: true, ..BASE };
