//! `saguaro synth`: a model file of a real model's shape with random weights, for timing where no
//! model can be fetched.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use clap::Args;
use web_time::Instant;

use saguaro::model::synth::{shape, Quant, Shape, Synth};
use saguaro::{Error, Result};

#[derive(Args)]
pub struct SynthArgs {
    /// The model's shape: qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b (hyperparameters,
    /// tensors and vocabulary size of Qwen 2.5), or tiny (for tests).
    #[arg(long, value_parser = shape)]
    shape: &'static Shape,
    /// Storage type of the matrices: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q6_k, or q4_k_m
    /// (llama.cpp's mix: Q4_K, with Q6_K for the output head and for attn_v and ffn_down in half
    /// the layers). K-quant rows that are not whole 256-value blocks take q4_1 (q6_k: q8_0).
    #[arg(long, default_value = "q4_k_m")]
    dtype: Quant,
    /// Write only the first N layers (the full model's first N, tensor for tensor).
    #[arg(long, allow_negative_numbers = true)]
    layers: Option<usize>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The GGUF file to write.
    #[arg(long)]
    out: PathBuf,
}

pub fn synth(args: &SynthArgs) -> Result<()> {
    let t = Instant::now();
    let s = Synth { shape: args.shape, quant: args.dtype, layers: args.layers, seed: args.seed };
    let model = s.model()?;
    // Written beside the target and renamed into place, so a failed run leaves no partial file.
    let partial = PathBuf::from(format!("{}.partial", args.out.display()));
    let io = |source| Error::Io { path: partial.display().to_string(), source };
    let written = File::create(&partial).map_err(io).and_then(|f| {
        let mut out = BufWriter::with_capacity(1 << 20, f);
        model.write_to(&mut out).and_then(|()| out.flush()).map_err(io)
    });
    let renamed = written.and_then(|()| {
        let path = args.out.display().to_string();
        std::fs::rename(&partial, &args.out).map_err(|source| Error::Io { path, source })
    });
    if let Err(e) = renamed {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    let bytes = std::fs::metadata(&args.out).map_or(0, |m| m.len());
    let sh = args.shape;
    eprintln!(
        "wrote {}: {} ({} of {} layers, d_model {}, {}/{} heads, d_ffn {}, vocab {}), {}, {:.1} MB in {:.1} s",
        args.out.display(),
        sh.name,
        s.layers(),
        sh.n_layers,
        sh.d_model,
        sh.n_heads,
        sh.n_kv_heads,
        sh.d_ffn,
        sh.vocab,
        args.dtype,
        bytes as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
