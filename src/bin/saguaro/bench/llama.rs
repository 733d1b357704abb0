//! llama.cpp beside us: its `llama-bench` on the same model file and thread count, alternated
//! with our AR decoding (AR, llama, AR, llama, ...) so that both see the same load on a shared
//! machine, reported as ranges over the alternations.
//!
//! llama-bench's decode test (`-n N`) generates N tokens one at a time from an empty context; its
//! prompt test (`-p K+1`) runs one batch of K+1 tokens, which gives the cost of a verification in
//! its decodes (it computes the logits of the batch's last position only, a verification those of
//! every position). Our own verification's cost, a forward of K+1 tokens in our decodes with
//! every position's argmax read back, is timed in each alternation beside it.
//!
//! llama-bench runs where our target does: on the CPU with no device (`-dev none`), since by
//! default it offloads every layer to whatever GPU its build finds, which would set a CPU run of
//! ours beside a GPU run of its; on the GPU with every layer offloaded to one device (`-ngl 99
//! -sm none`: by default it splits the layers over every GPU it finds, where we run on one).

use std::path::Path;
use std::process::Command;

use futures::executor::block_on;
use serde::Serialize;

use saguaro::decode::Mode;
use saguaro::engine::{Engine, GenerateOptions, Prompt};
use saguaro::{Error, Result};

pub struct Setup<'a> {
    pub binary: &'a Path,
    pub model: &'a Path,
    /// 0: every core, as our CPU backend takes it.
    pub threads: usize,
    pub tokens: usize,
    pub reps: usize,
    /// The K whose verification batch (K + 1 tokens) to time.
    pub ks: &'a [usize],
    /// Whether our target runs on the GPU.
    pub gpu: bool,
}

/// A measurement repeated: its median and range.
#[derive(Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub samples: Vec<f64>,
}

impl Spread {
    fn of(samples: Vec<f64>) -> Spread {
        let mut s = samples.clone();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
        Spread { median, min: s[0], max: s[n - 1], samples }
    }
}

#[derive(Serialize)]
pub struct BatchRatio {
    pub k: usize,
    /// A batch of K + 1 tokens over one decode, both llama.cpp's.
    pub verify_over_decode: Spread,
    /// Our verification of K + 1 tokens over our decode, timed in the same alternations.
    pub saguaro_verify_over_decode: Spread,
}

#[derive(Serialize)]
pub struct Report {
    pub threads: usize,
    pub tokens: usize,
    pub reps: usize,
    pub decode_tokens_per_s: Spread,
    /// Our AR decoding of the first prompt, in the alternations.
    pub ar_tokens_per_s: Spread,
    /// Our AR over llama.cpp, alternation by alternation.
    pub ar_over_llama: Spread,
    pub verify: Vec<BatchRatio>,
}

/// One llama-bench call: decode tokens/s and ms per batch of each size asked for.
struct Call {
    decode_tokens_per_s: f64,
    batch_ms: Vec<(usize, f64)>,
}

fn bench_once(s: &Setup, threads: usize, batches: &[usize]) -> Result<Call> {
    let prompt_sizes = batches.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new(s.binary);
    cmd.arg("-m").arg(s.model);
    cmd.args(["-t", &threads.to_string(), "-p", &prompt_sizes, "-n", &s.tokens.to_string(), "-r", "1", "-o", "json"]);
    cmd.args(placement(s.gpu));
    let out = cmd.output().map_err(|source| Error::Io { path: s.binary.display().to_string(), source })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        return Err(Error::InvalidArgument(format!(
            "--llama-bench: {} failed ({}): {}",
            s.binary.display(),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        )));
    }
    parse(&String::from_utf8_lossy(&out.stdout), s.tokens)
}

/// llama-bench's arguments that put the model where ours runs (see the module doc).
fn placement(gpu: bool) -> &'static [&'static str] {
    match gpu {
        true => &["-ngl", "99", "-sm", "none"],
        false => &["-dev", "none"],
    }
}

/// Read llama-bench's JSON: an array of tests, each with n_prompt, n_gen and avg_ns.
fn parse(text: &str, tokens: usize) -> Result<Call> {
    let bad = |why: &str| Error::InvalidArgument(format!("--llama-bench: unexpected output ({why}): {text}"));
    let tests: Vec<serde_json::Value> = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
    let field = |t: &serde_json::Value, name: &str| t.get(name).and_then(|v| v.as_f64()).ok_or_else(|| bad(name));
    let mut decode = None;
    let mut batch_ms = Vec::new();
    for t in &tests {
        let (p, g, ns) = (field(t, "n_prompt")?, field(t, "n_gen")?, field(t, "avg_ns")?);
        if ns <= 0.0 {
            return Err(bad("a test took no time"));
        }
        match (p as usize, g as usize) {
            (0, n) if n == tokens => decode = Some(n as f64 * 1e9 / ns),
            (b, 0) => batch_ms.push((b, ns / 1e6)),
            _ => return Err(bad("a test that was not asked for")),
        }
    }
    let decode_tokens_per_s = decode.ok_or_else(|| bad("no decode test"))?;
    Ok(Call { decode_tokens_per_s, batch_ms })
}

/// Alternate our AR decoding of `prompt` with llama-bench, `s.reps` times each.
pub fn compare(s: &Setup, engine: &mut Engine, prompt: &Prompt) -> Result<Report> {
    if !s.model.is_file() {
        return Err(Error::InvalidArgument(format!(
            "--llama-bench needs the target as a .gguf file, got {}",
            s.model.display()
        )));
    }
    let threads = match s.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let batches: Vec<usize> = s.ks.iter().map(|k| k + 1).collect();
    let opts = GenerateOptions { mode: Some(Mode::Ar), max_tokens: s.tokens, ..GenerateOptions::default() };
    let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), vec![Vec::new(); batches.len()]);
    let mut our_ratios = vec![Vec::new(); batches.len()];
    let sizes: Vec<usize> = std::iter::once(1).chain(batches.iter().copied()).collect();
    for rep in 0..s.reps {
        let g = block_on(engine.generate(prompt, &opts, &mut |_, _| true))?;
        // The weights are warm from the generation, so the faster of two rounds is enough.
        let ms = block_on(engine.time_target_forwards(&sizes, 2))?;
        for (r, t) in our_ratios.iter_mut().zip(&ms[1..]) {
            r.push(t / ms[0]);
        }
        let call = bench_once(s, threads, &batches)?;
        eprintln!(
            "alternation {rep}: saguaro AR {:.1} tok/s, llama.cpp {:.1} tok/s",
            g.stats.tokens_per_s, call.decode_tokens_per_s
        );
        ours.push(g.stats.tokens_per_s);
        theirs.push(call.decode_tokens_per_s);
        let decode_ms = 1000.0 / call.decode_tokens_per_s;
        for (i, &b) in batches.iter().enumerate() {
            let ms = call.batch_ms.iter().find(|&&(n, _)| n == b).map(|&(_, ms)| ms);
            ratios[i].push(ms.ok_or_else(|| Error::InvalidArgument(format!("--llama-bench: no batch of {b}")))? / decode_ms);
        }
    }
    let ar_over_llama = ours.iter().zip(&theirs).map(|(a, l)| a / l).collect();
    Ok(Report {
        threads,
        tokens: s.tokens,
        reps: s.reps,
        decode_tokens_per_s: Spread::of(theirs),
        ar_tokens_per_s: Spread::of(ours),
        ar_over_llama: Spread::of(ar_over_llama),
        verify: s
            .ks
            .iter()
            .zip(ratios.into_iter().zip(our_ratios))
            .map(|(&k, (r, o))| BatchRatio { k, verify_over_decode: Spread::of(r), saguaro_verify_over_decode: Spread::of(o) })
            .collect(),
    })
}

pub fn print(r: &Report) {
    let s = |x: &Spread, p: usize| format!("{:.p$} ({:.p$}-{:.p$})", x.median, x.min, x.max);
    println!();
    println!(
        "llama.cpp (llama-bench, {} threads, {} tokens; median (range) of {} alternations with saguaro AR on the first prompt):",
        r.threads, r.tokens, r.reps
    );
    println!(
        "  decode tok/s {}   saguaro AR tok/s {}   AR/llama.cpp {}",
        s(&r.decode_tokens_per_s, 1),
        s(&r.ar_tokens_per_s, 1),
        s(&r.ar_over_llama, 2)
    );
    let verify: Vec<String> = r.verify.iter().map(|v| format!("K={}: {}", v.k, s(&v.verify_over_decode, 2))).collect();
    println!("  a batch of K+1 in its decodes: {}", verify.join(", "));
    let ours: Vec<String> = r.verify.iter().map(|v| format!("K={}: {}", v.k, s(&v.saguaro_verify_over_decode, 2))).collect();
    println!("  saguaro's verification of K+1 (every position's logits) in its decodes: {}", ours.join(", "));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_decode_and_batch_tests() {
        let text = r#"[{"n_prompt": 5, "n_gen": 0, "avg_ns": 200000000, "avg_ts": 25.0},
                      {"n_prompt": 0, "n_gen": 32, "avg_ns": 3200000000, "avg_ts": 10.0}]"#;
        let c = parse(text, 32).unwrap();
        assert!((c.decode_tokens_per_s - 10.0).abs() < 1e-9);
        assert_eq!(c.batch_ms, vec![(5, 200.0)]);
        assert!(parse("[]", 32).is_err(), "no decode test");
        assert!(parse("not json", 32).is_err());
        assert!(parse(r#"[{"n_prompt": 0, "n_gen": 32}]"#, 32).is_err(), "no time");
    }

    #[test]
    fn runs_where_our_target_runs() {
        assert_eq!(placement(false), ["-dev", "none"], "a CPU comparison must keep llama.cpp off every GPU");
        assert_eq!(placement(true), ["-ngl", "99", "-sm", "none"], "every layer on one GPU, as ours");
    }

    #[test]
    fn spread_is_median_and_range() {
        let s = Spread::of(vec![3.0, 1.0, 2.0, 10.0]);
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 10.0));
        assert_eq!(s.samples, vec![3.0, 1.0, 2.0, 10.0]);
    }
}
