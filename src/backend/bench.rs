//! Kernel timings for `saguaro bench-kernels`, on any backend: each op at model-like shapes on
//! synthetic data, as time per call, effective memory bandwidth and arithmetic rate.

use std::fmt;

use web_time::Instant;

use super::{Activation, AttnShape, Backend, Batch, Draw, Rope, SparseDist, NO_SLOT};
use crate::error::Result;
use crate::sampling::Rng;
use crate::storage::quant::DType;
use crate::storage::{Bytes, Weight as HostWeight};

/// Shapes to time; the defaults are Qwen2.5-0.5B's.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub d_model: usize,
    pub d_ffn: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    /// Cached tokens the attention benchmark attends over.
    pub context: usize,
    /// Bytes the backend's KV cache holds per value (4, or 2 for a GPU's f16 cache): what the
    /// attention's GB/s counts it reading.
    pub kv_bytes: usize,
    /// Activation rows (batch sizes) for the matmul and element-wise kernels.
    pub rows: Vec<usize>,
    pub dtypes: Vec<DType>,
    /// Calls per timed batch; each case is timed in [`BATCHES`] batches (after one warm-up call).
    pub reps: usize,
    /// When non-zero, each matmul is timed a second time with its weights cycled through copies
    /// of at least this many bytes in all, so that every call reads them from memory. That is
    /// how a forward reads them (a model's matrices together outgrow the caches), while a
    /// single copy stays in cache after the warm-up and times the arithmetic alone.
    pub working_set: usize,
    /// Time the output head's matmul too (`vocab` rows of `d_model`): one large matrix, which
    /// measures a kernel's streaming of weights apart from the cost of each call.
    pub head: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            d_model: 896,
            d_ffn: 4864,
            n_heads: 14,
            n_kv_heads: 2,
            head_dim: 64,
            vocab: 151_936,
            context: 512,
            kv_bytes: 4,
            rows: vec![1, 5, 16, 64],
            dtypes: vec![DType::F16, DType::Q8_0, DType::Q4_1, DType::Q5_0, DType::Q4K, DType::Q6K],
            reps: 10,
            working_set: 256 << 20,
            head: false,
        }
    }
}

/// Timed batches per case, of which the fastest is reported: other work on a shared machine only
/// ever slows a batch down, so the fastest is the one that measured the kernel.
pub const BATCHES: usize = 5;

/// Where a matmul's weights were read from while it was timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightsIn {
    Cache,
    Memory,
}

impl WeightsIn {
    pub fn name(self) -> &'static str {
        match self {
            WeightsIn::Cache => "cache",
            WeightsIn::Memory => "memory",
        }
    }
}

#[derive(Clone, Debug)]
pub struct KernelBench {
    pub kernel: String,
    pub shape: String,
    /// Matmuls only: where the weights came from.
    pub weights: Option<WeightsIn>,
    /// Matmuls only: time per call over the same matmul's time at one activation row, the cost
    /// of verifying `m` tokens in units of one decode step.
    pub vs_one_row: Option<f64>,
    /// Milliseconds per call, from recording to completion, in the fastest batch.
    pub ms: f64,
    pub gb_per_s: f64,
    pub gflop_per_s: f64,
}

impl fmt::Display for KernelBench {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let weights = self.weights.map_or("", WeightsIn::name);
        write!(
            f,
            "{:<16} {:<28} {:<7} {:>10.3} ms {:>9.2} GB/s {:>9.2} GFLOP/s",
            self.kernel, self.shape, weights, self.ms, self.gb_per_s, self.gflop_per_s
        )?;
        match self.vs_one_row {
            Some(r) => write!(f, " {r:>6.2}x m=1"),
            None => Ok(()),
        }
    }
}

/// A weight of random values in `dtype`: random quants with small positive scales, so that
/// products stay in the range of real activations.
pub fn random_weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> Result<HostWeight> {
    let mut rng = Values(Rng::new(seed));
    let n = dtype.bytes_for(rows * cols)?;
    let mut bytes: Vec<u8> = match dtype {
        DType::F32 => (0..rows * cols).flat_map(|_| rng.uniform(-1.0, 1.0).to_le_bytes()).collect(),
        DType::F16 => (0..rows * cols).flat_map(|_| half::f16::from_f32(rng.uniform(-1.0, 1.0)).to_le_bytes()).collect(),
        DType::BF16 => (0..rows * cols).flat_map(|_| half::bf16::from_f32(rng.uniform(-1.0, 1.0)).to_le_bytes()).collect(),
        _ => (0..n).map(|_| rng.0.next_u64() as u8).collect(),
    };
    // Byte offsets of each block's f16 scale and min fields, which random bits would make inf/NaN.
    let (scales, mins): (&[usize], &[usize]) = match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => (&[0], &[]),
        DType::Q4_1 | DType::Q5_1 => (&[0], &[2]),
        DType::Q4K | DType::Q5K => (&[0, 2], &[]),
        DType::Q6K => (&[208], &[]),
        DType::F32 | DType::F16 | DType::BF16 => (&[], &[]),
    };
    for block in bytes.chunks_exact_mut(dtype.block_bytes()) {
        for &o in scales {
            let d = half::f16::from_f32(rng.uniform(0.001, 0.02));
            block[o..o + 2].copy_from_slice(&d.to_le_bytes());
        }
        for &o in mins {
            let m = half::f16::from_f32(rng.uniform(-0.05, 0.05));
            block[o..o + 2].copy_from_slice(&m.to_le_bytes());
        }
    }
    HostWeight::new(dtype, rows, cols, Bytes::from_vec(bytes))
}

/// Random values for synthetic weights and activations.
struct Values(Rng);

impl Values {
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.0.uniform()
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform(-1.0, 1.0)).collect()
    }
}

/// Time every kernel at the shapes `opts` gives.
pub async fn bench_kernels<B: Backend>(b: &B, opts: &BenchOptions) -> Result<Vec<KernelBench>> {
    let o = opts;
    let mut rng = Values(Rng::new(7));
    let mut out = Vec::new();
    let reps = o.reps.max(1);

    // `$op` runs with `$i`, the call's index (the warm-up is call 0).
    macro_rules! time {
        ($kernel:expr, $shape:expr, $bytes:expr, $flops:expr, |$i:ident| $op:expr) => {{
            let $i = 0usize;
            $op;
            b.sync().await?;
            let mut s = f64::INFINITY;
            for _ in 0..BATCHES {
                let t0 = Instant::now();
                for $i in 1..=reps {
                    $op;
                }
                b.sync().await?;
                s = s.min(t0.elapsed().as_secs_f64() / reps as f64);
            }
            out.push(KernelBench {
                kernel: $kernel.to_string(),
                shape: $shape,
                weights: None,
                vs_one_row: None,
                ms: s * 1e3,
                gb_per_s: $bytes as f64 / s / 1e9,
                gflop_per_s: $flops as f64 / s / 1e9,
            });
        }};
        ($kernel:expr, $shape:expr, $bytes:expr, $flops:expr, $op:expr) => {
            time!($kernel, $shape, $bytes, $flops, |_i| $op)
        };
    }

    let (d, f) = (o.d_model, o.d_ffn);
    for &dtype in &o.dtypes {
        // The FFN down projection (K = d_ffn, a whole number of 256-value K-quant blocks where
        // d_model need not be), whose batch of activations outgrows L1, and the up projection
        // (K = d_model) where its K is whole blocks too; with `head`, the output head likewise.
        let head = o.head.then_some((o.vocab, d));
        for (i, (n, k)) in [(d, f), (f, d)].into_iter().chain(head).enumerate() {
            if i > 0 && k % dtype.block_size() != 0 {
                continue;
            }
            let host = random_weight(dtype, n, k, 1)?;
            let w = b.load_weight(&host)?;
            let copies = match o.working_set {
                0 => Vec::new(),
                mb => (0..mb.div_ceil(host.data.len()).max(2))
                    .map(|_| b.load_weight(&HostWeight::new(dtype, n, k, Bytes::from_vec(host.data.as_slice().to_vec()))?))
                    .collect::<Result<Vec<_>>>()?,
            };
            let placements = [(WeightsIn::Cache, std::slice::from_ref(&w)), (WeightsIn::Memory, &copies[..])];
            for (weights, ws) in placements.into_iter().filter(|(_, ws)| !ws.is_empty()) {
                let first = out.len();
                for &m in &o.rows {
                    let x = b.upload(m, k, &rng.vec(m * k))?;
                    let bytes = host.data.len() + 4 * m * (n + k);
                    time!(format!("matmul {}", dtype.name()), format!("m={m} n={n} k={k}"), bytes, 2 * m * n * k, |i| {
                        b.matmul(&x, &ws[i % ws.len()], None)?;
                    });
                }
                let one_row = o.rows.iter().position(|&m| m == 1).map(|i| out[first + i].ms);
                for r in &mut out[first..] {
                    r.weights = Some(weights);
                    r.vs_one_row = one_row.map(|ms| r.ms / ms);
                }
            }
            if i == 0 && dtype == o.dtypes[0] {
                let ids: Vec<u32> = (0..o.rows.iter().copied().max().unwrap_or(1) as u32).collect();
                let bytes = ids.len() * (host.row_bytes() + 4 * f);
                time!(format!("embed {}", dtype.name()), format!("m={} d={f}", ids.len()), bytes, 0, {
                    b.embed(&w, &ids, 1.0)?;
                });
            }
        }
    }

    let norm_w = b.load_weight(&HostWeight::from_f32(1, d, &rng.vec(d)))?;
    let q_dim = o.n_heads * o.head_dim;
    let kv_dim = o.n_kv_heads * o.head_dim;
    for &m in &o.rows {
        let x = b.upload(m, d, &rng.vec(m * d))?;
        time!("rms_norm", format!("m={m} d={d}"), 8 * m * d, 4 * m * d, {
            b.rms_norm(&x, &norm_w, 1e-6)?;
        });
        let mut q = b.upload(m, q_dim, &rng.vec(m * q_dim))?;
        let pos: Vec<u32> = (0..m as u32).collect();
        time!("rope", format!("m={m} cols={q_dim}"), 8 * m * q_dim, 3 * m * q_dim, {
            b.rope(&mut q, &pos, &Rope::plain(o.head_dim, 1e6))?;
        });
        let (g, u) = (b.upload(m, f, &rng.vec(m * f))?, b.upload(m, f, &rng.vec(m * f))?);
        time!("glu (silu)", format!("m={m} cols={f}"), 12 * m * f, 5 * m * f, {
            b.glu(&g, &u, Activation::Silu)?;
        });
        let mut a = b.upload(m, d, &rng.vec(m * d))?;
        time!("add", format!("m={m} cols={d}"), 12 * m * d, m * d, {
            b.add_assign(&mut a, &x)?;
        });
        let logits = b.upload(m, o.vocab, &rng.vec(m * o.vocab))?;
        time!("argmax", format!("m={m} cols={}", o.vocab), 4 * m * o.vocab, 0, {
            b.argmax(&logits).await?;
        });
        // What a sampling draft reads back of each row (SpecConfig's default draft candidates).
        let at = vec![NO_SLOT; m];
        time!("top_k 64", format!("m={m} cols={}", o.vocab), 4 * m * o.vocab, 0, {
            b.top_k(&logits, 64, 1.0, &at).await?;
        });
        // Sampled verification over the whole vocabulary: the rows themselves back, or a token drawn
        // from its residual after a draft of 64 candidates (and a probability) back.
        time!("read rows", format!("m={m} cols={}", o.vocab), 4 * m * o.vocab, 0, {
            b.read(&logits).await?;
        });
        let mut q = vec![0.0; o.vocab];
        q.iter_mut().step_by(o.vocab.div_ceil(64)).for_each(|x| *x = 1.0 / 64.0);
        let draw = Draw { temperature: 1.0, seed: 1, at: vec![0; m], minus: vec![SparseDist::of(&q); m] };
        time!("draw", format!("m={m} cols={}", o.vocab), 4 * m * o.vocab, 0, {
            b.draw(&logits, &draw).await?;
        });
        // m new tokens after `context` cached ones, causally.
        let mut cache = b.new_cache(1, o.context + m, kv_dim)?;
        let batch = Batch::causal(&vec![0; m], o.context);
        let shape = AttnShape::new(o.n_heads, o.n_kv_heads, o.head_dim);
        let qa = b.upload(m, q_dim, &rng.vec(m * q_dim))?;
        let (ka, va) = (b.upload(m, kv_dim, &rng.vec(m * kv_dim))?, b.upload(m, kv_dim, &rng.vec(m * kv_dim))?);
        let slots = m * o.context + m * (m + 1) / 2;
        time!(
            "attention",
            format!("m={m} ctx={} heads={}/{}", o.context, o.n_heads, o.n_kv_heads),
            4 * m * q_dim * 2 + o.kv_bytes * 2 * slots * kv_dim,
            4 * slots * q_dim,
            {
                b.attention(&qa, &ka, &va, &mut cache, 0, &batch, shape)?;
            }
        );
    }
    Ok(out)
}
