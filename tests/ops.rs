//! Every op of the `Backend` trait against a plain f64 reference computed here from the same
//! inputs (weights decoded by `quant::dequantize`), on seeded random inputs. The checks are written
//! once, generic over `Backend`, and `suite!` runs each for three backends: `cpu_exact::*` and
//! `cpu_fast::*` (the CPU backend at `Precision::Exact` and `Precision::Fast`) and `gpu::*` (wgpu on
//! whatever adapter there is; lavapipe in CI). The GPU tests skip, saying so, only where no adapter
//! exists at all or it lacks the feature they are about, and fail instead with
//! `SAGUARO_REQUIRE_GPU=1` (tests/util/gpu.rs).
//!
//! Shapes are small but real: head_dim 64 with grouped-query heads, prefill past the GPU's 64-slot
//! attention chunks, decode, a K+1 verification, a rollback rewrite and a tree step whose rows
//! attend extra slots; matmuls of every weight type at M = 1, 2, 5, 33, 64 and 70 (each kernel of
//! both backends, partial tiles included), with a bias, and with K = 1536.
//!
//! Tolerances, and why:
//! - f32 arithmetic (every op but those below): `FLOAT = 1e-5` times the magnitude of the terms
//!   combined. Rounding errors of a sum of n terms grow like √n·u in practice (u = 6e-8; n·u in the
//!   worst case): at most 2.4e-6 for the 1,536 terms here.
//! - Quantized-weight matmuls on the CPU: in addition, the rounding of its activations to integers
//!   (16 bits at `Exact`, 8 bits at `Fast`), bounded in `util/reference.rs`. The GPU dots f32
//!   activations.
//! - add and select_rows: exact (a sum of two f32 values rounded once is the f64 sum rounded).
//! - embed: decoding a row is exact on the CPU (it runs `quant::dequantize` itself); the GPU may
//!   order or fuse the multiply and add of `d * q - m` differently, one rounding of values below
//!   1 + |w| for these scales: 2^-22 (1 + |w|).
//!
//! Measured on the CPU and lavapipe: f32 ops within 4e-7 of their terms' magnitude (under 4% of
//! the tolerance); CPU matmuls of float weights within 1.3e-7, of quantized ones at `Exact` within
//! 1.3e-4 of Σ|w x| (the 16-bit activations', not f32's, rounding: under 40% of their bound).

use std::sync::OnceLock;

use futures::executor::block_on;
use saguaro::backend::cpu::{CpuBackend, Precision};
use saguaro::backend::gpu::{GpuBackend, GpuOptions};
use saguaro::backend::draw::race_bits;
use saguaro::backend::{random_weight, Activation, Allowed, AttnShape, Backend, Batch, Draw, KvCache, Mask, Rope, SparseDist, NO_SLOT};
use saguaro::sampling;
use saguaro::storage::quant::DType;
use saguaro::storage::Weight;
use saguaro::Error;
use util::gpu::Missing;
use util::rand::TestRng;
use util::reference;

mod util;

/// Relative error of f32 arithmetic (see the module doc).
const FLOAT: f64 = 1e-5;

/// What one backend may differ from the reference by, beyond [`FLOAT`].
struct Tol {
    /// Integer levels the activations of quantized-weight matmuls are rounded to, if any.
    levels: Option<f64>,
    /// Relative error of decoding a weight value.
    decode: f64,
    /// Whether the KV cache holds K and V rounded to f16, as the reference then takes them.
    kv_f16: bool,
    /// Whether the decode matmul computes in f16 (`reference::f16_error`).
    f16: bool,
}

const CPU_EXACT: Tol = Tol { levels: Some(32767.0), decode: 0.0, kv_f16: false, f16: false };
const CPU_FAST: Tol = Tol { levels: Some(127.0), decode: 0.0, kv_f16: false, f16: false };
const GPU: Tol = Tol { levels: None, decode: 1.0 / (1 << 22) as f64, kv_f16: true, f16: false };
/// The GPU with f16 arithmetic in the decode matmul (`gpu_f16::*`).
const GPU_F16: Tol = Tol { f16: true, ..GPU };
/// The GPU with an f32 KV cache (`gpu_kv_f32::*`).
const GPU_KV_F32: Tol = Tol { kv_f16: false, ..GPU };

fn cpu(precision: Precision) -> &'static CpuBackend {
    static EXACT: OnceLock<CpuBackend> = OnceLock::new();
    static FAST: OnceLock<CpuBackend> = OnceLock::new();
    let cell = match precision {
        Precision::Exact => &EXACT,
        Precision::Fast => &FAST,
    };
    cell.get_or_init(|| CpuBackend::new(2).unwrap().with_precision(precision))
}

/// The GPU with its reductions through workgroup memory alone (plain WebGPU), where the adapter
/// has subgroups and `gpu::*` runs with them; elsewhere `gpu::*` is this path, and `gpu_plain::*`
/// skips, saying so (a failure under `SAGUARO_REQUIRE_GPU=1`).
fn gpu_plain() -> Option<&'static GpuBackend> {
    static PLAIN: OnceLock<Result<GpuBackend, Missing>> = OnceLock::new();
    util::gpu::cached(&PLAIN, util::gpu::open_plain)
}

/// The decode matmul's workgroup widths beside the default's: 64 threads, whose subgroups' sums
/// meet in workgroup memory where the adapter has subgroups (lavapipe's default is one 8-lane
/// subgroup); 64 through workgroup memory alone, a GPU's path in the browser; 3, fewer threads
/// than a workgroup's sums and than a subgroup; and 5 through workgroup memory alone. Each with
/// the thread count it asked for.
fn gpu_widths() -> Option<&'static [(u32, GpuBackend)]> {
    static WIDTHS: OnceLock<Result<Vec<(u32, GpuBackend)>, Missing>> = OnceLock::new();
    let open = |(n, no_subgroups)| Ok((n, util::gpu::open(GpuOptions { matvec_threads: Some(n), no_subgroups, ..Default::default() })?));
    util::gpu::cached(&WIDTHS, || GPU_WIDTHS.into_iter().map(open).collect()).map(Vec::as_slice)
}

/// The widths [`gpu_widths`] opens: (threads, without subgroups).
const GPU_WIDTHS: [(u32, bool); 4] = [(64, false), (64, true), (3, false), (5, true)];

mod gpu_widths {
    macro_rules! matmul_suite {
        ($($op:ident),*) => {
            $(#[test] fn $op() {
                let Some(widths) = super::gpu_widths() else { return };
                assert_eq!(widths.len(), super::GPU_WIDTHS.len(), "every width opened");
                for (n, g) in widths {
                    super::$op(g, &super::GPU);
                    let built = saguaro::backend::gpu::GpuBackend::kernels_built(g);
                    let wg = format!("WG={n},");
                    assert!(built.iter().any(|k| k.starts_with("matmul.matmul_rows") && k.contains(&wg)), "{wg} did not run: {built:?}");
                }
            })*
        };
    }
    matmul_suite!(matmul, matmul_bias_and_long_rows, matmuls_equal_separate_matmuls, fused_projections_equal_separate_ops);
}

/// The decode matmul with f16 arithmetic, where the adapter offers `shader-f16`: within the
/// error f16 rounding allows, and weights loaded together and fused epilogues with the bits of
/// separate weights and separate ops, as in f32 (that a verification's rows keep its decodes'
/// bits, tests/gpu_models.rs checks through greedy speculation).
fn gpu_f16() -> Option<&'static GpuBackend> {
    static F16: OnceLock<Result<GpuBackend, Missing>> = OnceLock::new();
    util::gpu::cached(&F16, util::gpu::open_f16)
}

mod gpu_f16 {
    macro_rules! matmul_suite {
        ($($op:ident),*) => {
            $(#[test] fn $op() {
                let Some(g) = super::gpu_f16() else { return };
                super::$op(g, &super::GPU_F16);
                let built = saguaro::backend::gpu::GpuBackend::kernels_built(g);
                assert!(built.iter().any(|k| k.starts_with("matmul.matmul_rows") && k.ends_with("F=f16")), "no f16 matmul ran: {built:?}");
            })*
        };
    }
    matmul_suite!(matmul, matmul_bias_and_long_rows, matmuls_equal_separate_matmuls, fused_projections_equal_separate_ops);
}

/// Each reduction path the adapter offers ran: the shared GPU takes subgroups wherever the adapter
/// has them at one fixed size (where the size varies, a pipeline's could differ from another's,
/// and with it the bits of their sums), and a matmul on it and on the plain GPU builds the kernel
/// of each path. The decode matmul's workgroup is one subgroup where the adapter computes on the
/// CPU and reports a fixed subgroup size (lavapipe), with or without subgroup reductions; 4
/// threads on a CPU adapter that reports none; 64 threads on a GPU.
#[test]
fn gpu_reduction_paths_ran() {
    let Some(g) = util::shared_gpu() else { return };
    let offered = block_on(saguaro::backend::gpu::list_adapters())
        .iter()
        .any(|a| a.info.name == g.adapter_info().name && a.features.contains(wgpu::Features::SUBGROUP));
    let info = g.adapter_info();
    let lanes = (info.subgroup_min_size == info.subgroup_max_size).then_some(info.subgroup_min_size);
    assert_eq!(
        g.subgroups(),
        offered && lanes.is_some_and(|n| n > 0),
        "the GPU uses subgroups exactly where its adapter offers them at one size"
    );
    let width = match lanes {
        _ if info.device_type != wgpu::DeviceType::Cpu => 64,
        Some(n @ 1..=64) => n,
        Some(65..) => 64,
        _ => 4,
    };
    let w = random_weight(DType::Q8_0, 8, 64, 5).unwrap();
    let x = TestRng::new(5).vec(2 * 64);
    let sums = if offered { "SUMS=@sums_subgroup" } else { "SUMS=@sums_workgroup" };
    let mut paths = vec![(g, format!("WG={width},{sums}"))];
    if let Some(plain) = gpu_plain() {
        assert!(!plain.subgroups());
        paths.push((plain, format!("WG={width},SUMS=@sums_workgroup")));
    }
    for (b, path) in paths {
        let gw = b.load_weight(&w).unwrap();
        let out = b.matmul(&up(b, 2, 64, &x), &gw, None).unwrap();
        read(b, &out);
        let built = b.kernels_built();
        assert!(built.iter().any(|k| k.starts_with("matmul.matmul_rows") && k.contains(&path)), "{path} did not run: {built:?}");
        println!("{}: {path} ran", b.name());
    }
}

/// The matmul reads activations as vec4s where K is a multiple of 4 and as scalars elsewhere (an
/// odd K of a float weight); the suites check both paths' results, this that both ran.
#[test]
fn gpu_activation_load_paths_ran() {
    let Some(g) = util::shared_gpu() else { return };
    for (dtype, k, path) in [(DType::F32, 45, "X=@x_scalar"), (DType::Q5_0, 64, "X=@x_vec4")] {
        let w = g.load_weight(&random_weight(dtype, 8, k, 6).unwrap()).unwrap();
        for m in [1, 70] {
            read(g, &g.matmul(&up(g, m, k, &TestRng::new(6).vec(m * k)), &w, None).unwrap());
        }
        let (built, name) = (g.kernels_built(), format!("DTYPE={}", dtype.name()));
        for entry in ["matmul_rows", "matmul_tiled"] {
            assert!(
                built.iter().any(|n| n.starts_with(&format!("matmul.{entry}")) && n.contains(&name) && n.contains(path)),
                "{entry} with {path} did not run: {built:?}"
            );
        }
        println!("{}: {path} ran", g.name());
    }
}

/// The GPU's fused ops are one pass each (the gated unit's gate projection is another), where
/// the separate ops take two.
#[test]
fn gpu_fused_ops_are_one_pass() {
    // A backend of its own: other tests dispatch on the shared one meanwhile.
    let Some(g) = &util::open_gpu(GpuOptions::default()) else { return };
    let k = 64;
    let [w1, w2] = [1, 2].map(|s| g.load_weight(&random_weight(DType::Q8_0, 16, k, s).unwrap()).unwrap());
    let x = up(g, 2, k, &TestRng::new(8).vec(2 * k));
    let mut into = up(g, 2, 16, &[0.0; 32]);
    let before = g.dispatches_recorded();
    g.matmul_add(&x, &w1, &mut into).unwrap();
    assert_eq!(g.dispatches_recorded() - before, 1, "matmul_add");
    let before = g.dispatches_recorded();
    read(g, &g.gated_matmul(&x, &w1, &w2, Activation::Silu).unwrap());
    assert_eq!(g.dispatches_recorded() - before, 2, "gated_matmul");
    // Loaded together: one pass, but two for a prefill's tiled kernel.
    let [w1, w2] = <[_; 2]>::try_from(g.load_together(&[3, 4].map(|s| random_weight(DType::Q8_0, 16, k, s).unwrap()).each_ref()).unwrap()).ok().unwrap();
    for (m, passes) in [(2, 1), (64, 1), (65, 2)] {
        let x = up(g, m, k, &TestRng::new(9).vec(m * k));
        let before = g.dispatches_recorded();
        read(g, &g.gated_matmul(&x, &w1, &w2, Activation::Silu).unwrap());
        assert_eq!(g.dispatches_recorded() - before, passes, "gated_matmul loaded together at m={m}");
    }
    assert!(g.kernels_built().iter().any(|k| k.contains("PAIRED=true")), "{:?}", g.kernels_built());
    let (mut q, mut k) = (up(g, 2, 128, &[1.0; 256]), up(g, 2, 64, &[1.0; 128]));
    let before = g.dispatches_recorded();
    g.rope_pair(&mut q, &mut k, &[3, 4], &Rope::plain(64, 1e4)).unwrap();
    assert_eq!(g.dispatches_recorded() - before, 1, "rope_pair");
}

macro_rules! suite {
    ($($op:ident),* $(,)?) => {
        mod cpu_exact {
            $(#[test] fn $op() { super::$op(super::cpu(super::Precision::Exact), &super::CPU_EXACT) })*
        }
        mod cpu_fast {
            $(#[test] fn $op() { super::$op(super::cpu(super::Precision::Fast), &super::CPU_FAST) })*
        }
        mod gpu {
            $(#[test] fn $op() {
                if let Some(g) = super::util::shared_gpu() {
                    super::$op(g, &super::GPU)
                }
            })*
        }
        mod gpu_plain {
            $(#[test] fn $op() {
                if let Some(g) = super::gpu_plain() {
                    super::$op(g, &super::GPU)
                }
            })*
        }
    };
}

suite!(
    rms_norm,
    rope,
    rope_scaled_and_partial,
    rope_pair,
    glu,
    add_and_select_rows,
    mask,
    embed,
    matmul,
    matmul_bias_and_long_rows,
    matmuls_equal_separate_matmuls,
    fused_projections_equal_separate_ops,
    attention_causal,
    attention_tree,
    attention_windowed_and_scaled,
    top_k,
    draw,
    bad_shapes_are_errors,
);

fn up<B: Backend>(b: &B, rows: usize, cols: usize, data: &[f32]) -> B::Tensor {
    b.upload(rows, cols, data).unwrap()
}

fn read<B: Backend>(b: &B, t: &B::Tensor) -> Vec<f32> {
    block_on(b.read(t)).unwrap()
}

/// `|got[i] - want[i]| <= tol(i)` for every i (a NaN fails), printing how close the worst came.
fn check(got: &[f32], want: &[f64], tol: impl Fn(usize) -> f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (err, t) = ((g as f64 - w).abs(), tol(i));
        assert!(err <= t, "{what}: element {i}: got {g}, reference {w} (tolerance {t:e})");
        if t > 0.0 {
            worst = worst.max(err / t);
        }
    }
    eprintln!("{what}: largest error {:.3} of the tolerance", worst);
}

/// The smallest scale a relative tolerance is taken of: results that are exactly 0 in f64 come
/// out within f32 rounding of 0.
const TINY: f64 = 1e-30;

fn rms_norm<B: Backend>(b: &B, _: &Tol) {
    let mut rng = TestRng::new(9);
    let eps = 1e-6f32;
    // (rows, cols, width of the weight): whole rows, then groups of a row (per-head Q/K norms).
    for (rows, cols, n) in [(1, 896, 896), (5, 33, 33), (3, 1, 1), (70, 130, 130), (3, 8 * 64, 64), (5, 2 * 256, 256)] {
        // Groups of different scales: the norm must not depend on it.
        let x: Vec<f32> = rng.vec(rows * cols).iter().enumerate().map(|(i, v)| v * [1.0, 30.0, 0.01][i / n % 3]).collect();
        let g = rng.vec(n);
        let w = b.load_weight(&Weight::from_f32(1, n, &g)).unwrap();
        let got = read(b, &b.rms_norm(&up(b, rows, cols, &x), &w, eps).unwrap());
        let want: Vec<f64> = x
            .chunks(n)
            .flat_map(|row| {
                let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
                let s = 1.0 / (ms + eps as f64).sqrt();
                row.iter().zip(&g).map(move |(&v, &g)| v as f64 * s * g as f64)
            })
            .collect();
        check(&got, &want, |i| FLOAT * want[i].abs() + TINY, &format!("{}: rms_norm {rows}x{cols} by {n}", b.name()));
    }
}

/// `rope` applied to random rows at `positions`, against the f64 rotation of each head's first
/// `rotary_dim` values (the rest pass through).
fn check_rope<B: Backend>(b: &B, rng: &mut TestRng, heads: usize, positions: &[u32], rope: &Rope) {
    let (rows, hd, rot) = (positions.len(), rope.head_dim, rope.rotary_dim);
    let cols = heads * hd;
    let x = rng.vec(rows * cols);
    let mut t = up(b, rows, cols, &x);
    b.rope(&mut t, positions, rope).unwrap();
    let half = rot / 2;
    let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let mut scale: Vec<f64> = x.iter().map(|v| v.abs() as f64).collect();
    for (r, &pos) in positions.iter().enumerate() {
        for h in 0..heads {
            let at = r * cols + h * hd;
            for i in 0..half {
                let factor = rope.factors.map_or(1.0, |f| f[i] as f64);
                let freq = (rope.theta as f64).powf(-2.0 * i as f64 / rot as f64) * rope.freq_scale as f64 / factor;
                let angle = pos as f64 * freq;
                let (cos, sin) = (angle.cos() * rope.attn_factor as f64, angle.sin() * rope.attn_factor as f64);
                let (a, bb) = (x[at + i] as f64, x[at + i + half] as f64);
                want[at + i] = a * cos - bb * sin;
                want[at + i + half] = bb * cos + a * sin;
                let mag = (a.abs() + bb.abs()) * rope.attn_factor as f64;
                scale[at + i] = mag;
                scale[at + i + half] = mag;
            }
        }
    }
    let what = format!("{}: rope {rows}x{heads}x{hd} rotating {rot}", b.name());
    check(&read(b, &t), &want, |i| FLOAT * scale[i] + TINY, &what);
}

fn rope<B: Backend>(b: &B, _: &Tol) {
    let mut rng = TestRng::new(11);
    for (rows, heads, hd, theta) in [(1, 14, 64, 1e6f32), (5, 2, 64, 1e4), (7, 3, 6, 1e4), (70, 4, 128, 1e6)] {
        // Positions across a 32k context, where an angle rounded to f32 would be off by 1e-3.
        let positions: Vec<u32> = (0..rows).map(|_| rng.below(32_768)).collect();
        check_rope(b, &mut rng, heads, &positions, &Rope::plain(hd, theta));
    }
}

/// A layer's Q and K rotated in one call: the same bits as a call each, for K narrower than Q
/// (grouped-query heads), partial rotation and a batch past the GPU's workgroup of pairs.
fn rope_pair<B: Backend>(b: &B, _: &Tol) {
    let mut rng = TestRng::new(13);
    let partial = Rope { rotary_dim: 48, ..Rope::plain(64, 1e6) };
    for (rows, q_heads, k_heads, rope) in [(1, 14, 2, Rope::plain(64, 1e6)), (5, 3, 1, partial), (70, 4, 4, Rope::plain(6, 1e4))] {
        let positions: Vec<u32> = (0..rows).map(|_| rng.below(32_768)).collect();
        let hd = rope.head_dim;
        let (qv, kv) = (rng.vec(rows * q_heads * hd), rng.vec(rows * k_heads * hd));
        let (mut q, mut k) = (up(b, rows, q_heads * hd, &qv), up(b, rows, k_heads * hd, &kv));
        b.rope_pair(&mut q, &mut k, &positions, &rope).unwrap();
        let (mut q1, mut k1) = (up(b, rows, q_heads * hd, &qv), up(b, rows, k_heads * hd, &kv));
        b.rope(&mut q1, &positions, &rope).unwrap();
        b.rope(&mut k1, &positions, &rope).unwrap();
        let what = format!("{}: rope_pair {rows} rows, {q_heads} and {k_heads} heads of {hd}", b.name());
        assert!(same_bits(&read(b, &q), &read(b, &q1)) && same_bits(&read(b, &k), &read(b, &k1)), "{what}");
    }
    let (mut q, mut k) = (up(b, 2, 64, &[0.0; 128]), up(b, 1, 64, &[0.0; 64]));
    assert!(b.rope_pair(&mut q, &mut k, &[0, 1], &Rope::plain(64, 1e4)).is_err(), "{}: K of fewer rows than the positions", b.name());
}

/// RoPE as Llama 3 (per-frequency factors), linear scaling, Phi-3's long RoPE (factors and an
/// attention factor) and Phi-4-mini (3/4 of each head rotated) use it, at long-context positions.
fn rope_scaled_and_partial<B: Backend>(b: &B, _: &Tol) {
    let mut rng = TestRng::new(12);
    let positions = [0, 1, 9_000, 30_000, 131_000];
    let llama3 = saguaro::model::arch::llama3_factors(64, 500_000.0, 32.0, 1.0, 4.0, 8192.0);
    let long: Vec<f32> = (0..48).map(|i| 1.0 + i as f32 * 0.7).collect();
    let ropes = [
        Rope { factors: Some(&llama3), ..Rope::plain(64, 500_000.0) },
        Rope { freq_scale: 0.125, ..Rope::plain(128, 1e6) },
        Rope { factors: Some(&long), attn_factor: 1.19, ..Rope::plain(96, 1e4) },
        Rope { rotary_dim: 96, ..Rope::plain(128, 1e4) },
        Rope { rotary_dim: 4, ..Rope::plain(6, 1e4) },
    ];
    for rope in &ropes {
        check_rope(b, &mut rng, 3, &positions, rope);
    }
}

fn glu<B: Backend>(b: &B, _: &Tol) {
    let mut rng = TestRng::new(13);
    let (rows, cols) = (5, 300);
    let mut gate: Vec<f32> = rng.vec(rows * cols).iter().map(|x| 12.0 * x).collect();
    // Gates where the exponential leaves f32's range, or nearly, at either end.
    gate[..8].copy_from_slice(&[-200.0, -90.0, -87.5, -30.0, 30.0, 87.5, 90.0, 200.0]);
    let upv = rng.vec(rows * cols);
    let sqrt_2_pi = (2.0 / std::f64::consts::PI).sqrt();
    for act in [Activation::Silu, Activation::GeluTanh] {
        let got = read(b, &b.glu(&up(b, rows, cols, &gate), &up(b, rows, cols, &upv), act).unwrap());
        let f = |g: f64| match act {
            Activation::Silu => g / (1.0 + (-g).exp()),
            // 0.5 g (1 + tanh z), written as g / (1 + e^-2z) (the same function) so that f64
            // does not cancel 1 + tanh z to 0 at large negative z.
            Activation::GeluTanh => g / (1.0 + (-2.0 * sqrt_2_pi * (g + 0.044715 * g * g * g)).exp()),
        };
        let want: Vec<f64> = gate.iter().zip(&upv).map(|(&g, &u)| f(g as f64) * u as f64).collect();
        // The sigmoid's argument z carries f32 rounding relative to its size, which moves e^-z
        // by |z| times as much.
        let (a, c) = act.sigmoid_coefficients();
        let z = |i: usize| (gate[i] as f64 * (a as f64 + c as f64 * (gate[i] as f64).powi(2))).abs();
        check(&got, &want, |i| FLOAT * (1.0 + z(i)) * want[i].abs() + TINY, &format!("{}: glu {act:?}", b.name()));
    }
}

fn add_and_select_rows<B: Backend>(b: &B, _: &Tol) {
    let mut rng = TestRng::new(17);
    let (rows, cols) = (5, 300);
    // Summands of very different sizes, so that the sum is rounded.
    let x: Vec<f32> = rng.vec(rows * cols).iter().map(|v| 1e3 * v).collect();
    let y = rng.vec(rows * cols);
    let mut t = up(b, rows, cols, &x);
    b.add_assign(&mut t, &up(b, rows, cols, &y)).unwrap();
    let sum: Vec<f64> = x.iter().zip(&y).map(|(&a, &c)| (a as f64 + c as f64) as f32 as f64).collect();
    check(&read(b, &t), &sum, |_| 0.0, &format!("{}: add_assign", b.name()));

    let picks = [4u32, 0, 0, 2];
    let got = read(b, &b.select_rows(&t, &picks).unwrap());
    let want: Vec<f64> = picks.iter().flat_map(|&r| sum[r as usize * cols..(r as usize + 1) * cols].iter().copied()).collect();
    check(&got, &want, |_| 0.0, &format!("{}: select_rows", b.name()));
}

/// `mask` against `Allowed::apply` on random logits and random bitsets: rows of random bits,
/// rows allowing everything, rows given too few words (the rest disallowed) and rows with bits
/// set past the last column; row lengths that are and are not multiples of 32. Exact: each value
/// is either kept bit for bit or -inf.
fn mask<B: Backend>(b: &B, _: &Tol) {
    let mut rng = TestRng::new(19);
    for (rows, cols) in [(1, 32), (3, 301), (5, 33), (2, 5003)] {
        let x: Vec<f32> = rng.vec(rows * cols).iter().map(|v| 10.0 * v).collect();
        let mut allowed = Allowed::new(cols);
        for r in 0..rows {
            let words = allowed.words();
            match r % 4 {
                1 => allowed.push_all(),
                2 => allowed.push(&[rng.next() as u32]), // one word: tokens 32.. disallowed
                _ => {
                    // Sparse and dense words alike, every bit of the last word set, as a grammar
                    // engine may leave them.
                    let bits: Vec<u32> = (0..words)
                        .map(|w| match rng.below(3) {
                            _ if w + 1 == words && cols % 32 != 0 => u32::MAX,
                            0 => 1 << rng.below(32),
                            _ => rng.next() as u32,
                        })
                        .collect();
                    allowed.push(&bits);
                }
            }
        }
        let mut want = x.clone();
        allowed.apply(&mut want);
        let kept = want.iter().filter(|v| v.is_finite()).count();
        assert!(kept > 0 && kept < want.len(), "the bitsets keep some values and mask others");
        let mut t = up(b, rows, cols, &x);
        b.mask(&mut t, &allowed).unwrap();
        let got = read(b, &t);
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{}: mask {rows}x{cols}: element {i} (row {}, column {}): got {g}, reference {w}", b.name(), i / cols, i % cols);
        }
        eprintln!("{}: mask {rows}x{cols}: {kept} of {} kept, all exact", b.name(), want.len());
    }
    // A bitset of another shape is an error, not a partial mask.
    let mut t = up(b, 2, 40, &rng.vec(80));
    let mut one = Allowed::new(40);
    one.push_all();
    assert!(b.mask(&mut t, &one).is_err(), "{}: mask with 1 row of bits for 2 rows", b.name());
    let mut wide = Allowed::new(41);
    wide.push_all();
    wide.push_all();
    assert!(b.mask(&mut t, &wide).is_err(), "{}: mask with 41 columns of bits for 40", b.name());
}

/// Rows `ids` of `table` against its reference decoding.
fn check_embed<B: Backend>(b: &B, t: &Tol, table: &Weight, ids: &[u32], scale: f32) {
    let dense = table.to_f32();
    let k = table.cols;
    let got = read(b, &b.embed(&b.load_weight(table).unwrap(), ids, scale).unwrap());
    let want: Vec<f64> = ids
        .iter()
        .flat_map(|&id| dense[id as usize * k..(id as usize + 1) * k].iter().map(|&v| (v * scale) as f64))
        .collect();
    let what = format!("{}: embed {:?} {}x{k} scaled by {scale}", b.name(), table.dtype, table.rows);
    // Scaled: one more rounding, of the product.
    let float = if scale == 1.0 { 0.0 } else { FLOAT };
    check(&got, &want, |i| (t.decode * scale.abs() as f64 + float) * (1.0 + want[i].abs()), &what);
}

fn embed<B: Backend>(b: &B, t: &Tol) {
    for (i, &dtype) in DType::ALL.iter().enumerate() {
        let k = if dtype.block_size() == 1 { 27 } else { 256 };
        let table = random_weight(dtype, 50, k, 200 + i as u64).unwrap();
        check_embed(b, t, &table, &[0, 49, 7, 7, 21], 1.0);
        // Gemma's scaling by sqrt(d_model).
        check_embed(b, t, &table, &[3, 49], 25.3);
    }
}

/// `x @ w^T (+ bias)` for random activations of each batch size in `ms`, against the f64 dot of
/// the decoded weights.
fn check_matmul<B: Backend>(b: &B, t: &Tol, w: &Weight, bias: Option<&[f32]>, ms: &[usize], seed: u64) {
    let bw = b.load_weight(w).unwrap();
    let bb = bias.map(|v| b.load_weight(&Weight::from_f32(1, v.len(), v)).unwrap());
    let dense = w.to_f32();
    let (n, k) = (w.rows, w.cols);
    let mut rng = TestRng::new(seed);
    for &m in ms {
        // Heavy-tailed like real activations, and an all-zero block (a zero quantization scale).
        let mut x: Vec<f32> = (0..m * k).map(|_| rng.activation()).collect();
        x[..32.min(k)].fill(0.0);
        let got = read(b, &b.matmul(&up(b, m, k, &x), &bw, bb.as_ref()).unwrap());
        let (mut want, mut tol) = (Vec::with_capacity(m * n), Vec::with_capacity(m * n));
        for xi in x.chunks(k) {
            for (r, wr) in dense.chunks(k).enumerate() {
                let (dot, err) = reference::dot(w.dtype, t.levels, wr, xi);
                let err = if t.f16 { err.max(reference::f16_error(w.dtype, wr, xi)) } else { err };
                want.push(dot + bias.map_or(0.0, |v| v[r] as f64));
                tol.push(err);
            }
        }
        let what = format!("{}: matmul {:?} m={m} n={n} k={k} bias={}", b.name(), w.dtype, bias.is_some());
        check(&got, &want, |i| tol[i], &what);
    }
}

fn matmul<B: Backend>(b: &B, t: &Tol) {
    for (i, &dtype) in DType::ALL.iter().enumerate() {
        // Rows not a multiple of any tile; K a few blocks, and odd for float types.
        let k = match dtype.block_size() {
            1 => 45,
            32 => 96,
            _ => 512,
        };
        let w = random_weight(dtype, 37, k, i as u64).unwrap();
        // 1 = decode, 3 = the GPU's largest unrolled group of rows, 5 = K+1 verification, 33 = a
        // wide tree step (on the CPU, several groups of rows over each weight chunk), 64 = the
        // GPU's largest split-K batch, 70 = its tiled kernel with partial tiles.
        check_matmul(b, t, &w, None, &[1, 2, 3, 4, 5, 33, 64, 70], 100 + i as u64);
    }
}

fn matmul_bias_and_long_rows<B: Backend>(b: &B, t: &Tol) {
    let bias = TestRng::new(5).vec(131);
    check_matmul(b, t, &random_weight(DType::Q8_0, 131, 160, 3).unwrap(), Some(&bias), &[1, 5, 100], 6);
    // A Qwen-like projection: K larger than a GPU workgroup's first sweep.
    check_matmul(b, t, &random_weight(DType::Q4K, 64, 1536, 4).unwrap(), None, &[1, 3], 7);
    // Rows many GPU sweeps long (Qwen 0.5B's down projection), and Q6_K at the CPU kernels' widest
    // batch.
    check_matmul(b, t, &random_weight(DType::Q8_0, 9, 4864, 8).unwrap(), None, &[1, 5], 9);
    check_matmul(b, t, &random_weight(DType::Q6K, 5, 2048, 10).unwrap(), None, &[1, 9], 11);
}

/// One input by several weights at once, as a layer's Q, K and V (of mixed types, as Q4_K_M files
/// store them, with biases) and its gate and up projections: the same bits as one matmul each.
fn matmuls_equal_separate_matmuls<B: Backend>(b: &B, _: &Tol) {
    let k = 512;
    let mut rng = TestRng::new(70);
    let ws = [(DType::Q4K, 40), (DType::Q6K, 8), (DType::Q8_0, 8), (DType::F16, 24)]
        .map(|(dtype, rows)| b.load_weight(&random_weight(dtype, rows, k, rows as u64).unwrap()).unwrap());
    let biases = [40, 8].map(|n| b.load_weight(&Weight::from_f32(1, n, &rng.vec(n))).unwrap());
    for m in [1, 5, 12] {
        let x = up(b, m, k, &(0..m * k).map(|_| rng.activation()).collect::<Vec<_>>());
        let qkv = b.matmuls(&x, [(&ws[0], Some(&biases[0])), (&ws[1], Some(&biases[1])), (&ws[2], None)]).unwrap();
        let pair = b.matmuls(&x, [(&ws[3], None), (&ws[0], None)]).unwrap();
        let got = qkv.iter().chain(&pair).map(|t| read(b, t));
        let separate = [(0, Some(0)), (1, Some(1)), (2, None), (3, None), (0, None)]
            .map(|(w, bias)| read(b, &b.matmul(&x, &ws[w], bias.map(|i| &biases[i])).unwrap()));
        for (i, (got, want)) in got.zip(&separate).enumerate() {
            assert_eq!(got.len(), want.len(), "{}: output {i} at m={m}", b.name());
            assert!(got.iter().zip(want).all(|(g, w)| g.to_bits() == w.to_bits()), "{}: output {i} at m={m}", b.name());
        }
    }
    let short_bias = b.load_weight(&Weight::from_f32(1, 3, &[0.0; 3])).unwrap();
    assert!(b.matmuls(&up(b, 1, k, &vec![0.0; k]), [(&ws[0], None), (&ws[1], Some(&short_bias))]).is_err());
    together_equal_apart(b, k, &mut rng);
}

/// Weights loaded together ([`Backend::load_together`]: a layer's Q, K and V, which the GPU
/// stores side by side and runs as one dispatch) give the bits of the same weights loaded apart,
/// together and alone, with and without their biases (loaded together too), for a decode, a
/// verification and a prefill (the GPU's tiled kernel). Weights of different types load
/// together as well (on the GPU, those of the leading type together, the rest apart).
fn together_equal_apart<B: Backend>(b: &B, k: usize, rng: &mut TestRng) {
    for dtypes in [[DType::Q5_0; 3], [DType::Q4K; 3], [DType::Q4K, DType::Q4K, DType::Q6K]] {
        let host = [40, 8, 16].map(|rows| random_weight(dtypes[0], rows, k, rows as u64 + 5).unwrap());
        let host = [0, 1, 2].map(|i| if dtypes[i] == dtypes[0] { host[i].clone() } else { random_weight(dtypes[i], 16, k, 9).unwrap() });
        let host_biases = [40, 8, 16].map(|n| Weight::from_f32(1, n, &rng.vec(n)));
        let ws = b.load_together(&host.each_ref()).unwrap();
        let biases = b.load_together(&host_biases.each_ref()).unwrap();
        let apart = host.each_ref().map(|w| b.load_weight(w).unwrap());
        let apart_biases = host_biases.each_ref().map(|w| b.load_weight(w).unwrap());
        for m in [1, 5, 70] {
            let x = up(b, m, k, &(0..m * k).map(|_| rng.activation()).collect::<Vec<_>>());
            for with_bias in [false, true] {
                let bias = |i: usize| with_bias.then(|| &biases[i]);
                let got = b.matmuls(&x, [(&ws[0], bias(0)), (&ws[1], bias(1)), (&ws[2], bias(2))]).unwrap();
                for i in 0..3 {
                    let want = read(b, &b.matmul(&x, &apart[i], with_bias.then(|| &apart_biases[i])).unwrap());
                    let what = format!("{}: {:?} loaded together, output {i} at m={m}, bias {with_bias}", b.name(), dtypes);
                    assert!(same_bits(&read(b, &got[i]), &want), "{what}");
                    assert!(same_bits(&read(b, &b.matmul(&x, &ws[i], bias(i)).unwrap()), &want), "{what}, alone");
                }
            }
        }
    }
}

/// A residual connection's projection and a gated unit's input side, which the GPU runs fused
/// into the matmul's pass: the same bits as the separate ops, for a decode, a verification and a
/// prefill (the GPU's tiled kernel), for each activation; and with the gate and up projections
/// loaded together, which the GPU runs as one pass up to its tiled kernel's batches (of each
/// weight type that kernel decodes in its own units).
fn fused_projections_equal_separate_ops<B: Backend>(b: &B, _: &Tol) {
    let k = 512;
    let mut rng = TestRng::new(71);
    let [gate, upw, down] = [(DType::Q4K, 40), (DType::Q6K, 40), (DType::Q8_0, 24)]
        .map(|(dtype, rows)| b.load_weight(&random_weight(dtype, rows, k, rows as u64 + 1).unwrap()).unwrap());
    let pairs = [DType::Q4K, DType::Q5_0, DType::Q8_0].map(|dtype| {
        let host = [1, 2].map(|s| random_weight(dtype, 37, k, 80 + s).unwrap());
        let together = b.load_together(&host.each_ref()).unwrap();
        (dtype, together, host.map(|w| b.load_weight(&w).unwrap()))
    });
    for m in [1, 5, 70] {
        let x = up(b, m, k, &(0..m * k).map(|_| rng.activation()).collect::<Vec<_>>());
        let resid = rng.vec(m * 24);
        let mut fused = up(b, m, 24, &resid);
        b.matmul_add(&x, &down, &mut fused).unwrap();
        let mut separate = up(b, m, 24, &resid);
        b.add_assign(&mut separate, &b.matmul(&x, &down, None).unwrap()).unwrap();
        assert!(same_bits(&read(b, &fused), &read(b, &separate)), "{}: matmul_add at m={m}", b.name());
        for act in [Activation::Silu, Activation::GeluTanh] {
            let fused = read(b, &b.gated_matmul(&x, &gate, &upw, act).unwrap());
            let (g, u) = (b.matmul(&x, &gate, None).unwrap(), b.matmul(&x, &upw, None).unwrap());
            let separate = read(b, &b.glu(&g, &u, act).unwrap());
            assert!(same_bits(&fused, &separate), "{}: gated_matmul {act:?} at m={m}", b.name());
            for (dtype, together, apart) in &pairs {
                let fused = read(b, &b.gated_matmul(&x, &together[0], &together[1], act).unwrap());
                let (g, u) = (b.matmul(&x, &apart[0], None).unwrap(), b.matmul(&x, &apart[1], None).unwrap());
                let separate = read(b, &b.glu(&g, &u, act).unwrap());
                assert!(same_bits(&fused, &separate), "{}: {dtype:?} gate and up loaded together, {act:?} at m={m}", b.name());
            }
        }
    }
    let x = up(b, 2, k, &vec![0.0; 2 * k]);
    assert!(b.matmul_add(&x, &down, &mut up(b, 2, 23, &[0.0; 46])).is_err(), "{}: a residual of the wrong width", b.name());
    assert!(b.matmul_add(&x, &down, &mut up(b, 1, 24, &[0.0; 24])).is_err(), "{}: a residual of too few rows", b.name());
    assert!(b.gated_matmul(&x, &gate, &down, Activation::Silu).is_err(), "{}: gate and up of different widths", b.name());
}

/// Attention calls on one backend with its cache carried over between calls, and the reference's
/// own copy of the cache.
struct Attn<'a, B: Backend> {
    b: &'a B,
    shape: AttnShape,
    cache: B::Cache,
    /// Per slot, the K and V rows the reference has written there, as the cache stores them.
    slots: Vec<Option<(Vec<f32>, Vec<f32>)>>,
    kv_f16: bool,
    rng: TestRng,
}

impl<'a, B: Backend> Attn<'a, B> {
    fn new(b: &'a B, tol: &Tol, shape: AttnShape, capacity: usize, seed: u64) -> Self {
        let cache = b.new_cache(2, capacity, shape.n_kv_heads * shape.head_dim).unwrap();
        Attn { b, shape, cache, slots: vec![None; capacity], kv_f16: tol.kv_f16, rng: TestRng::new(seed) }
    }

    fn run(&mut self, batch: &Batch, what: &str) {
        let s = self.shape;
        let (m, hd) = (batch.len(), s.head_dim);
        let (qd, kvd) = (s.n_heads * hd, s.n_kv_heads * hd);
        let (q, k, v) = (self.rng.vec(m * qd), self.rng.vec(m * kvd), self.rng.vec(m * kvd));
        let b = self.b;
        // Layer 1 of 2, so that a cache indexing slip into layer 0 shows.
        let out = b.attention(&up(b, m, qd, &q), &up(b, m, kvd, &k), &up(b, m, kvd, &v), &mut self.cache, 1, batch, s).unwrap();

        let stored = |x: &[f32]| -> Vec<f32> {
            x.iter().map(|&x| if self.kv_f16 { half::f16::from_f32(x).to_f32() } else { x }).collect()
        };
        for (r, &slot) in batch.slots.iter().enumerate() {
            self.slots[slot as usize] = Some((stored(&k[r * kvd..(r + 1) * kvd]), stored(&v[r * kvd..(r + 1) * kvd])));
        }
        let (mut want, mut tol) = (vec![0.0f64; m * qd], vec![0.0f64; m * qd]);
        for r in 0..m {
            let extra = &batch.mask.extra[r * batch.mask.extra_stride..(r + 1) * batch.mask.extra_stride];
            let start = s.window.map_or(0, |w| (batch.positions[r] as usize + 1).saturating_sub(w as usize));
            let attended: Vec<usize> = (start.min(batch.mask.prefix[r] as usize)..batch.mask.prefix[r] as usize)
                .chain(extra.iter().filter(|&&e| e != NO_SLOT).map(|&e| e as usize))
                .collect();
            for h in 0..s.n_heads {
                let qh = &q[r * qd + h * hd..r * qd + (h + 1) * hd];
                let kvo = h / (s.n_heads / s.n_kv_heads) * hd;
                let rows: Vec<(&[f32], &[f32])> = attended
                    .iter()
                    .map(|&t| {
                        let (k, v) = self.slots[t].as_ref().unwrap_or_else(|| panic!("{what}: slot {t} attended unwritten"));
                        (&k[kvo..kvo + hd], &v[kvo..kvo + hd])
                    })
                    .collect();
                let norm = s.scale as f64;
                let scores: Vec<f64> = rows.iter().map(|(k, _)| qh.iter().zip(*k).map(|(&a, &c)| a as f64 * c as f64).sum::<f64>() * norm).collect();
                // The scale of the scores' rounding errors.
                let score_mag = rows.iter().map(|(k, _)| reference::magnitude(qh, k) * norm).fold(0.0, f64::max);
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..hd {
                    let at = r * qd + h * hd + d;
                    want[at] = rows.iter().zip(&e).map(|((_, v), p)| p / sum * v[d] as f64).sum();
                    let weighted: f64 = rows.iter().zip(&e).map(|((_, v), p)| p / sum * (v[d] as f64).abs()).sum();
                    // A score off by δ moves its normalized weight by at most 2δ relatively.
                    tol[at] = FLOAT * (1.0 + 2.0 * score_mag) * weighted + TINY;
                }
            }
        }
        check(&read(b, &out), &want, |i| tol[i], &format!("{}: attention {what} {s:?}", b.name()));
    }
}

fn attention_causal<B: Backend>(b: &B, tol: &Tol) {
    for (i, shape) in [
        AttnShape::new(6, 2, 64),
        AttnShape::new(3, 3, 80),
        AttnShape::new(4, 2, 6),
        // An odd KV width.
        AttnShape::new(3, 1, 5),
    ]
    .into_iter()
    .enumerate()
    {
        let mut a = Attn::new(b, tol, shape, 200, 20 + i as u64);
        // Prefill past two 64-slot chunks, decode one token, verify K+1 = 5, then roll back and
        // overwrite slots 152.. with another continuation.
        a.run(&Batch::causal(&[0; 150], 0), "prefill 150");
        a.run(&Batch::causal(&[0], 150), "decode at 150");
        a.run(&Batch::causal(&[0; 5], 151), "verify 5 at 151");
        a.run(&Batch::causal(&[0; 3], 152), "rewrite 3 at 152");
    }
}

fn attention_tree<B: Backend>(b: &B, tol: &Tol) {
    tree_step(b, tol, AttnShape::new(4, 2, 64), 31);
}

/// A prefill of 70 tokens, then a tree step over it.
fn tree_step<B: Backend>(b: &B, tol: &Tol, shape: AttnShape, seed: u64) {
    let mut a = Attn::new(b, tol, shape, 128, seed);
    a.run(&Batch::causal(&[0; 70], 0), "prefix of 70");
    // A tree of 5 nodes in slots 80..85 over the 70-token prefix: 0 -> {1, 2}, 1 -> 3, 2 -> 4.
    // Each node attends the prefix (one only part of it, one none of it), its ancestors and
    // itself, padded with NO_SLOT.
    let parents: [Option<usize>; 5] = [None, Some(0), Some(0), Some(1), Some(2)];
    let stride = 4;
    let mut extra = vec![NO_SLOT; 5 * stride];
    for r in 0..5 {
        let mut chain = vec![80 + r as u32];
        let mut p = parents[r];
        while let Some(q) = p {
            chain.push(80 + q as u32);
            p = parents[q];
        }
        chain.reverse();
        extra[r * stride..r * stride + chain.len()].copy_from_slice(&chain);
    }
    let batch = Batch {
        tokens: vec![0; 5],
        positions: vec![70, 71, 71, 72, 72],
        slots: (80..85).collect(),
        mask: Mask { prefix: vec![70, 70, 65, 0, 70], extra_stride: stride, extra, base: vec![] },
        allowed: None,
    };
    a.run(&batch, "tree step");
}

/// Gemma 3's attention: a sliding window over the prefix (shorter and longer than the rows
/// reach, and past the GPU's 64-slot chunks) and a scale other than `1 / sqrt(head_dim)`.
fn attention_windowed_and_scaled<B: Backend>(b: &B, tol: &Tol) {
    for (i, window) in [1u32, 5, 70, 100, 512].into_iter().enumerate() {
        let shape = AttnShape { scale: 0.0625, window: Some(window), ..AttnShape::new(4, 1, 256) };
        let mut a = Attn::new(b, tol, shape, 200, 60 + i as u64);
        a.run(&Batch::causal(&[0; 150], 0), &format!("prefill 150, window {window}"));
        a.run(&Batch::causal(&[0], 150), &format!("decode at 150, window {window}"));
        a.run(&Batch::causal(&[0; 5], 151), &format!("verify 5 at 151, window {window}"));
    }
    tree_step(b, tol, AttnShape { window: Some(8), ..AttnShape::new(4, 2, 64) }, 66);
}

/// A verification of 5 rows after a prefix of `prefix` tokens, and the same rows decoded one at a
/// time, on a fresh cache (the same inputs for every backend and seed).
fn verified_and_decoded<B: Backend>(b: &B, shape: AttnShape, prefix: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let (qd, kvd) = (shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim);
    let mut rng = TestRng::new(seed);
    let m = 5;
    let pre: [Vec<f32>; 3] = [rng.vec(prefix * qd), rng.vec(prefix * kvd), rng.vec(prefix * kvd)];
    let (q, k, v) = (rng.vec(m * qd), rng.vec(m * kvd), rng.vec(m * kvd));
    let mut cache = b.new_cache(1, prefix + m, kvd).unwrap();
    let [pq, pk, pv] = &pre;
    let batch = Batch::causal(&vec![0; prefix], 0);
    b.attention(&up(b, prefix, qd, pq), &up(b, prefix, kvd, pk), &up(b, prefix, kvd, pv), &mut cache, 0, &batch, shape).unwrap();
    let mut attend = |rows: std::ops::Range<usize>| {
        let n = rows.len();
        let (q, k, v) = (&q[rows.start * qd..rows.end * qd], &k[rows.start * kvd..rows.end * kvd], &v[rows.start * kvd..rows.end * kvd]);
        let batch = Batch::causal(&vec![0; n], prefix + rows.start);
        read(b, &b.attention(&up(b, n, qd, q), &up(b, n, kvd, k), &up(b, n, kvd, v), &mut cache, 0, &batch, shape).unwrap())
    };
    let verified = attend(0..m);
    let decoded = (0..m).flat_map(|r| attend(r..r + 1)).collect();
    (verified, decoded)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// On the CPU a verification's attention rows have the bits of the decodes they stand for, on any
/// number of threads (which changes how the heads of a group are split into jobs): greedy SD is
/// lossless only if the target's logits for a token do not depend on its batch. Groups of 1, 6, 7
/// and 10 heads per KV head (the last more than one job takes), head sizes with and without a tail
/// past whole 8-lane vectors.
#[test]
fn cpu_attention_rows_get_the_same_bits_in_any_batch() {
    for (i, shape) in [AttnShape::new(12, 2, 64), AttnShape::new(7, 1, 36), AttnShape::new(10, 1, 20), AttnShape::new(3, 3, 80)]
        .into_iter()
        .enumerate()
    {
        let mut outs = vec![];
        for threads in [1, 2, 3] {
            let (verified, decoded) = verified_and_decoded(&CpuBackend::new(threads).unwrap(), shape, 40, 90 + i as u64);
            assert!(same_bits(&verified, &decoded), "{shape:?}, {threads} threads: a batch of 5 against 5 decodes");
            outs.push(verified);
        }
        assert!(outs.windows(2).all(|w| w[0] == w[1]), "{shape:?}: the bits depend on the thread count");
    }
}

/// The GPU with a small batch's attention walk split every 64 slots (a GPU splits every 128,
/// lavapipe never), so that `gpu_split::*` covers the split walk and its merge on any adapter.
fn gpu_split() -> Option<&'static GpuBackend> {
    static SPLIT: OnceLock<Result<GpuBackend, Missing>> = OnceLock::new();
    util::gpu::cached(&SPLIT, || util::gpu::open(GpuOptions { attention_split: Some(64), ..Default::default() }))
}

mod gpu_split {
    macro_rules! attention_suite {
        ($($op:ident),*) => {
            $(#[test] fn $op() {
                if let Some(g) = super::gpu_split() {
                    super::$op(g, &super::GPU);
                    let built = saguaro::backend::gpu::GpuBackend::kernels_built(g);
                    assert!(built.iter().any(|k| k.starts_with("attention.combine")), "the split walk did not run: {built:?}");
                }
            })*
        };
    }
    attention_suite!(attention_causal, attention_tree, attention_windowed_and_scaled);
}

/// The GPU with its KV cache in f32 (the default caches f16), so that `gpu_kv_f32::*` covers both
/// ways of storing it; each suite checks the kernel of its way ran.
fn gpu_kv_f32() -> Option<&'static GpuBackend> {
    static F32: OnceLock<Result<GpuBackend, Missing>> = OnceLock::new();
    util::gpu::cached(&F32, || util::gpu::open(GpuOptions { kv_cache: KvCache::F32, ..Default::default() }))
}

mod gpu_kv {
    macro_rules! attention_suite {
        ($($op:ident),*) => {
            $(#[test] fn $op() {
                let (Some(f16), Some(f32)) = (super::util::shared_gpu(), super::gpu_kv_f32()) else { return };
                for (b, tol, kv) in [(f16, &super::GPU, "KV=@kv_f16"), (f32, &super::GPU_KV_F32, "KV=@kv_f32")] {
                    super::$op(b, tol);
                    let built = saguaro::backend::gpu::GpuBackend::kernels_built(b);
                    assert!(built.iter().any(|k| k.starts_with("attention.attend") && k.contains(kv)), "{kv} did not run: {built:?}");
                }
            })*
        };
    }
    attention_suite!(attention_causal, attention_tree, attention_windowed_and_scaled);
}

/// On the GPU too a verification's rows have the bits of the decodes, unsplit and with the walk
/// split into parts, when the batch's rows reach across a part's end (prefixes of 62 and 126 with
/// 64-slot parts), when a decode's walk is not split but the batch's is, and under sliding
/// windows, whose rows start their walks at different slots.
#[test]
fn gpu_attention_rows_get_the_same_bits_in_any_batch() {
    let (Some(default), Some(split)) = (util::shared_gpu(), gpu_split()) else { return };
    for (how, b) in [("default", default), ("split every 64 slots", split)] {
        let windowed = |w| AttnShape { window: Some(w), ..AttnShape::new(12, 2, 64) };
        let cases = [
            (AttnShape::new(12, 2, 64), 62),
            (AttnShape::new(14, 2, 64), 126),
            (AttnShape::new(4, 4, 128), 60),
            (windowed(40), 62),
            (windowed(100), 130),
        ];
        for (i, (shape, prefix)) in cases.into_iter().enumerate() {
            let (verified, decoded) = verified_and_decoded(b, shape, prefix, 95 + i as u64);
            assert!(same_bits(&verified, &decoded), "{} ({how}): {shape:?} after {prefix}: a batch of 5 against 5 decodes", b.name());
        }
    }
}

/// On the GPU a matmul's row has its decode's bits in any batch: the loop over a workgroup's rows
/// is unrolled for groups of up to three rows and not beyond, and a verification's rows must get
/// the bits of the decodes they stand for either way.
#[test]
fn gpu_matmul_rows_get_the_same_bits_in_any_batch() {
    let Some(b) = util::shared_gpu() else { return };
    for (i, &dtype) in DType::ALL.iter().enumerate() {
        let k = if dtype.block_size() == 1 { 45 } else { 512 };
        let w = b.load_weight(&random_weight(dtype, 37, k, 300 + i as u64).unwrap()).unwrap();
        let mut rng = TestRng::new(400 + i as u64);
        let x: Vec<f32> = (0..9 * k).map(|_| rng.activation()).collect();
        let decoded: Vec<Vec<f32>> =
            x.chunks(k).map(|row| read(b, &b.matmul(&up(b, 1, k, row), &w, None).unwrap())).collect();
        for m in 2..=9 {
            let batch = read(b, &b.matmul(&up(b, m, k, &x[..m * k]), &w, None).unwrap());
            for (row, want) in batch.chunks(37).zip(&decoded) {
                assert!(same_bits(row, want), "{}: {dtype:?}, a batch of {m} against its decodes", b.name());
            }
        }
    }
}

/// The largest entries of rows as long as a vocabulary (several passes of the GPU's chunks), with
/// ties, NaN, -0 and -inf among them, against the host's selection: the same columns in the same
/// order, the same values, the value at an asked-for column; the log-sum-exp against the host's.
fn top_k<B: Backend>(b: &B, _: &Tol) {
    let mut rng = TestRng::new(70);
    for (rows, cols, k, temperature) in [(1, 7, 3, 1.0f32), (3, 5000, 66, 0.7), (2, 151_936, 512, 1.0), (5, 1024, 1, 1.3)] {
        // Values on a coarse grid, so that many tie.
        let mut x: Vec<f32> = (0..rows * cols).map(|_| (rng.uniform() * 64.0).round() / 4.0).collect();
        x[0] = f32::NAN;
        x[1] = -0.0;
        x[2] = f32::NEG_INFINITY;
        let at: Vec<u32> = (0..rows).map(|r| if r == 1 { NO_SLOT } else { rng.below(cols as u32) }).collect();
        let got = block_on(b.top_k(&up(b, rows, cols, &x), k, temperature, &at)).unwrap();
        let want = saguaro::backend::TopK::of(&x, cols, k, temperature, &at);
        let what = format!("{}: top_k {rows}x{cols} k={k}", b.name());
        assert_eq!(got.ids, want.ids, "{what}: columns");
        assert_eq!(got.values, want.values, "{what}: values");
        assert_eq!(got.at, want.at, "{what}: the value at the asked-for column");
        for (g, w) in got.lse.iter().zip(&want.lse) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{what}: log-sum-exp {g}, reference {w}");
        }
    }
    for (k, temperature, at) in [(0, 1.0, vec![0]), (513, 1.0, vec![0]), (3, 0.0, vec![0]), (3, 1.0, vec![])] {
        let r = block_on(b.top_k(&up(b, 1, 8, &[0.0; 8]), k, temperature, &at));
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{}: top_k {k} at {temperature}: {:?}", b.name(), r.err());
    }
}

/// Rows as long as a vocabulary with NaN and -inf among them, and a draw of each: row 0 from a
/// residual whose q holds the row's likeliest tokens (where p - q < 0), the others from p.
fn draw_cases(seed: u64) -> Vec<(usize, usize, Vec<f32>, Draw)> {
    let mut rng = TestRng::new(seed);
    [(3, 5000, 0.7f32), (2, 151_936, 1.0), (4, 7, 1.3)]
        .into_iter()
        .flat_map(|(rows, cols, temperature)| {
            let mut x: Vec<f32> = (0..rows * cols).map(|_| 4.0 * rng.uniform()).collect();
            x[0] = f32::NAN;
            x[1] = f32::NEG_INFINITY;
            let at: Vec<u32> = (0..rows).map(|r| if r == 1 { NO_SLOT } else { rng.below(cols as u32) }).collect();
            let mut q = vec![0.0f32; cols];
            for (i, c) in sampling::top_n(&x[..cols], 3.min(cols), None).into_iter().enumerate() {
                q[c as usize] = [0.5, 0.3, 0.2][i];
            }
            let mut minus = vec![SparseDist::default(); rows];
            minus[0] = SparseDist::of(&q);
            let (plain, residual) = (rng.next(), rng.next());
            [
                (rows, cols, x.clone(), Draw { temperature, seed: plain, at: at.clone(), minus: vec![] }),
                (rows, cols, x, Draw { temperature, seed: residual, at, minus }),
            ]
        })
        .collect()
}

/// Row `r`'s softmax at the temperature, in f64 (NaN and -inf weigh nothing), and the weights
/// its draw draws from: the residual where it has a q that leaves any, else p.
fn draw_reference(row: &[f32], r: usize, d: &Draw) -> (Vec<f64>, Vec<f64>) {
    let max = row.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max) as f64;
    let w: Vec<f64> = row.iter().map(|&v| if v.is_nan() { 0.0 } else { ((v as f64 - max) / d.temperature as f64).exp() }).collect();
    let total: f64 = w.iter().sum();
    let p: Vec<f64> = w.iter().map(|x| x / total).collect();
    let r: Vec<f64> = match d.minus.get(r) {
        Some(q) => p.iter().enumerate().map(|(c, &p)| (p - q.at(c as u32) as f64).max(0.0)).collect(),
        None => p.clone(),
    };
    let r = if r.iter().any(|&x| x > 0.0) { r } else { p.clone() };
    (p, r)
}

/// What a draw must give on every backend: each row's probability at its asked-for column (f32's
/// rounding from the f64 softmax), a token of positive weight in what it draws from; a row of
/// infinite values draws among them, one with no weight gives its argmax; 40,000 rows of one
/// distribution draw it within 5 sigma, from p and from a residual; bad arguments are errors.
fn draw<B: Backend>(b: &B, _: &Tol) {
    let what = |s: &str| format!("{}: draw {s}", b.name());
    for (rows, cols, x, d) in draw_cases(71) {
        let got = block_on(b.draw(&up(b, rows, cols, &x), &d)).unwrap();
        for (r, (g, row)) in got.iter().zip(x.chunks_exact(cols)).enumerate() {
            let (p, from) = draw_reference(row, r, &d);
            let want = p.get(d.at[r] as usize).copied().unwrap_or(0.0);
            assert!((g.p_at as f64 - want).abs() <= 1e-5 * want + 1e-9, "{}: p {} against {want}", what("p_at"), g.p_at);
            assert!(from[g.token as usize] > 0.0, "{}: token {} has no weight", what(&format!("{rows}x{cols}")), g.token);
        }
    }
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let edge = [1.0, inf, 2.0, inf, nan, -inf, nan, -inf, nan, nan, nan, nan];
    let d = Draw { temperature: 1.0, seed: 5, at: vec![3, 1, 0], minus: vec![] };
    let got = block_on(b.draw(&up(b, 3, 4, &edge), &d)).unwrap();
    assert!([1, 3].contains(&got[0].token) && got[0].p_at == 0.5, "{}: {:?}", what("of a row with two +inf"), got[0]);
    assert_eq!((got[1].token, got[1].p_at), (1, 1.0), "{}", what("of a row of -inf and NaN: its first -inf"));
    assert_eq!((got[2].token, got[2].p_at), (0, 1.0), "{}", what("of a row of NaN"));

    let logits = [0.3f32, -1.2, 2.0, 0.0, 1.1, -0.4];
    let (n, cols, temperature) = (40_000usize, logits.len(), 0.8f32);
    let x: Vec<f32> = logits.iter().copied().cycle().take(n * cols).collect();
    let q = SparseDist::of(&[0.1, 0.0, 0.6, 0.1, 0.2, 0.0]);
    let t = up(b, n, cols, &x);
    for (minus, name) in [(vec![], "from p"), (vec![q; n], "from max(0, p - q)")] {
        let d = Draw { temperature, seed: 99, at: vec![2; n], minus };
        let (p, want) = draw_reference(&logits, 0, &d);
        let total: f64 = want.iter().sum();
        let want: Vec<f64> = want.iter().map(|x| x / total).collect();
        let got = block_on(b.draw(&t, &d)).unwrap();
        let mut counts = vec![0u64; cols];
        got.iter().for_each(|d| counts[d.token as usize] += 1);
        for (c, (&k, &e)) in counts.iter().zip(&want).enumerate() {
            let z = (k as f64 - n as f64 * e) / (n as f64 * e * (1.0 - e)).sqrt().max(1.0);
            assert!(z.abs() < 5.0, "{}: token {c} drawn {k} times where {:.0} were expected", what(name), n as f64 * e);
        }
        assert!((got[0].p_at as f64 - p[2]).abs() < 1e-6, "{}: p {} against {}", what("p_at"), got[0].p_at, p[2]);
    }

    let x = up(b, 2, 8, &[0.0; 16]);
    for (temperature, at, minus) in [(0.0, 2, 0), (f32::INFINITY, 2, 0), (1e-40, 2, 0), (1.0, 1, 0), (1.0, 2, 1)] {
        let d = Draw { temperature, seed: 0, at: vec![0; at], minus: vec![SparseDist::default(); minus] };
        let r = block_on(b.draw(&x, &d));
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{}: {:?}", what(&format!("at {temperature}, {at} rows, {minus} residuals")), r.err());
    }
}

/// The GPU's draws are an exponential race on `race_bits`' times: the same race run here in f64
/// gives the same tokens (the GPU's f32 keys would differ only between two within rounding of
/// each other), on both reduction paths.
#[test]
fn gpu_draws_are_the_reference_race() {
    let Some(shared) = util::shared_gpu() else { return };
    for g in std::iter::once(shared).chain(gpu_plain()) {
        for (rows, cols, x, d) in draw_cases(72) {
            let got = block_on(g.draw(&up(g, rows, cols, &x), &d)).unwrap();
            for (r, (got, row)) in got.iter().zip(x.chunks_exact(cols)).enumerate() {
                let (_, from) = draw_reference(row, r, &d);
                let time = |c: usize| -(-((race_bits(d.seed, r as u32, c as u32) as f64 + 0.5) / 2f64.powi(32))).ln_1p();
                let key = |c: usize| from[c].ln() - time(c).ln();
                let won = (0..cols).filter(|&c| from[c] > 0.0).fold(None, |best: Option<usize>, c| match best {
                    Some(b) if key(b) >= key(c) => Some(b),
                    _ => Some(c),
                });
                assert_eq!(Some(got.token as usize), won, "{}: row {r} of {rows}x{cols}", g.name());
            }
        }
    }
}

fn bad_shapes_are_errors<B: Backend>(b: &B, _: &Tol) {
    let invalid = |r: saguaro::Result<()>, what: &str| {
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{}: {what}: {:?}", b.name(), r.err());
    };
    let table = b.load_weight(&random_weight(DType::Q8_0, 10, 64, 1).unwrap()).unwrap();
    invalid(b.embed(&table, &[3, 10], 1.0).map(drop), "a token id past the table");
    invalid(b.matmul(&up(b, 2, 32, &[0.0; 64]), &table, None).map(drop), "a matmul of mismatched K");
    for hd in [0, 5, 7] {
        invalid(b.rope(&mut up(b, 2, 14, &[0.0; 28]), &[0, 1], &Rope::plain(hd, 1e4)), &format!("rope with head_dim {hd}"));
    }
    for (rot, factors) in [(8, None), (3, None), (4, Some(&[1.0f32][..]))] {
        let rope = Rope { rotary_dim: rot, factors, ..Rope::plain(7, 1e4) };
        invalid(b.rope(&mut up(b, 2, 14, &[0.0; 28]), &[0, 1], &rope), &format!("rope rotating {rot} of 7"));
    }
    invalid(b.rms_norm(&up(b, 2, 14, &[0.0; 28]), &b.load_weight(&Weight::from_f32(1, 4, &[1.0; 4])).unwrap(), 1e-6).map(drop), "an rms_norm weight that does not divide the row");
    let shape = AttnShape::new(2, 1, 8);
    let mut cache = b.new_cache(1, 4, 8).unwrap();
    let (q, kv) = (up(b, 2, 16, &[0.0; 32]), up(b, 2, 8, &[0.0; 16]));
    let r = b.attention(&q, &kv, &kv, &mut cache, 0, &Batch::causal(&[0, 0], 3), shape);
    assert!(matches!(r, Err(Error::ContextOverflow { .. })), "{}: attention past the cache", b.name());
    // Heads that do not match the cache's KV width, or do not share KV heads evenly.
    for (heads, kv_heads, hd) in [(2, 0, 8), (3, 2, 4), (4, 2, 8)] {
        let (q, kv) = (up(b, 1, heads * hd, &vec![0.0; heads * hd]), up(b, 1, 8, &[0.0; 8]));
        let r = b.attention(&q, &kv, &kv, &mut cache, 0, &Batch::causal(&[0], 0), AttnShape::new(heads, kv_heads, hd));
        invalid(r.map(drop), &format!("attention of {heads} heads over {kv_heads} KV heads of {hd}"));
    }
}

/// The GPU backend with a 4 KiB binding cap splits these weights into 10-40 parts whose rows start
/// at unaligned byte offsets (Q6_K rows are 210 bytes); matmul and embed must not notice.
#[test]
fn gpu_weights_larger_than_one_binding_are_split_by_rows() {
    let Some(g) = util::open_gpu(GpuOptions { max_binding_bytes: Some(4096), ..Default::default() }) else { return };
    for (i, (dtype, rows, k)) in [(DType::Q6K, 61, 256), (DType::Q8_0, 97, 128), (DType::Q4_1, 150, 96), (DType::F16, 40, 90)]
        .into_iter()
        .enumerate()
    {
        let w = random_weight(dtype, rows, k, 40 + i as u64).unwrap();
        let parts = GpuBackend::load_weight(&g, &w).unwrap().parts();
        assert!(parts > 1, "{dtype:?}: expected a split weight, got {parts} part");
        check_matmul(&g, &GPU, &w, None, &[1, 5, 70], 50 + i as u64);
        check_embed(&g, &GPU, &w, &[0, rows as u32 - 1, 17, 17, 33, 1], 1.0);
    }
}

/// A layer's Q, K and V loaded together are one dispatch on the GPU (outs_three.wgsl), with or
/// without biases, where three weights loaded apart are three; where only Q and K share a type,
/// they are one (outs_two.wgsl) and V another; where Q's type differs from K's, three.
#[test]
fn gpu_runs_weights_loaded_together_in_one_dispatch() {
    let Some(g) = util::shared_gpu() else { return };
    let k = 256;
    let host = [64, 16, 16].map(|rows| random_weight(DType::Q8_0, rows, k, rows as u64).unwrap());
    let biases = [64, 16, 16].map(|n| Weight::from_f32(1, n, &vec![0.5; n]));
    let mixed = [DType::Q8_0, DType::Q8_0, DType::Q4_0].map(|d| random_weight(d, 16, k, 3).unwrap());
    let first_apart = [DType::Q4_0, DType::Q8_0, DType::Q8_0].map(|d| random_weight(d, 16, k, 4).unwrap());
    let together = g.load_together(&host.each_ref()).unwrap();
    let together_biases = g.load_together(&biases.each_ref()).unwrap();
    // Other weights: the same bytes would be found already on the GPU, loaded together.
    let apart = [64, 16, 16].map(|rows| g.load_weight(&random_weight(DType::Q8_0, rows, k, rows as u64 + 1).unwrap()).unwrap());
    let apart_biases = biases.each_ref().map(|w| g.load_weight(w).unwrap());
    let mixed = g.load_together(&mixed.each_ref()).unwrap();
    let first_apart = g.load_together(&first_apart.each_ref()).unwrap();
    let x = up(g, 1, k, &vec![1.0; k]);
    let dispatches = |ws: &[saguaro::backend::gpu::Weight], bias: Option<&[saguaro::backend::gpu::Weight]>| {
        let before = g.dispatches_recorded();
        let b = |i: usize| bias.map(|b| &b[i]);
        g.matmuls(&x, [(&ws[0], b(0)), (&ws[1], b(1)), (&ws[2], b(2))]).unwrap();
        g.dispatches_recorded() - before
    };
    assert_eq!(dispatches(&together, None), 1, "loaded together");
    assert_eq!(dispatches(&together, Some(&together_biases)), 1, "loaded together, biases too");
    assert_eq!(dispatches(&together, Some(&apart_biases)), 3, "biases loaded apart");
    assert_eq!(dispatches(&apart, None), 3, "loaded apart");
    assert_eq!(dispatches(&mixed, None), 2, "V of another type");
    assert_eq!(dispatches(&first_apart, None), 3, "Q of another type");
    for outs in ["OUTS=@outs_three", "OUTS=@outs_two"] {
        assert!(g.kernels_built().iter().any(|k| k.contains(outs)), "{outs}: {:?}", g.kernels_built());
    }
}
