//! `saguaro devices` and `saguaro bench-kernels`: what hardware there is and how fast each kernel
//! runs on it.

use std::path::PathBuf;

use clap::Args;
use futures::executor::block_on;
use serde_json::json;

use saguaro::backend::cpu::{CpuBackend, KernelSet};
use saguaro::backend::gpu::{list_adapters, GpuOptions};
use saguaro::backend::{bench_kernels, BenchOptions, KernelBench, WeightsIn};
use saguaro::model::load::open;
use saguaro::storage::quant::DType;
use saguaro::{Error, Result};

use crate::setup::{BackendKind, DeviceArgs};

/// Every GPU adapter wgpu finds, with the limits and features that matter for inference.
pub fn devices() -> Result<()> {
    let adapters = block_on(list_adapters());
    if adapters.is_empty() {
        println!("no GPU adapter found (the CPU backend always works: --backend cpu)");
    }
    for a in adapters {
        println!("{a}");
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let sets: Vec<_> = KernelSet::ALL.into_iter().filter(|s| s.supported()).map(KernelSet::name).collect();
    println!("cpu: {threads} threads available, kernels {} (this CPU runs: {})", KernelSet::best().name(), sets.join(", "));
    Ok(())
}

#[derive(Args)]
pub struct BenchKernelsArgs {
    /// Backend whose kernels to time.
    #[arg(long, value_enum, default_value_t = BackendKind::Gpu)]
    backend: BackendKind,
    #[command(flatten)]
    device: DeviceArgs,
    /// CPU threads for `--backend cpu` (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Take the shapes (d_model, d_ffn, heads, vocab) from this model's config; default: Qwen2.5 0.5B's.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Comma-separated activation rows (batch sizes): 1 is a decode step, K+1 a verification,
    /// the SSD tree batch a few times that, larger ones a prefill.
    #[arg(long, value_delimiter = ',', default_value = "1,5,16,64")]
    rows: Vec<usize>,
    /// Comma-separated weight types to time the matmul in.
    #[arg(long, value_delimiter = ',', default_value = "f16,q8_0,q4_1,q5_0,q4_k,q6_k")]
    dtypes: Vec<DType>,
    /// Cached tokens the attention kernel attends over.
    #[arg(long, default_value_t = 512)]
    context: usize,
    /// Calls per timed batch (after one warm-up call); each kernel and shape is timed in 5 such
    /// batches and the fastest is reported, since other work on the machine only slows one down.
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Each matmul is timed twice: with one copy of its weights, which stays in cache, and with
    /// copies of this many MB in all, cycled so that every call reads its weights from memory as
    /// in a forward of a whole model. 0 leaves out the second timing.
    #[arg(long, default_value_t = 256)]
    working_set_mb: usize,
    /// Comma-separated CPU kernel sets to time one after another in this run, for `--backend cpu`
    /// (default: the best this CPU runs, or `SAGUARO_KERNELS`). `saguaro devices` lists them.
    #[arg(long, value_delimiter = ',', value_parser = parse_kernel_set)]
    kernels: Vec<KernelSet>,
    /// Time the output head's matmul too (vocab rows of d_model): one large matrix, whose
    /// bandwidth is the kernel's streaming of weights apart from the cost of each call.
    #[arg(long)]
    head: bool,
    /// The memory's peak bandwidth in GB/s (an H200's HBM3e: 4800): each line then gives its
    /// GB/s as a share of it.
    #[arg(long)]
    peak_gbs: Option<f64>,
    /// Print one JSON array instead of the table.
    #[arg(long)]
    json: bool,
}

fn parse_kernel_set(name: &str) -> std::result::Result<KernelSet, String> {
    KernelSet::parse(name).ok_or_else(|| {
        let names: Vec<_> = KernelSet::ALL.iter().map(|s| s.name()).collect();
        format!("no kernel set {name:?} (one of {})", names.join(", "))
    })
}

fn options(args: &BenchKernelsArgs) -> Result<BenchOptions> {
    let mut o = BenchOptions {
        context: args.context,
        reps: args.reps,
        rows: args.rows.clone(),
        working_set: args.working_set_mb << 20,
        head: args.head,
        ..Default::default()
    };
    if o.rows.is_empty() || o.rows.contains(&0) || o.reps == 0 {
        return Err(Error::InvalidArgument("--rows and --reps must be positive".into()));
    }
    if args.peak_gbs.is_some_and(|p| !(p.is_finite() && p > 0.0)) {
        return Err(Error::InvalidArgument("--peak-gbs must be a positive number of GB/s".into()));
    }
    o.dtypes = args.dtypes.clone();
    if let Some(path) = &args.model {
        let c = open(path)?.weights.config;
        (o.d_model, o.d_ffn, o.n_heads, o.n_kv_heads, o.head_dim, o.vocab) =
            (c.d_model, c.d_ffn, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size);
    }
    Ok(o)
}

pub fn bench(args: &BenchKernelsArgs) -> Result<()> {
    let opts = options(args)?;
    let runs: Vec<(String, Vec<KernelBench>)> = match args.backend {
        BackendKind::Cpu => {
            let sets = if args.kernels.is_empty() { vec![KernelSet::best()] } else { args.kernels.clone() };
            let mut runs = Vec::new();
            for set in sets {
                let cpu = CpuBackend::new(args.threads)?.with_kernels(set)?;
                runs.push((saguaro::backend::Backend::name(&cpu), block_on(bench_kernels(&cpu, &opts))?));
            }
            runs
        }
        BackendKind::Gpu => {
            if !args.kernels.is_empty() {
                return Err(Error::InvalidArgument("--kernels names CPU kernel sets: use it with --backend cpu".into()));
            }
            // Every path the kernels can take on this adapter, one after the other: with subgroups
            // (where it has them), through workgroup memory alone, and with f16 arithmetic (where
            // it offers it and the options did not already ask for it).
            let opts = BenchOptions { kv_bytes: args.device.kv_cache.bytes(), ..opts };
            let gpu = args.device.open_gpu()?;
            let (subgroups, f16) = (gpu.subgroups(), gpu.f16_offered() && !gpu.shader_f16());
            let mut runs = vec![(saguaro::backend::Backend::name(&gpu), block_on(bench_kernels(&gpu, &opts))?)];
            drop(gpu);
            let others = [(subgroups, GpuOptions { no_subgroups: true, ..Default::default() }), (f16, GpuOptions { shader_f16: true, ..Default::default() })];
            for (_, other) in others.into_iter().filter(|(wanted, _)| *wanted) {
                let gpu = args.device.open_gpu_with(other)?;
                runs.push((saguaro::backend::Backend::name(&gpu), block_on(bench_kernels(&gpu, &opts))?));
            }
            runs
        }
    };
    for (name, rows) in runs {
        report(args.json, args.peak_gbs, &name, &rows);
    }
    Ok(())
}

/// One backend's timings, as a table or as one line of JSON; with `peak` (GB/s), each bandwidth's
/// share of it.
fn report(json: bool, peak: Option<f64>, name: &str, rows: &[KernelBench]) {
    let share = |r: &KernelBench| peak.map(|p| r.gb_per_s / p);
    if json {
        let rows: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "kernel": r.kernel,
                    "shape": r.shape,
                    "weights": r.weights.map(WeightsIn::name),
                    "ms": r.ms,
                    "gb_per_s": r.gb_per_s,
                    "gflop_per_s": r.gflop_per_s,
                    "vs_one_row": r.vs_one_row,
                    "of_peak": share(r),
                })
            })
            .collect();
        println!("{}", json!({"backend": name, "peak_gb_per_s": peak, "kernels": rows}));
    } else {
        println!("{name}");
        for r in rows {
            match share(r) {
                Some(s) => println!("{r} {:>6.1}% of peak", 100.0 * s),
                None => println!("{r}"),
            }
        }
    }
}
