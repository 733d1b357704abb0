//! The f64 reference of a matmul output and the error a backend may make in it.
//!
//! Quantized weights are dotted with activations quantized to symmetric integers per block,
//! `q = round(x / d)` with `d = max|x| / L` over the 32 or 256 activations of the block (the CPU
//! backend: `L = 32767` at `Precision::Exact`, 16 bits; `L = 127` at `Precision::Fast`, 8 bits), so
//! each activation is off by at most `d / 2` and a dot product by at most `Σ_j |w_j| d_j / 2`. The
//! bound is exactly that plus `2e-5 Σ_j |w_j x_j|` for f32 rounding. Float weights, and any weight
//! on a backend without activation quantization (`levels` None), are allowed `1e-5 Σ_j |w_j x_j|`.
//!
//! The GPU's f16 arithmetic (`GpuOptions::shader_f16`) rounds to u = 2^-11 where f32 rounds to
//! 2^-24: a value `w = d q + m` decoded in f16 rounds `d` (a product exact in f32), `d q` and the
//! sum, so it is off by at most about `u (2 |d q| + |w|) <= u (3 |w| + 2 |m|)`; the activation and
//! the product round once each, and three f16 additions join a vector's four products, each
//! within `u` of a partial sum of them. Per term that is under `u (8 |w_j| + 2 |m_j|) |x_j|`. The
//! offset `m` is what quant 0 decodes to, which the random blocks here hold or come within a few
//! steps of, so it stays near or below `B_j`, the largest `|w|` of the block: [`f16_error`]
//! allows `u Σ_j (8 |w_j| + 6 B_j) |x_j|`, plus `2^-25` a term for products below f16's normal
//! range.

use saguaro::backend::cpu::Precision;
use saguaro::storage::quant::{self, DType};

/// The `L` of the module doc.
pub fn levels(precision: Precision) -> f64 {
    match precision {
        Precision::Exact => 32767.0,
        Precision::Fast => 127.0,
    }
}

/// `Σ_j |w_j x_j|`, the scale of a dot product's rounding error.
pub fn magnitude(w: &[f32], x: &[f32]) -> f64 {
    w.iter().zip(x).map(|(&w, &x)| (w as f64 * x as f64).abs()).sum()
}

/// The error allowed a dot product of weight row `w` of `dtype` with `x` computed in f16 (see the
/// module doc).
// tests/cpu_kernels.rs includes this file too, with no f16 arithmetic to bound.
#[allow(dead_code)]
pub fn f16_error(dtype: DType, w: &[f32], x: &[f32]) -> f64 {
    let u = 2f64.powi(-11);
    let block = match dtype.block_size() {
        1 => 1,
        n => n,
    };
    let terms: f64 = w
        .chunks(block)
        .zip(x.chunks(block))
        .map(|(w, x)| {
            let b = w.iter().fold(0.0f64, |m, &v| m.max((v as f64).abs()));
            w.iter().zip(x).map(|(&w, &x)| (8.0 * (w as f64).abs() + 6.0 * b) * (x as f64).abs()).sum::<f64>()
        })
        .sum();
    u * terms + w.len() as f64 * 2f64.powi(-25)
}

/// The exact dot product of a (dequantized) weight row `w` of `dtype` with `x`, and the error
/// allowed with activations quantized to `levels` (see the module doc).
pub fn dot(dtype: DType, levels: Option<f64>, w: &[f32], x: &[f32]) -> (f64, f64) {
    let exact: f64 = w.iter().zip(x).map(|(&w, &x)| w as f64 * x as f64).sum();
    let act_block = match dtype {
        DType::F32 | DType::F16 | DType::BF16 => None,
        DType::Q4K | DType::Q5K | DType::Q6K => Some(quant::QK_K),
        _ => Some(quant::QK),
    };
    let (Some(bs), Some(levels)) = (act_block, levels) else {
        return (exact, 1e-5 * magnitude(w, x) + 1e-6);
    };
    let rounding: f64 = w
        .chunks(bs)
        .zip(x.chunks(bs))
        .map(|(w, x)| {
            let d = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / levels;
            w.iter().map(|&w| (w as f64).abs()).sum::<f64>() * d / 2.0
        })
        .sum();
    (exact, rounding + 2e-5 * magnitude(w, x) + 1e-6)
}
