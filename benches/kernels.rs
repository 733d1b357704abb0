//! CPU matmul throughput in GB/s of weights read, next to a plain memory read as the physical
//! limit, on all cores. Weights rotate over copies that together exceed the last-level cache, so
//! every call streams its weights from memory as a decode step does.
//!
//! `cargo bench --bench kernels`; a Qwen 1.5B matmul set runs too when its model file is present
//! (`SAGUARO_BENCH_MODEL` names another).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use saguaro::backend::cpu::{matmul, CpuPool};
use saguaro::backend::random_weight;
use saguaro::storage::quant::DType;
use saguaro::storage::Weight;
use saguaro::sampling::Rng;

const STREAM_BYTES: usize = 256 << 20;
const BATCHES: [usize; 4] = [1, 5, 16, 64];

/// Copies of a random `n x k` weight, `STREAM_BYTES` at least.
fn weights(dtype: DType, n: usize, k: usize) -> Vec<Weight> {
    let bytes = dtype.bytes_for(n * k).unwrap();
    (0..STREAM_BYTES.div_ceil(bytes) as u64).map(|c| random_weight(dtype, n, k, c).unwrap()).collect()
}

fn activations(m: usize, k: usize) -> Vec<f32> {
    let mut rng = Rng::new(7);
    (0..m * k).map(|_| 2.0 * rng.uniform() - 1.0).collect()
}

fn memory(c: &mut Criterion, pool: &CpuPool) {
    let buf: Vec<u64> = (0..STREAM_BYTES / 8).map(|i| i as u64).collect();
    let mut g = c.benchmark_group("memory_read");
    g.throughput(Throughput::BytesDecimal(STREAM_BYTES as u64));
    g.bench_function("1_thread", |b| b.iter(|| black_box(&buf).iter().fold(0u64, |s, &v| s.wrapping_add(v))));
    let parts = pool.threads();
    g.bench_function(format!("{parts}_threads"), |b| {
        b.iter(|| {
            let part = buf.len() / parts;
            pool.for_each(parts, |t| {
                black_box(buf[t * part..(t + 1) * part].iter().fold(0u64, |s, &v| s.wrapping_add(v)));
            })
        })
    });
    g.finish();
}

fn kernels(c: &mut Criterion, pool: &CpuPool) {
    for dtype in [DType::Q4K, DType::Q6K, DType::Q8_0, DType::Q5_0] {
        for (n, k) in [(1536, 1536), (8960, 1536)] {
            let ws = weights(dtype, n, k);
            let mut g = c.benchmark_group(format!("matmul_{}_{n}x{k}", dtype.name()));
            g.throughput(Throughput::BytesDecimal(ws[0].data.len() as u64));
            for m in BATCHES {
                let x = activations(m, k);
                let mut out = vec![0.0; m * n];
                let mut next = 0;
                g.bench_function(BenchmarkId::new("m", m), |b| {
                    b.iter(|| {
                        next = (next + 1) % ws.len();
                        matmul(pool, &x, m, &ws[next], &mut out);
                    })
                });
            }
            g.finish();
        }
    }
}

/// Every matmul of one forward of a real model (the layers and the output head), as a decode step
/// (m = 1) and as a 5-token verification (m = 5).
fn model_set(c: &mut Criterion, pool: &CpuPool) {
    let path = std::env::var("SAGUARO_BENCH_MODEL")
        .unwrap_or_else(|_| "models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf".into());
    let Ok(model) = saguaro::model::load::open(std::path::Path::new(&path)) else {
        eprintln!("{path} not found: skipping the model matmul set");
        return;
    };
    let w = &model.weights;
    let mut set: Vec<&Weight> = w
        .layers
        .iter()
        .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
        .collect();
    set.push(&w.output);
    let bytes: usize = set.iter().map(|w| w.data.len()).sum();
    let name = std::path::Path::new(&path).file_stem().unwrap().to_string_lossy().into_owned();
    let mut g = c.benchmark_group(format!("forward_matmuls_{name}"));
    g.throughput(Throughput::BytesDecimal(bytes as u64));
    g.sample_size(10);
    for m in [1, 5] {
        let xs: Vec<Vec<f32>> = set.iter().map(|w| activations(m, w.cols)).collect();
        let mut outs: Vec<Vec<f32>> = set.iter().map(|w| vec![0.0; m * w.rows]).collect();
        g.bench_function(BenchmarkId::new("m", m), |b| {
            b.iter(|| {
                for ((w, x), out) in set.iter().zip(&xs).zip(&mut outs) {
                    matmul(pool, x, m, w, out);
                }
            })
        });
    }
    g.finish();
}

fn all(c: &mut Criterion) {
    let pool = CpuPool::new(0).unwrap();
    memory(c, &pool);
    kernels(c, &pool);
    model_set(c, &pool);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = all
}
criterion_main!(benches);
