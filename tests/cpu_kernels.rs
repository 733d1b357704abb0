//! The CPU matmul kernels of every weight format against the f32 reference (`quant::dequantize`,
//! dotted in f64), on random blocks, odd shapes and batch sizes 1 to 64, for the portable kernels
//! and every SIMD kernel set this machine runs (AVX2, AVX-VNNI, AVX-512 VNNI; simd128 in wasm),
//! which must agree with each other to the bit; and each row of a batch against the same row alone,
//! to the bit. A set the machine cannot run is named as not run in the output.
//!
//! Tolerance: the bound of `util/reference.rs` (the activation quantization's rounding plus f32
//! rounding). The portable and best kernels compute the same integer sums, so they must agree to
//! `1e-5 Σ_j |w_j x_j|`. Random weight bytes reach the extremes of every format (Q6_K scales of
//! -128, 6-bit values of 0 and 63) that bound the kernels' i32 partial sums.
//!
//! The same tests run in headless Chromium on wasm32 (`scripts/test-wasm.sh`), where the best
//! kernels are the simd128 ones.

#[path = "util/rand.rs"]
#[allow(dead_code)]
mod rand;
#[path = "util/reference.rs"]
mod reference;

use saguaro::backend::cpu::{matmul_with, CpuPool, KernelSet, Precision};
use saguaro::backend::random_weight;
use saguaro::storage::quant::{self, DType};
use saguaro::storage::quantize::{quantize, QUANTIZERS};
use saguaro::storage::{Bytes, Weight};
use rand::TestRng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// The reference dot product and the error it allows at `precision`.
fn reference(dtype: DType, precision: Precision, w: &[f32], x: &[f32]) -> (f64, f64) {
    reference::dot(dtype, Some(reference::levels(precision)), w, x)
}

fn check_format(dtype: DType, precision: Precision, pool: &CpuPool) {
    check_weights(dtype, precision, pool, |n, k, seed| random_weight(dtype, n, k, seed).unwrap());
}

/// The SIMD kernel sets this machine runs, which every test here runs.
fn simd_sets() -> Vec<KernelSet> {
    KernelSet::ALL.into_iter().filter(|&s| s != KernelSet::Scalar && s.supported()).collect()
}

/// Says which kernel sets these tests run here and which they cannot, by name; the best set (the
/// one `SAGUARO_KERNELS` names, if any) is one this machine runs.
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn names_the_kernel_sets_it_runs() {
    for set in KernelSet::ALL {
        let said = if set.supported() { "run" } else { "not run (this CPU lacks its instructions)" };
        println!("kernel set {}: {said}", set.name());
        assert_eq!(KernelSet::parse(set.name()), Some(set));
    }
    assert!(KernelSet::best().supported(), "best set {} does not run here", KernelSet::best().name());
    println!("best kernel set: {}", KernelSet::best().name());
}

/// `make(n, k, seed)` gives `n` rows of `k` values of `dtype`, which the kernels must dot as the
/// reference does.
fn check_weights(dtype: DType, precision: Precision, pool: &CpuPool, make: impl Fn(usize, usize, u64) -> Weight) {
    let mut rng = TestRng::new(dtype.block_bytes() as u64 * 7919 + 1);
    let sets = simd_sets();
    let n = 37;
    // Odd block counts; float rows also get lengths that leave a SIMD tail, and one longer than the
    // float kernels' tile of K (1,024 values), which a batch of more than six rows takes in turns.
    let ks: Vec<usize> = match dtype.block_size() {
        1 => vec![43, 117, 1100],
        bs => vec![3 * bs, 5 * bs],
    };
    for k in ks {
        let w = make(n, k, rng.next());
        let wf = w.to_f32();
        for m in [1, 2, 5, 9, 16, 64] {
            let mut x: Vec<f32> = (0..m * k).map(|_| rng.activation()).collect();
            // An all-zero activation block must not turn into NaNs.
            x[..dtype.block_size().max(32).min(k)].fill(0.0);
            let run = |set| {
                let mut out = vec![0.0; m * n];
                matmul_with(pool, set, precision, &x, m, &w, &mut out);
                out
            };
            let scalar = run(KernelSet::Scalar);
            let simd: Vec<(KernelSet, Vec<f32>)> = sets.iter().map(|&set| (set, run(set))).collect();
            for i in 0..m {
                for r in 0..n {
                    let (wr, xi) = (&wf[r * k..(r + 1) * k], &x[i * k..(i + 1) * k]);
                    let (want, tol) = reference(dtype, precision, wr, xi);
                    let at = format!("{dtype:?} {precision:?} k={k} m={m} row {i} col {r}");
                    let s = scalar[i * n + r] as f64;
                    assert!((s - want).abs() <= tol, "{at}: scalar {s} vs {want} (tol {tol})");
                    let agree = 1e-5 * reference::magnitude(wr, xi) + 1e-6;
                    for (set, got) in &simd {
                        let (name, g) = (set.name(), got[i * n + r]);
                        assert!((g as f64 - want).abs() <= tol, "{at}: {name} {g} vs {want} (tol {tol})");
                        assert!((s - g as f64).abs() <= agree, "{at}: scalar {s} vs {name} {g}");
                        let (first, f) = (simd[0].0.name(), simd[0].1[i * n + r]);
                        assert_eq!(g.to_bits(), f.to_bits(), "{at}: {name} {g} vs {first} {f}");
                    }
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

/// Weights quantized from f32 by the library's own quantizers, as a requantized draft's are.
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn quantized_weights_match_the_reference() {
    let pool = CpuPool::new(2).unwrap();
    for dtype in QUANTIZERS {
        for precision in [Precision::Exact, Precision::Fast] {
            check_weights(dtype, precision, &pool, |n, k, seed| {
                let mut rng = TestRng::new(seed);
                let values: Vec<f32> = (0..n * k).map(|_| 0.05 * rng.activation()).collect();
                let mut bytes = vec![0u8; dtype.bytes_for(n * k).unwrap()];
                quantize(dtype, &values, &mut bytes).unwrap();
                Weight::new(dtype, n, k, Bytes::from_vec(bytes)).unwrap()
            });
        }
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
        matmul_with(&pool, KernelSet::best(), Precision::Exact, &x, m, &w, &mut out);
        for i in 0..m {
            for r in 0..n {
                let (want, tol) = reference(dtype, Precision::Exact, &wf[r * k..(r + 1) * k], &x[i * k..(i + 1) * k]);
                let got = out[i * n + r] as f64;
                assert!((got - want).abs() <= tol, "{dtype:?} row {i} col {r}: {got} vs {want} (tol {tol})");
            }
        }
    }
}

/// A batch's results equal each of its rows' alone, to the bit: speculative decoding verifies a
/// batch of tokens and must score each exactly as a decode of that token would. Rows of 8,960
/// values, as long as a 1.5B model's FFN, and 19 weight rows, so that every batch size runs over K
/// in tiles and over a partial group of weight rows.
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn a_row_gets_the_same_bits_in_any_batch() {
    let pool = CpuPool::new(2).unwrap();
    let mut rng = TestRng::new(5);
    let sets = simd_sets();
    let (n, k) = (19, 8960);
    for dtype in DType::ALL {
        let w = random_weight(dtype, n, k, rng.next()).unwrap();
        let x: Vec<f32> = (0..16 * k).map(|_| rng.activation()).collect();
        for (set, precision) in sets.iter().flat_map(|&s| [(s, Precision::Exact), (s, Precision::Fast)]) {
            let alone: Vec<Vec<f32>> = x
                .chunks_exact(k)
                .map(|row| {
                    let mut out = vec![0.0; n];
                    matmul_with(&pool, set, precision, row, 1, &w, &mut out);
                    out
                })
                .collect();
            for m in [2, 3, 5, 8, 9, 16] {
                let mut out = vec![0.0; m * n];
                matmul_with(&pool, set, precision, &x[..m * k], m, &w, &mut out);
                for (i, (got, want)) in out.chunks_exact(n).zip(&alone).enumerate() {
                    let same = got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{dtype:?} {} {precision:?} m={m} row {i}: {got:?} vs {want:?} alone", set.name());
                }
            }
        }
    }
}

/// Every kernel set this machine runs, at both precisions.
fn every_set_and_precision() -> Vec<(KernelSet, Precision)> {
    let sets = [KernelSet::Scalar].into_iter().chain(simd_sets());
    sets.flat_map(|s| [(s, Precision::Exact), (s, Precision::Fast)]).collect()
}

/// A backend on a kernel set this machine cannot run is refused with an error, not built to fault
/// on its first instruction.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn a_set_the_cpu_cannot_run_is_refused() {
    let err = saguaro::backend::cpu::CpuBackend::new(1).unwrap().with_kernels(KernelSet::Simd128).err();
    let err = err.expect("simd128 is refused on a native CPU").to_string();
    assert!(err.contains("this CPU cannot run the simd128 kernels"), "{err}");
}

/// A weight of rows with no values dots to zero with any batch, on every path, rather than
/// dividing a row into zero-sized pieces.
#[test]
fn rows_of_no_values_dot_to_zero() {
    let pool = CpuPool::new(2).unwrap();
    for dtype in DType::ALL {
        let w = Weight::new(dtype, 3, 0, Bytes::from_vec(Vec::new())).unwrap();
        for (path, precision) in every_set_and_precision() {
            for m in [1, 5] {
                let mut out = vec![f32::NAN; m * 3];
                matmul_with(&pool, path, precision, &[], m, &w, &mut out);
                assert!(out.iter().all(|&v| v == 0.0), "{dtype:?} {path:?} {precision:?} m={m}: {out:?}");
            }
        }
    }
}

/// K-quant blocks whose every product is as large as the format allows (largest values and
/// scales, or Q6_K's most negative scale with its smallest value, stored 0, or its largest,
/// stored 63, which kernels that take Q6_K values unsigned multiply), dotted with activations at
/// full scale: the kernels' i32 partial sums are at their bound here, so an overflow would show.
#[test]
fn extreme_k_blocks_do_not_overflow() {
    let pool = CpuPool::new(2).unwrap();
    let one = half::f16::from_f32(1.0).to_le_bytes();
    let blocks = 6;
    for (dtype, fill, d_at) in [(DType::Q4K, 0xFFu8, 0), (DType::Q5K, 0xFF, 0), (DType::Q6K, 0x00, 208), (DType::Q6K, 0xFF, 208)] {
        let mut block = vec![fill; dtype.block_bytes()];
        if dtype == DType::Q6K {
            block[192..208].fill(0x80); // scales of -128
        } else {
            block[2..4].copy_from_slice(&half::f16::from_f32(0.0).to_le_bytes()); // no offset
        }
        block[d_at..d_at + 2].copy_from_slice(&one);
        let (n, k) = (3, blocks * quant::QK_K);
        let data: Vec<u8> = (0..n * blocks).flat_map(|_| block.iter().copied()).collect();
        let w = Weight::new(dtype, n, k, Bytes::from_vec(data)).unwrap();
        let wf = w.to_f32();
        for sign in [1.0f32, -1.0] {
            let x = vec![sign; 5 * k];
            for (path, precision) in every_set_and_precision() {
                let mut out = vec![0.0; 5 * n];
                matmul_with(&pool, path, precision, &x, 5, &w, &mut out);
                let (want, tol) = reference(dtype, precision, &wf[..k], &x[..k]);
                for &got in &out {
                    assert!((got as f64 - want).abs() <= tol, "{dtype:?} {path:?} {precision:?}: {got} vs {want}");
                }
            }
        }
    }
}
