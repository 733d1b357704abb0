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
use super::quantize::{quantize_32, quantize_k, Act32, ActInt, ActK, Order};
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
    matmuls_with(pool, isa, precision, x, m, &[w], &mut [out])
}

/// [`matmul_with`] of one input by several weights of its width (a layer's Q, K and V, or its gate
/// and up projections): `outs[j] = x ws[j]^T`. The input is quantized once for each form the
/// weights need, and the rows of all the weights are spread over the pool in one parallel call, so
/// a decode pays one fork-join for the group rather than one per weight.
pub fn matmuls_with(
    pool: &Pool,
    isa: KernelSet,
    precision: Precision,
    x: &[f32],
    m: usize,
    ws: &[&Weight],
    outs: &mut [&mut [f32]],
) {
    assert_eq!(ws.len(), outs.len(), "matmuls: one output per weight");
    for (w, out) in ws.iter().zip(outs.iter()) {
        assert_eq!(x.len(), m * w.cols, "matmul: x is not [m, k]");
        assert_eq!(out.len(), m * w.rows, "matmul: out is not [m, n]");
    }
    if m == 0 {
        return;
    }
    if x.is_empty() {
        return outs.iter_mut().for_each(|o| o.fill(0.0));
    }
    match precision {
        Precision::Exact => {
            matmuls_at::<i16>(pool, isa, x, m, ws, outs, |k, d| (k.qk_16)(d), |k| k.qk_16_order, |k, d| (k.q32_16)(d))
        }
        Precision::Fast => matmuls_at::<i8>(pool, isa, x, m, ws, outs, |k, d| (k.qk)(d), |k| k.qk_order, |k, d| (k.q32)(d)),
    }
}

/// The kernel a weight takes, with the activations it reads.
enum Pick<I> {
    Float(RowsFn<f32>),
    /// A K-quant kernel and the order its activation blocks are laid out in.
    K(RowsFn<ActK<I>>, Order),
    B32(RowsFn<Act32<I>>),
}

/// [`matmuls_with`] with activations quantized to `I`, the kernels of each family chosen by `qk`,
/// `qk_order` and `q32`.
#[allow(clippy::too_many_arguments)]
fn matmuls_at<I: ActInt>(
    pool: &Pool,
    isa: KernelSet,
    x: &[f32],
    m: usize,
    ws: &[&Weight],
    outs: &mut [&mut [f32]],
    qk: impl Fn(&Kernels, DType) -> Option<RowsFn<ActK<I>>>,
    qk_order: impl Fn(&Kernels) -> Order,
    q32: impl Fn(&Kernels, DType) -> Option<RowsFn<Act32<I>>>,
) {
    let simd = isa.avx2();
    let k = x.len() / m;
    let picks: Vec<Pick<I>> = ws
        .iter()
        .map(|w| match w.dtype {
            DType::F32 | DType::F16 | DType::BF16 => Pick::Float(isa.pick(|s| (s.float)(w.dtype)).0),
            DType::Q4K | DType::Q5K | DType::Q6K => {
                let (kernel, set) = isa.pick(|s| qk(s, w.dtype));
                Pick::K(kernel, qk_order(set))
            }
            _ => Pick::B32(isa.pick(|s| q32(s, w.dtype)).0),
        })
        .collect();
    let mut k_acts: Vec<(Order, Vec<ActK<I>>)> = Vec::new();
    let mut b32_acts: Option<Vec<Act32<I>>> = None;
    for pick in &picks {
        match *pick {
            Pick::K(_, order) if !k_acts.iter().any(|(o, _)| *o == order) => {
                k_acts.push((order, quantize(pool, x, m, k / QK_K, |x, q| quantize_k::<I>(x, q, simd, order))))
            }
            Pick::B32(_) if b32_acts.is_none() => {
                b32_acts = Some(quantize(pool, x, m, k / QK, |x, q| quantize_32::<I>(x, q, simd)))
            }
            _ => {}
        }
    }
    let parts: Vec<Part> = picks
        .iter()
        .zip(ws)
        .zip(outs.iter_mut())
        .map(|((pick, w), out)| match *pick {
            Pick::Float(kernel) => part(pool, w, x, m, kernel, out),
            Pick::K(kernel, order) => {
                let acts = &k_acts.iter().find(|(o, _)| *o == order).expect("quantized above").1;
                part(pool, w, acts, m, kernel, out)
            }
            Pick::B32(kernel) => part(pool, w, b32_acts.as_deref().expect("quantized above"), m, kernel, out),
        })
        .collect();
    run_parts(pool, &parts);
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

thread_local! {
    /// A chunk's outputs as the kernels leave them, each weight row's batch side by side, before
    /// they go to their rows of `out`: kept per thread, since a forward runs thousands of chunks.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One weight's matmul as chunks of its rows, for [`run_parts`].
struct Part<'a> {
    chunks: usize,
    run: Box<dyn Fn(usize) + Sync + 'a>,
}

/// `out = x w^T` for the `m` rows of `x`, as a [`Part`].
fn part<'a, A: Sync>(pool: &Pool, w: &'a Weight, x: &'a [A], m: usize, kernel: RowsFn<A>, out: &'a mut [f32]) -> Part<'a> {
    let n = w.rows;
    let per_row = x.len() / m;
    let rows = chunk_rows(pool, n, w.row_bytes());
    let out_ptr = SharedMut(out.as_mut_ptr());
    let run = move |c: usize| {
        let out_ptr = out_ptr;
        let own = c * rows..((c + 1) * rows).min(n);
        let wc = w.rows_range(own.clone());
        if m == 1 {
            // One activation row: the chunk's outputs are contiguous in `out`, written in place
            // (a decode runs thousands of chunks a token).
            // SAFETY: rows `own` of the single output row are this chunk's alone, within out's n.
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(own.start), own.len()) };
            // SAFETY: `pick` chose kernels this CPU runs; the call holds one activation row.
            unsafe { kernel(wc, x, 1, o) };
            return;
        }
        SCRATCH.with_borrow_mut(|o| {
            if o.len() < own.len() * MAX_ROWS {
                o.resize(own.len() * MAX_ROWS, 0.0);
            }
            // Groups of equal size rather than full ones and a remainder: 10 rows as 5 + 5, not 9 + 1.
            let per_group = m.div_ceil(m.div_ceil(MAX_ROWS));
            for i0 in (0..m).step_by(per_group) {
                let g = per_group.min(m - i0);
                let o = &mut o[..own.len() * g];
                // SAFETY: `pick` chose kernels this CPU runs; the group holds g activation rows.
                unsafe { kernel(wc, &x[i0 * per_row..(i0 + g) * per_row], g, o) };
                // Row by output row, so that the stores run along `out` (one row's outputs apart,
                // they took 3-4% of a 5-token verification).
                for i in 0..g {
                    // SAFETY: columns `own` of output row i0 + i are this chunk's alone, and out
                    // (borrowed for 'a) has m * n elements.
                    let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add((i0 + i) * n + own.start), own.len()) };
                    for (d, s) in dst.iter_mut().zip(o[i..].iter().step_by(g)) {
                        *d = *s;
                    }
                }
            }
        });
    };
    Part { chunks: n.div_ceil(rows), run: Box::new(run) }
}

/// Every chunk of every part, in one parallel call.
fn run_parts(pool: &Pool, parts: &[Part]) {
    let starts: Vec<usize> = parts
        .iter()
        .scan(0, |at, p| {
            let start = *at;
            *at += p.chunks;
            Some(start)
        })
        .collect();
    let total = parts.iter().map(|p| p.chunks).sum();
    pool.for_each(total, |c| {
        let j = starts.partition_point(|&s| s <= c) - 1;
        (parts[j].run)(c - starts[j])
    });
}

/// Whether the best kernel set runs AVX2.
#[cfg(target_arch = "x86_64")]
pub(super) fn avx2() -> bool {
    KernelSet::best().avx2()
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

