//! Every GPU kernel against the CPU backend (the reference) on random inputs: M = 1, M = 5 (a
//! K+1 verification), tree batches with extra-slot masks, sizes that are not multiples of the
//! workgroup size, and every weight storage type. Skips (and says so) only where no GPU adapter
//! exists at all and `SAGUARO_REQUIRE_GPU=1` is not set.
//!
//! Tolerances: decoding weights and gathering/adding values is exact, so embed, select_rows, add
//! and argmax must match to the bit (up to one rounding where the GPU fuses a multiply-add).
//! Reductions run in a different order than on the CPU, so matmul is checked to
//! 1e-5 * sum|x_k w_k| per output, and norms, RoPE, attention and SwiGLU to a relative 1e-5.

use std::sync::OnceLock;

use futures::executor::block_on;
use saguaro::backend::cpu::{CpuBackend, Tensor as CpuTensor};
use saguaro::backend::gpu::{GpuBackend, GpuOptions, Tensor as GpuTensor};
use saguaro::backend::random_weight;
use saguaro::backend::{AttnShape, Backend, Batch, Mask, NO_SLOT};
use saguaro::model::quant::DType;
use saguaro::model::weights::Weight;
use saguaro::Error;
use util::rand::TestRng;

mod util;


fn open(opts: GpuOptions) -> Option<GpuBackend> {
    if !util::gpu_available() {
        return None;
    }
    Some(block_on(GpuBackend::new(opts)).expect("opening the GPU"))
}

/// One device for the whole binary (tests share it from several threads, so it must be Sync).
fn gpu() -> Option<&'static GpuBackend> {
    static GPU: OnceLock<Option<GpuBackend>> = OnceLock::new();
    GPU.get_or_init(|| open(GpuOptions::default())).as_ref()
}

fn cpu() -> &'static CpuBackend {
    static CPU: OnceLock<CpuBackend> = OnceLock::new();
    CPU.get_or_init(|| CpuBackend::new(2).unwrap())
}


fn pair(g: &GpuBackend, rows: usize, cols: usize, data: Vec<f32>) -> (CpuTensor, GpuTensor) {
    (CpuTensor::new(rows, cols, data.clone()), g.upload(rows, cols, &data).unwrap())
}

fn read(g: &GpuBackend, t: &GpuTensor) -> Vec<f32> {
    block_on(g.read(t)).unwrap()
}

/// |got - want| <= tol[i] elementwise.
fn assert_close(got: &[f32], want: &[f32], tol: impl Fn(usize) -> f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol(i), "{what}: element {i}: gpu {g}, cpu {w} (tolerance {})", tol(i));
    }
}

fn rel(want: &[f32], r: f32) -> impl Fn(usize) -> f32 + '_ {
    move |i| r * (1.0 + want[i].abs())
}

/// matmul of random activations against `w` for each M, checked against the CPU backend.
fn check_matmul(g: &GpuBackend, w: &Weight, bias: Option<&Weight>, ms: &[usize], seed: u64) {
    let gw = g.load_weight(w).unwrap();
    let gb = bias.map(|b| g.load_weight(b).unwrap());
    let dense = w.to_f32();
    let (n, k) = (w.rows, w.cols);
    let mut rng = TestRng::new(seed);
    for &m in ms {
        let (cx, gx) = pair(g, m, k, rng.vec(m * k));
        let want = cpu().matmul(&cx, w, bias).unwrap();
        let got = g.matmul(&gx, &gw, gb.as_ref()).unwrap();
        assert_eq!((got.rows(), got.cols()), (m, n));
        // Error grows with the magnitudes summed, not with the (possibly cancelling) result.
        let scale: Vec<f32> = (0..m * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                (0..k).map(|j| (cx.data[r * k + j] * dense[c * k + j]).abs()).sum::<f32>()
            })
            .collect();
        let what = format!("matmul {:?} m={m} n={n} k={k} bias={} parts={}", w.dtype, bias.is_some(), gw.parts());
        assert_close(&read(g, &got), &want.data, |i| 1e-5 * scale[i] + 1e-6, &what);
    }
}

#[test]
fn matmul_every_dtype_and_batch_size() {
    let Some(g) = gpu() else { return };
    for (i, &dtype) in DType::ALL.iter().enumerate() {
        // Rows not a multiple of any tile; K a few blocks, and odd for float types.
        let k = match dtype.block_size() {
            1 => 45,
            32 => 96,
            _ => 512,
        };
        let w = random_weight(dtype, 37, k, i as u64).unwrap();
        // 1 = decode, 5 = K+1 verification, 33 = a wide tree step, 64 = the largest split-K
        // batch, 70 = the tiled prefill kernel with partial tiles.
        check_matmul(g, &w, None, &[1, 2, 5, 33, 64, 70], 100 + i as u64);
    }
}

#[test]
fn matmul_with_bias_and_large_rows() {
    let Some(g) = gpu() else { return };
    let mut rng = TestRng::new(5);
    let w = random_weight(DType::Q8_0, 131, 160, 3).unwrap();
    let b = Weight::from_f32(1, 131, &rng.vec(131));
    check_matmul(g, &w, Some(&b), &[1, 5, 100], 6);
    // A Qwen-like projection: K larger than a workgroup's first sweep.
    let w = random_weight(DType::Q4K, 64, 1536, 4).unwrap();
    check_matmul(g, &w, None, &[1, 3], 7);
}

#[test]
fn weights_larger_than_one_binding_are_split_by_rows() {
    // A 4 KiB binding cap splits these weights into 10-40 parts whose rows start at unaligned
    // byte offsets (Q6_K rows are 210 bytes).
    let Some(g) = open(GpuOptions { max_binding_bytes: Some(4096), ..Default::default() }) else { return };
    for (i, (dtype, rows, k)) in [(DType::Q6K, 61, 256), (DType::Q8_0, 97, 128), (DType::Q4_1, 150, 96), (DType::F16, 40, 90)]
        .into_iter()
        .enumerate()
    {
        let w = random_weight(dtype, rows, k, 40 + i as u64).unwrap();
        let parts = g.load_weight(&w).unwrap().parts();
        assert!(parts > 1, "{dtype:?}: expected a split weight, got {parts} part");
        check_matmul(&g, &w, None, &[1, 5, 70], 50 + i as u64);
        check_embed(&g, &w, &[0, rows as u32 - 1, 17, 17, 33, 1], &format!("split {dtype:?}"));
    }
}

fn check_embed(g: &GpuBackend, table: &Weight, ids: &[u32], what: &str) {
    let want = cpu().embed(table, ids).unwrap();
    let got = g.embed(&g.load_weight(table).unwrap(), ids).unwrap();
    assert_close(&read(g, &got), &want.data, rel(&want.data, 1e-6), &format!("embed {what}"));
}

#[test]
fn embed_every_dtype() {
    let Some(g) = gpu() else { return };
    for (i, &dtype) in DType::ALL.iter().enumerate() {
        let k = if dtype.block_size() == 1 { 27 } else { 256 };
        let table = random_weight(dtype, 50, k, 200 + i as u64).unwrap();
        check_embed(g, &table, &[0, 49, 7, 7, 21], &format!("{dtype:?}"));
    }
}

#[test]
fn rms_norm_matches() {
    let Some(g) = gpu() else { return };
    let mut rng = TestRng::new(9);
    for (rows, cols) in [(1, 896), (5, 33), (3, 1), (70, 130)] {
        let (cx, gx) = pair(g, rows, cols, rng.vec(rows * cols));
        let w = Weight::from_f32(1, cols, &rng.vec(cols));
        let want = cpu().rms_norm(&cx, &w, 1e-6).unwrap();
        let got = g.rms_norm(&gx, &g.load_weight(&w).unwrap(), 1e-6).unwrap();
        assert_close(&read(g, &got), &want.data, rel(&want.data, 1e-5), &format!("rms_norm {rows}x{cols}"));
    }
}

#[test]
fn rope_matches_at_explicit_positions() {
    let Some(g) = gpu() else { return };
    let mut rng = TestRng::new(11);
    for (rows, heads, hd, theta) in [(1, 14, 64, 1e6), (5, 2, 64, 1e4), (7, 3, 6, 1e4), (70, 4, 128, 1e6)] {
        let positions: Vec<u32> = (0..rows).map(|_| rng.below(5000)).collect();
        let (mut cx, mut gx) = pair(g, rows, heads * hd, rng.vec(rows * heads * hd));
        cpu().rope(&mut cx, &positions, hd, theta).unwrap();
        g.rope(&mut gx, &positions, hd, theta).unwrap();
        assert_close(&read(g, &gx), &cx.data, rel(&cx.data, 1e-5), &format!("rope {rows}x{heads}x{hd}"));
    }
}

#[test]
fn swiglu_add_and_select_rows_match() {
    let Some(g) = gpu() else { return };
    let mut rng = TestRng::new(13);
    let (rows, cols) = (5, 300);
    let (ca, ga) = pair(g, rows, cols, rng.vec(rows * cols).iter().map(|x| 8.0 * x).collect());
    let (cb, gb) = pair(g, rows, cols, rng.vec(rows * cols));
    let want = cpu().swiglu(&ca, &cb).unwrap();
    let got = g.swiglu(&ga, &gb).unwrap();
    assert_close(&read(g, &got), &want.data, rel(&want.data, 1e-5), "swiglu");

    let (mut cx, mut gx) = (ca.clone(), g.upload(rows, cols, &ca.data).unwrap());
    cpu().add_assign(&mut cx, &cb).unwrap();
    g.add_assign(&mut gx, &gb).unwrap();
    assert_close(&read(g, &gx), &cx.data, |_| 0.0, "add_assign");

    let rows_sel = [4, 0, 0, 2];
    let want = cpu().select_rows(&cx, &rows_sel).unwrap();
    let got = g.select_rows(&gx, &rows_sel).unwrap();
    assert_close(&read(g, &got), &want.data, |_| 0.0, "select_rows");
}

#[test]
fn argmax_matches_with_ties() {
    let Some(g) = gpu() else { return };
    let mut rng = TestRng::new(17);
    let (rows, cols) = (6, 151_936);
    let mut data = rng.vec(rows * cols);
    // Row 1: a tie between two maxima far apart; row 2: all equal; row 3: max in the last column.
    data[cols + 5] = 3.0;
    data[cols + 100_000] = 3.0;
    data[2 * cols..3 * cols].fill(0.5);
    data[4 * cols - 1] = 9.0;
    let (cx, gx) = pair(g, rows, cols, data);
    let want = block_on(cpu().argmax(&cx)).unwrap();
    assert_eq!(block_on(g.argmax(&gx)).unwrap(), want);
    assert_eq!(&want[1..4], &[5, 0, cols as u32 - 1]);
    let small = pair(g, 3, 1, vec![1.0, -2.0, 0.0]);
    assert_eq!(block_on(g.argmax(&small.1)).unwrap(), vec![0, 0, 0]);
}

/// Runs the same attention calls on both backends, cache contents carrying over between calls.
struct AttnCase {
    shape: AttnShape,
    cpu_cache: saguaro::backend::cpu::Cache,
    gpu_cache: saguaro::backend::gpu::Cache,
    rng: TestRng,
}

impl AttnCase {
    fn new(g: &GpuBackend, shape: AttnShape, capacity: usize, seed: u64) -> Self {
        let kv = shape.n_kv_heads * shape.head_dim;
        AttnCase {
            shape,
            cpu_cache: cpu().new_cache(2, capacity, kv).unwrap(),
            gpu_cache: g.new_cache(2, capacity, kv).unwrap(),
            rng: TestRng::new(seed),
        }
    }

    fn run(&mut self, g: &GpuBackend, batch: &Batch, what: &str) {
        let s = self.shape;
        let m = batch.len();
        let (qd, kvd) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
        let (cq, gq) = pair(g, m, qd, self.rng.vec(m * qd));
        let (ck, gk) = pair(g, m, kvd, self.rng.vec(m * kvd));
        let (cv, gv) = pair(g, m, kvd, self.rng.vec(m * kvd));
        // Layer 1, so that a cache indexing slip into layer 0 shows.
        let want = cpu().attention(&cq, &ck, &cv, &mut self.cpu_cache, 1, batch, s).unwrap();
        let got = g.attention(&gq, &gk, &gv, &mut self.gpu_cache, 1, batch, s).unwrap();
        assert_close(&read(g, &got), &want.data, rel(&want.data, 1e-5), what);
    }
}

#[test]
fn attention_causal_prefill_decode_and_verify() {
    let Some(g) = gpu() else { return };
    for (i, shape) in [
        AttnShape { n_heads: 14, n_kv_heads: 2, head_dim: 64 },
        AttnShape { n_heads: 3, n_kv_heads: 3, head_dim: 80 },
        AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: 6 },
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = AttnCase::new(g, shape, 200, 20 + i as u64);
        let tokens = vec![0; 150];
        // Prefill past several 64-slot chunks, then decode one token, then verify K+1 = 5.
        c.run(g, &Batch::causal(&tokens, 0), &format!("prefill 150 {shape:?}"));
        c.run(g, &Batch::causal(&[0], 150), &format!("decode at 150 {shape:?}"));
        c.run(g, &Batch::causal(&[0; 5], 151), &format!("verify 5 at 151 {shape:?}"));
        // Rollback: overwrite slots 152.. with a new continuation.
        c.run(g, &Batch::causal(&[0; 3], 152), &format!("rewrite 3 at 152 {shape:?}"));
    }
}

#[test]
fn attention_tree_masks_with_extra_slots() {
    let Some(g) = gpu() else { return };
    let shape = AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: 64 };
    let mut c = AttnCase::new(g, shape, 128, 31);
    c.run(g, &Batch::causal(&[0; 70], 0), "prefix of 70");
    // A tree of 5 nodes in slots 80..85 over the 70-token prefix: 0 -> {1, 2}, 1 -> 3, 2 -> 4.
    // Each node attends the prefix (some only part of it), its ancestors and itself, padded with
    // NO_SLOT; one row attends only extras.
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
        mask: Mask { prefix: vec![70, 70, 65, 0, 70], extra_stride: stride, extra },
    };
    c.run(g, &batch, "tree step");
}

#[test]
fn bad_inputs_are_errors() {
    let Some(g) = gpu() else { return };
    let table = g.load_weight(&random_weight(DType::Q8_0, 10, 64, 1).unwrap()).unwrap();
    assert!(matches!(g.embed(&table, &[3, 10]), Err(Error::InvalidArgument(_))));
    let x = g.upload(2, 32, &[0.0; 64]).unwrap();
    assert!(matches!(g.matmul(&x, &table, None), Err(Error::InvalidArgument(_))));
    let shape = AttnShape { n_heads: 2, n_kv_heads: 1, head_dim: 8 };
    let mut cache = g.new_cache(1, 4, 8).unwrap();
    let (q, kv) = (g.upload(2, 16, &[0.0; 32]).unwrap(), g.upload(2, 8, &[0.0; 16]).unwrap());
    let r = g.attention(&q, &kv, &kv, &mut cache, 0, &Batch::causal(&[0, 0], 3), shape);
    assert!(matches!(r, Err(Error::ContextOverflow { .. })));
    // More memory than one binding (or the device) holds.
    assert!(matches!(g.new_cache(1, 1 << 30, 1024), Err(Error::OutOfMemory(_))));
}

#[test]
fn a_lost_device_is_an_error_and_a_new_one_works() {
    let Some(g) = open(GpuOptions::default()) else { return };
    let w = g.load_weight(&random_weight(DType::Q4K, 8, 256, 5).unwrap()).unwrap();
    let x = g.upload(1, 256, &[0.5; 256]).unwrap();
    g.release();
    let lost = |r: Result<Vec<f32>, Error>| match r {
        Err(Error::DeviceLost(msg)) => assert!(msg.contains("released"), "says what happened: {msg}"),
        other => panic!("expected DeviceLost, got {other:?}"),
    };
    lost(g.matmul(&x, &w, None).and_then(|y| block_on(g.read(&y))));
    lost(block_on(g.read(&x)));
    let fresh = open(GpuOptions::default()).unwrap();
    let (w, x) = (fresh.load_weight(&random_weight(DType::Q4K, 8, 256, 5).unwrap()).unwrap(), fresh.upload(1, 256, &[0.5; 256]).unwrap());
    let y = block_on(fresh.read(&fresh.matmul(&x, &w, None).unwrap())).unwrap();
    assert_eq!(y.len(), 8);
    assert!(y.iter().all(|v| v.is_finite()));
}
