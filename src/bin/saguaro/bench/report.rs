//! The bench's rows: speed per mode and K, and what a round costs in units of one target decode
//! timed in the same run, from the statistics and per-round timeline each generation returns.

use serde::Serialize;

use saguaro::decode::Mode;
use saguaro::engine::{Completion, Engine};

use super::Run;

/// The cost of one target decode the ratios are expressed in.
pub struct DecodeUnit {
    pub ms: f64,
    /// "ar": this run's AR decoding; "load": the engine's timing at load (mode auto, no AR run).
    pub source: &'static str,
}

impl DecodeUnit {
    pub fn of(runs: &[Run], engine: &Engine) -> Option<DecodeUnit> {
        match runs.iter().find(|r| r.mode.0 == Some(Mode::Ar)) {
            // AR does one target forward per token after the first.
            Some(ar) => Some(DecodeUnit { ms: 1000.0 / tokens_per_s(&ar.gens), source: "ar" }),
            None => engine.choice().map(|c| DecodeUnit { ms: c.costs.decode_ms, source: "load" }),
        }
    }
}

#[derive(Default, Serialize)]
pub struct Row {
    pub mode: String,
    /// The mode asked for (ar, sd, ssd, auto): the plot's series.
    #[serde(skip)]
    pub series: String,
    /// Draft tokens per round asked for (none for AR, or the engine's own).
    pub k: Option<usize>,
    pub generated: usize,
    pub tokens_per_s: f64,
    pub speedup_vs_ar: Option<f64>,
    /// Mean ms of a verification of K + 1 tokens (rounds that proposed a full K).
    pub verify_ms: Option<f64>,
    pub verify_over_decode: Option<f64>,
    /// Mean ms of one draft step: SD, one drafted token; SSD, one step of the speculation tree.
    pub draft_step_ms: Option<f64>,
    pub draft_step_over_decode: Option<f64>,
    pub acceptance_rate: Option<f64>,
    pub mean_accepted: Option<f64>,
    pub cache_hit_rate: Option<f64>,
    pub overlap_ms: Option<f64>,
    pub verify_ms_mean: Option<f64>,
    pub glue_ms_mean: Option<f64>,
    pub tree_step_ms_mean: Option<f64>,
}

/// Decode tokens per second over generations: the first token comes from the prefill.
pub fn tokens_per_s(gens: &[Completion]) -> f64 {
    let decoded: usize = gens.iter().map(|g| g.stats.generated.saturating_sub(1)).sum();
    let ms: f64 = gens.iter().map(|g| g.stats.decode_ms).sum();
    decoded as f64 * 1000.0 / ms.max(1e-9)
}

/// Mean of `f` over the generations that have it, weighted by tokens generated.
fn weighted(gens: &[Completion], f: impl Fn(&Completion) -> Option<f64>) -> Option<f64> {
    let (mut sum, mut w) = (0.0, 0.0);
    for g in gens {
        if let Some(v) = f(g) {
            sum += v * g.stats.generated as f64;
            w += g.stats.generated as f64;
        }
    }
    (w > 0.0).then(|| sum / w)
}

/// Mean verification ms of the rounds that proposed the generation's full K (the last rounds
/// propose fewer when few tokens remain, an SSD fast backup none).
fn full_verify_ms(g: &Completion) -> Option<f64> {
    let rounds = g.stats.timeline.as_ref()?;
    let k = rounds.iter().map(|r| r.proposed).max().filter(|&k| k > 0)?;
    let full: Vec<f64> = rounds.iter().filter(|r| r.proposed == k).map(|r| r.verify[1] - r.verify[0]).collect();
    Some(full.iter().sum::<f64>() / full.len() as f64)
}

fn draft_step_ms(g: &Completion) -> Option<f64> {
    match g.stats.mode.parse().ok()? {
        Mode::Sd => {
            let rounds = g.stats.timeline.as_ref()?;
            let ms: f64 = rounds.iter().filter_map(|r| r.draft.map(|d| d[1] - d[0])).sum();
            let drafted: usize = rounds.iter().map(|r| r.proposed).sum();
            (drafted > 0).then(|| ms / drafted as f64)
        }
        Mode::Ssd => g.stats.tree_step_ms_mean,
        _ => None,
    }
}

pub fn label(run: &Run) -> String {
    match run.mode.0 {
        // The choice may change as the engine learns the acceptance: name each one made.
        None => {
            let mut chosen: Vec<String> =
                run.gens.iter().filter_map(|g| g.stats.auto.as_ref()).map(|c| format!("{} k={}", c.mode, c.k)).collect();
            chosen.dedup();
            if chosen.is_empty() {
                "auto".into()
            } else {
                format!("auto: {}", chosen.join(", "))
            }
        }
        Some(m) => m.to_string(),
    }
}

pub fn rows(runs: &[Run], unit: Option<&DecodeUnit>) -> Vec<Row> {
    let ar = runs.iter().find(|r| r.mode.0 == Some(Mode::Ar)).map(|r| tokens_per_s(&r.gens));
    let per_decode = |ms: Option<f64>| Some(ms? / unit?.ms);
    runs.iter()
        .map(|r| {
            let gens = &r.gens[..];
            let t = tokens_per_s(gens);
            let verify_ms = weighted(gens, full_verify_ms);
            let draft_step_ms = weighted(gens, draft_step_ms);
            Row {
                mode: label(r),
                series: r.mode.to_string(),
                k: r.k,
                generated: gens.iter().map(|g| g.stats.generated).sum(),
                tokens_per_s: t,
                speedup_vs_ar: ar.map(|a| t / a),
                verify_ms,
                verify_over_decode: per_decode(verify_ms),
                draft_step_ms,
                draft_step_over_decode: per_decode(draft_step_ms),
                acceptance_rate: weighted(gens, |g| g.stats.acceptance_rate),
                mean_accepted: weighted(gens, |g| g.stats.mean_accepted),
                cache_hit_rate: weighted(gens, |g| g.stats.cache_hit_rate),
                overlap_ms: weighted(gens, |g| g.stats.overlap_ms),
                verify_ms_mean: weighted(gens, |g| g.stats.verify_ms_mean),
                glue_ms_mean: weighted(gens, |g| g.stats.glue_ms_mean),
                tree_step_ms_mean: weighted(gens, |g| g.stats.tree_step_ms_mean),
            }
        })
        .collect()
}

pub fn print_table(rows: &[Row], unit: Option<&DecodeUnit>, agree: bool) {
    let f = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |v| format!("{v:.p$}"));
    println!(
        "{:<22} {:>3} {:>7} {:>6} {:>10} {:>9} {:>6} {:>9} {:>5} {:>8} {:>6}",
        "mode", "K", "tok/s", "vs AR", "verify/dec", "draft/dec", "accept", "tok/round", "hits", "overlap", "glue"
    );
    for r in rows {
        println!(
            "{:<22} {:>3} {:>7.2} {:>6} {:>10} {:>9} {:>6} {:>9} {:>5} {:>8} {:>6}",
            r.mode,
            r.k.map_or("-".into(), |k| k.to_string()),
            r.tokens_per_s,
            f(r.speedup_vs_ar, 2),
            f(r.verify_over_decode, 2),
            f(r.draft_step_over_decode, 2),
            f(r.acceptance_rate, 2),
            f(r.mean_accepted, 2),
            f(r.cache_hit_rate, 2),
            f(r.overlap_ms, 0),
            f(r.glue_ms_mean, 1)
        );
    }
    let unit = unit.map_or("no decode measured (run ar too)".into(), |u| {
        let by = if u.source == "ar" { "this run's AR" } else { "the engine's timing at load" };
        format!("one target decode = {:.1} ms, from {by}", u.ms)
    });
    println!("(verify/dec: a verification of K+1 tokens, draft/dec: one draft step (SD: a drafted token, SSD: a tree step),");
    println!(" in target decodes; {unit}; overlap ms per generation, glue ms per round; greedy outputs agree: {agree})");
}
