//! The CPU matmul kernels of every weight format against the f32 reference (`quant::dequantize`,
//! dotted in f64), on random blocks, odd shapes and batch sizes 1 to 64, for both the portable and
//! the best kernels of this machine.
//!
//! Tolerance. Quantized weights are dotted with activations quantized to two 8-bit parts per block,
//! `x ≈ d q + d' q'` (`d = max|x| / 127` over the 32 or 256 activations of the block, `q'` the
//! remainder quantized the same way), so each activation is off by at most `d' / 2 <= d / 508` and a
//! dot product by at most `Σ_j |w_j| d_j / 508`. The test allows exactly that bound plus
//! `2e-5 Σ_j |w_j x_j|` for f32 rounding. Float weights see no activation quantization and are
//! allowed `1e-5 Σ_j |w_j x_j|`. The portable and best kernels compute the same integer sums, so
//! they must agree to `1e-5 Σ_j |w_j x_j|`. At `Precision::Fast` (one 8-bit part) each activation is
//! off by at most `d / 2`, and the bound is scaled accordingly.
//!
//! The same tests run in headless Chromium on wasm32 (`scripts/test-wasm.sh`), where the best
//! kernels are the simd128 ones.

#[path = "util/rand.rs"]
#[allow(dead_code)]
mod rand;

use saguaro::backend::cpu::{matmul_with, CpuPool, KernelPath, Precision};
use saguaro::backend::random_weight;
use saguaro::model::quant::{self, DType};
use rand::TestRng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// The reference dot product and the error it allows (see the module doc).
fn reference(dtype: DType, precision: Precision, w: &[f32], x: &[f32]) -> (f64, f64) {
    let act_block = match dtype {
        DType::F32 | DType::F16 | DType::BF16 => None,
        DType::Q4K | DType::Q5K | DType::Q6K => Some(quant::QK_K),
        _ => Some(quant::QK),
    };
    let exact: f64 = w.iter().zip(x).map(|(&w, &x)| w as f64 * x as f64).sum();
    let magnitude: f64 = w.iter().zip(x).map(|(&w, &x)| (w as f64 * x as f64).abs()).sum();
    let Some(bs) = act_block else {
        return (exact, 1e-5 * magnitude + 1e-6);
    };
    let per_d = match precision {
        Precision::Exact => 508.0,
        Precision::Fast => 2.0,
    };
    let rounding: f64 = w
        .chunks(bs)
        .zip(x.chunks(bs))
        .map(|(w, x)| {
            let d = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
            w.iter().map(|&w| (w as f64).abs()).sum::<f64>() * d / per_d
        })
        .sum();
    (exact, rounding + 2e-5 * magnitude + 1e-6)
}


fn check_format(dtype: DType, precision: Precision, pool: &CpuPool) {
    let mut rng = TestRng::new(dtype.block_bytes() as u64 * 7919 + 1);
    let n = 37;
    // Odd block counts; float rows also get lengths that leave a SIMD tail.
    let ks: Vec<usize> = match dtype.block_size() {
        1 => vec![43, 117],
        bs => vec![3 * bs, 5 * bs],
    };
    for k in ks {
        let w = random_weight(dtype, n, k, rng.next()).unwrap();
        let wf = w.to_f32();
        for m in [1, 5, 16, 64] {
            let mut x: Vec<f32> = (0..m * k).map(|_| rng.activation()).collect();
            // An all-zero activation block must not turn into NaNs.
            x[..dtype.block_size().max(32).min(k)].fill(0.0);
            let mut got = [vec![0.0; m * n], vec![0.0; m * n]];
            matmul_with(pool, KernelPath::Scalar, precision, &x, m, &w, &mut got[0]);
            matmul_with(pool, KernelPath::Best, precision, &x, m, &w, &mut got[1]);
            for i in 0..m {
                for r in 0..n {
                    let (wr, xi) = (&wf[r * k..(r + 1) * k], &x[i * k..(i + 1) * k]);
                    let (want, tol) = reference(dtype, precision, wr, xi);
                    let (scalar, best) = (got[0][i * n + r] as f64, got[1][i * n + r] as f64);
                    let at = format!("{dtype:?} {precision:?} k={k} m={m} row {i} col {r}");
                    assert!((scalar - want).abs() <= tol, "{at}: scalar {scalar} vs {want} (tol {tol})");
                    assert!((best - want).abs() <= tol, "{at}: best {best} vs {want} (tol {tol})");
                    let magnitude: f64 = wr.iter().zip(xi).map(|(&w, &x)| (w as f64 * x as f64).abs()).sum();
                    let agree = 1e-5 * magnitude + 1e-6;
                    assert!((scalar - best).abs() <= agree, "{at}: scalar {scalar} vs best {best}");
                }
            }
        }
    }
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn every_format_matches_the_reference() {
    let pool = CpuPool::new(3).unwrap();
    for dtype in DType::ALL {
        check_format(dtype, Precision::Exact, &pool);
    }
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn fast_precision_stays_within_its_bound() {
    let pool = CpuPool::new(2).unwrap();
    for dtype in DType::ALL {
        check_format(dtype, Precision::Fast, &pool);
    }
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn single_thread_and_wide_rows() {
    // One thread, and rows long enough that activation blocks vary widely in scale.
    let pool = CpuPool::new(1).unwrap();
    let mut rng = TestRng::new(42);
    for dtype in [DType::Q4K, DType::Q6K, DType::Q8_0, DType::Q5_0, DType::Q4_1] {
        let (n, k, m) = (9, 15 * dtype.block_size().max(256), 3);
        let w = random_weight(dtype, n, k, rng.next()).unwrap();
        let wf = w.to_f32();
        let x: Vec<f32> = (0..m * k).map(|j| rng.activation() * (1 + j % 97) as f32).collect();
        let mut out = vec![0.0; m * n];
        matmul_with(&pool, KernelPath::Best, Precision::Exact, &x, m, &w, &mut out);
        for i in 0..m {
            for r in 0..n {
                let (want, tol) = reference(dtype, Precision::Exact, &wf[r * k..(r + 1) * k], &x[i * k..(i + 1) * k]);
                let got = out[i * n + r] as f64;
                assert!((got - want).abs() <= tol, "{dtype:?} row {i} col {r}: {got} vs {want} (tol {tol})");
            }
        }
    }
}
