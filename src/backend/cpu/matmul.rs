//! `x [m, k] @ W[n, k]^T` with W read in its storage type, block by block, never as f32 rows.
//!
//! Quantized weights are dotted with activations quantized once per call to 16- or 8-bit blocks
//! (Q8_0-like for the 32-value formats, Q8_K-like for the K-quants) in integer arithmetic; float
//! weights with f32 activations. Threads split the weight rows; a kernel applies each weight row,
//! decoded once, to up to [`MAX_ROWS`] activation rows, so a small batch (a decode, a verification
//! of K+1 tokens, a tree step) reads and decodes the weights once.

use std::sync::OnceLock;

use super::kernels::{self, Kernels, RowsFn, MAX_ROWS};
use super::pool::{Pool, SharedMut};
use super::quantize::{quantize_32, quantize_k};
use crate::storage::quant::{DType, QK, QK_K};
use crate::storage::Weight;

/// How precisely activations are quantized for the integer kernels of quantized weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// 16-bit activations: logits within float noise of an f32 computation, as the golden parity
    /// tests demand of a target.
    #[default]
    Exact,
    /// 8-bit activations, as the fastest CPU engines use: half the activation bytes and no
    /// widening of the weights, logits off by up to about 0.5. Right for a draft model, whose
    /// proposals the target verifies exactly.
    Fast,
}

/// A set of CPU kernels: one per weight format and activation type, for one instruction set. Every
/// set computes the same integer sums, in the same order of float additions for the SIMD sets, so
/// the SIMD sets give the same bits as each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSet {
    /// The portable kernels, on any machine: what the others are tested against.
    Scalar,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// AVX2 with AVX-VNNI: one instruction for each 16-bit or byte multiply-add.
    AvxVnni,
    /// AVX-512 F, BW, VL and VNNI: AVX-VNNI's multiply-adds with 32 vector registers.
    Avx512Vnni,
    /// wasm32 simd128.
    Simd128,
    /// wasm32 simd128 with relaxed SIMD's byte dot product, for 8-bit activations on K-quants.
    RelaxedSimd,
}

impl KernelSet {
    /// Every set, the portable one first and the fastest of each architecture last.
    pub const ALL: [KernelSet; 6] = [
        KernelSet::Scalar,
        KernelSet::Simd128,
        KernelSet::RelaxedSimd,
        KernelSet::Avx2,
        KernelSet::AvxVnni,
        KernelSet::Avx512Vnni,
    ];

    /// The name `SAGUARO_KERNELS`, `bench-kernels --kernels` and `saguaro devices` use.
    pub fn name(self) -> &'static str {
        match self {
            KernelSet::Scalar => "scalar",
            KernelSet::Avx2 => "avx2",
            KernelSet::AvxVnni => "avx-vnni",
            KernelSet::Avx512Vnni => "avx512-vnni",
            KernelSet::Simd128 => "simd128",
            KernelSet::RelaxedSimd => "relaxed-simd",
        }
    }

    /// The set of a [`KernelSet::name`].
    pub fn parse(name: &str) -> Option<KernelSet> {
        KernelSet::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether this machine runs the set.
    pub fn supported(self) -> bool {
        match self {
            KernelSet::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            KernelSet::Avx2 => kernels::x86::avx2_detected(),
            #[cfg(target_arch = "x86_64")]
            KernelSet::AvxVnni => kernels::x86::avx_vnni_detected(),
            #[cfg(target_arch = "x86_64")]
            KernelSet::Avx512Vnni => kernels::x86::avx512_vnni_detected(),
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            KernelSet::Simd128 => true,
            #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
            KernelSet::RelaxedSimd => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The fastest set this machine runs, or the one `SAGUARO_KERNELS` names (read once), so that
    /// a whole run can be made on each set the machine has. A named set the machine cannot run, or
    /// an unknown name, is said on stderr and the fastest taken instead.
    pub fn best() -> KernelSet {
        static BEST: OnceLock<KernelSet> = OnceLock::new();
        *BEST.get_or_init(|| {
            let fastest = KernelSet::ALL.into_iter().rev().find(|s| s.supported()).unwrap_or(KernelSet::Scalar);
            let Ok(name) = std::env::var("SAGUARO_KERNELS") else {
                return fastest;
            };
            match KernelSet::parse(&name) {
                Some(set) if set.supported() => set,
                Some(_) => {
                    eprintln!("SAGUARO_KERNELS={name}: this CPU cannot run that kernel set; using {}", fastest.name());
                    fastest
                }
                None => {
                    let names: Vec<_> = KernelSet::ALL.iter().map(|s| s.name()).collect();
                    eprintln!("SAGUARO_KERNELS={name}: no such kernel set (one of {}); using {}", names.join(", "), fastest.name());
                    fastest
                }
            }
        })
    }

    fn kernels(self) -> &'static Kernels {
        assert!(self.supported(), "kernel set {} does not run on this machine", self.name());
        match self {
            #[cfg(target_arch = "x86_64")]
            KernelSet::Avx2 => &kernels::x86::avx2::KERNELS,
            #[cfg(target_arch = "x86_64")]
            KernelSet::AvxVnni => &kernels::x86::avx_vnni::KERNELS,
            #[cfg(target_arch = "x86_64")]
            KernelSet::Avx512Vnni => &kernels::x86::avx512_vnni::KERNELS,
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            KernelSet::Simd128 => &kernels::wasm::KERNELS,
            #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
            KernelSet::RelaxedSimd => &kernels::wasm_relaxed::KERNELS,
            _ => &kernels::scalar::KERNELS,
        }
    }

    /// The kernel of a family for a format, falling back to the portable one, and the set it is from.
    fn pick<A>(self, family: impl Fn(&Kernels) -> Option<RowsFn<A>>) -> (RowsFn<A>, &'static Kernels) {
        [self.kernels(), &kernels::scalar::KERNELS]
            .into_iter()
            .find_map(|set| family(set).map(|k| (k, set)))
            .expect("every format of a family has a portable kernel")
    }

    /// Whether the set runs AVX2, which activation quantization and the f32 helpers then use.
    fn avx2(self) -> bool {
        matches!(self, KernelSet::Avx2 | KernelSet::AvxVnni | KernelSet::Avx512Vnni)
    }
}

/// `out[m * n]` = `x[m * k]` times the transpose of `w`: `out[i * n + r] = dot(w row r, x row i)`.
pub fn matmul(pool: &Pool, x: &[f32], m: usize, w: &Weight, out: &mut [f32]) {
    matmul_with(pool, KernelSet::best(), Precision::Exact, x, m, w, out)
}

/// [`matmul`] on the kernel set `isa`, at `precision`. Panics where this machine cannot run `isa`
/// (see [`KernelSet::supported`]).
pub fn matmul_with(pool: &Pool, isa: KernelSet, precision: Precision, x: &[f32], m: usize, w: &Weight, out: &mut [f32]) {
    let (n, k) = (w.rows, w.cols);
    assert_eq!(x.len(), m * k, "matmul: x is not [m, k]");
    assert_eq!(out.len(), m * n, "matmul: out is not [m, n]");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        return out.fill(0.0);
    }
    let (dtype, simd) = (w.dtype, isa.avx2());
    let exact = precision == Precision::Exact;
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => run(pool, w, x, m, isa.pick(|k| (k.float)(dtype)).0, out),
        DType::Q4K | DType::Q5K | DType::Q6K if exact => {
            let (kernel, set) = isa.pick(|k| (k.qk_16)(dtype));
            let order = set.qk_16_order;
            integer(pool, w, x, m, QK_K, |x, q| quantize_k::<i16>(x, q, simd, order), kernel, out)
        }
        DType::Q4K | DType::Q5K | DType::Q6K => {
            let (kernel, set) = isa.pick(|k| (k.qk)(dtype));
            let order = set.qk_order;
            integer(pool, w, x, m, QK_K, |x, q| quantize_k::<i8>(x, q, simd, order), kernel, out)
        }
        _ if exact => {
            let kernel = isa.pick(|k| (k.q32_16)(dtype)).0;
            integer(pool, w, x, m, QK, |x, q| quantize_32::<i16>(x, q, simd), kernel, out)
        }
        _ => integer(pool, w, x, m, QK, |x, q| quantize_32::<i8>(x, q, simd), isa.pick(|k| (k.q32)(dtype)).0, out),
    }
}

/// A quantized weight's matmul: the activations quantized by `quant` into blocks of `block`
/// values, then dotted by `kernel`.
#[allow(clippy::too_many_arguments)]
fn integer<B: Default + Copy + Send + Sync>(
    pool: &Pool,
    w: &Weight,
    x: &[f32],
    m: usize,
    block: usize,
    quant: impl Fn(&[f32], &mut [B]) + Sync,
    kernel: RowsFn<B>,
    out: &mut [f32],
) {
    let q = quantize(pool, x, m, w.cols / block, quant);
    run(pool, w, &q, m, kernel, out)
}

/// The `m` rows of `x` quantized into `per_row` blocks each, rows spread over the pool.
fn quantize<B: Default + Copy + Send>(
    pool: &Pool,
    x: &[f32],
    m: usize,
    per_row: usize,
    f: impl Fn(&[f32], &mut [B]) + Sync,
) -> Vec<B> {
    let mut q = vec![B::default(); m * per_row];
    let k = x.len() / m;
    let q_ptr = SharedMut(q.as_mut_ptr());
    pool.for_each(m, |i| {
        let q_ptr = q_ptr;
        // SAFETY: row i alone writes blocks i * per_row.., and q holds m * per_row blocks.
        let qi = unsafe { std::slice::from_raw_parts_mut(q_ptr.0.add(i * per_row), per_row) };
        f(&x[i * k..(i + 1) * k], qi);
    });
    q
}

/// Weight rows per pool chunk: enough chunks for the threads to balance, and when there are more
/// activation rows than one kernel call takes, few enough weights per chunk (`row_bytes` each) to
/// stay in L2 while each group of rows reuses them.
fn chunk_rows(pool: &Pool, n: usize, row_bytes: usize) -> usize {
    const L2_SHARE: usize = 256 << 10;
    let balance = n.div_ceil(pool.threads() * 8);
    balance.min(L2_SHARE / row_bytes.max(1)).max(1)
}

/// `out = x w^T` for the `m` rows of `x`.
fn run<A: Sync>(pool: &Pool, w: &Weight, x: &[A], m: usize, kernel: RowsFn<A>, out: &mut [f32]) {
    let n = w.rows;
    let per_row = x.len() / m;
    let rows = chunk_rows(pool, n, w.row_bytes());
    let out_ptr = SharedMut(out.as_mut_ptr());
    pool.for_each(n.div_ceil(rows), |c| {
        let out_ptr = out_ptr;
        let own = c * rows..((c + 1) * rows).min(n);
        let wc = w.rows_range(own.clone());
        let mut o = vec![0.0f32; own.len() * MAX_ROWS];
        // Groups of equal size rather than full ones and a remainder: 10 rows as 5 + 5, not 9 + 1.
        let per_group = m.div_ceil(m.div_ceil(MAX_ROWS));
        for i0 in (0..m).step_by(per_group) {
            let g = per_group.min(m - i0);
            let o = &mut o[..own.len() * g];
            // SAFETY: `pick` chose kernels this CPU runs; the group holds g activation rows.
            unsafe { kernel(wc, &x[i0 * per_row..(i0 + g) * per_row], g, o) };
            for (r, o) in own.clone().zip(o.chunks_exact(g)) {
                for (i, &o) in o.iter().enumerate() {
                    // SAFETY: (i0 + i, r) is written by this chunk alone, and out has m * n elements.
                    unsafe { *out_ptr.0.add((i0 + i) * n + r) = o };
                }
            }
        }
    });
}

/// Whether the best kernel set runs AVX2.
#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    KernelSet::best().avx2()
}

/// `y += a * x` for two f32 slices of equal length.
pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2, FMA and F16C were detected.
        done = unsafe { kernels::x86::float::axpy(y, a, x) };
    }
    y[done..].iter_mut().zip(&x[done..]).for_each(|(y, x)| *y += a * x);
}

/// `out = act(g) * u`, elementwise over slices of equal length, with `act` given by its
/// [`crate::backend::Activation::sigmoid_coefficients`] `(a, b)`: `act(g) = g / (1 + e^-(g (a + b g^2)))`.
pub(crate) fn gated_mul(g: &[f32], u: &[f32], out: &mut [f32], (a, b): (f32, f32)) {
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2, FMA and F16C were detected.
        done = unsafe { kernels::x86::float::gated_mul(g, u, out, (a, b)) };
    }
    let rest = out[done..].iter_mut().zip(g[done..].iter().zip(&u[done..]));
    rest.for_each(|(o, (g, u))| *o = g / (1.0 + (-(g * (a + b * g * g))).exp()) * u);
}

/// `dot(a, b)` of two f32 slices of equal length.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2, FMA and F16C were detected.
        return unsafe { kernels::x86::float::dot(a, b) };
    }
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}
