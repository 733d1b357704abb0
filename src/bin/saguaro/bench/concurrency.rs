//! `saguaro bench --concurrency 1,2,4,8`: N streams at once on one [`Pool`] (continuous
//! batching), in each mode: aggregate tokens per second, each stream's own, and time to first
//! token; greedy outputs checked against each stream's prompt run alone. With `--llama-server`,
//! llama.cpp's server with N parallel slots (`-np N`) on the same files, with and without its
//! draft, alternated with ours.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

use futures::executor::block_on;
use serde::Serialize;
use web_time::Instant;

use saguaro::decode::{BoxedSink, Mode};
use saguaro::engine::{GenerateOptions, Prompt};
use saguaro::grammar::GrammarSpec;
use saguaro::pool::Pool;
use saguaro::{Error, Result};

use super::llama_server;
use crate::setup::ModeArg;

/// One concurrency in one mode (or llama-server's), over its rounds.
#[derive(Serialize)]
pub struct Row {
    pub who: String,
    pub concurrency: usize,
    /// Every stream's tokens over the wall time from the first join to the last end.
    pub aggregate_tokens_per_s: f64,
    /// The mean over streams of a stream's tokens over its own time.
    pub stream_tokens_per_s: f64,
    pub time_to_first_token_ms: f64,
    /// The modes the streams ran in (auto chooses per stream as it joins).
    pub modes: String,
}

/// One stream's measurements.
#[derive(Default)]
struct Stream {
    first: Option<f64>,
    tokens: usize,
}

/// `concurrency` streams of `prompts` (in turn) at once in `mode`: their row and greedy tokens.
fn run_streams(pool: &mut Pool, prompts: &[Prompt], concurrency: usize, mode: ModeArg, max_tokens: usize, grammar: &Option<GrammarSpec>) -> Result<(Row, Vec<Vec<u32>>)> {
    let opts = GenerateOptions { mode: mode.0, max_tokens, grammar: grammar.clone(), ..GenerateOptions::default() };
    let t0 = Instant::now();
    let streams: Vec<Rc<RefCell<Stream>>> = (0..concurrency).map(|_| Rc::default()).collect();
    let arrivals = streams
        .iter()
        .enumerate()
        .map(|(i, stream)| {
            let s = stream.clone();
            let sink: BoxedSink<'static> = Box::new(move |t: &[u32]| {
                let mut s = s.borrow_mut();
                s.first.get_or_insert(t0.elapsed().as_secs_f64() * 1000.0);
                s.tokens += t.len();
                true
            });
            (prompts[i % prompts.len()].clone(), opts.clone(), sink)
        })
        .collect();
    let mut ids = HashMap::new();
    let mut modes = Vec::new();
    for (i, joined) in pool.join_all(arrivals).into_iter().enumerate() {
        let joined = joined?;
        modes.push(if joined.mode == Mode::Ar { "ar".to_string() } else { format!("{}:{}", joined.mode, joined.k) });
        ids.insert(joined.id, i);
    }
    let mut tokens = vec![Vec::new(); concurrency];
    let mut ends = vec![0.0; concurrency];
    while pool.running() > 0 {
        for (id, result) in block_on(pool.step()) {
            let i = ids[&id];
            tokens[i] = result?.tokens;
            ends[i] = t0.elapsed().as_secs_f64() * 1000.0;
        }
    }
    let wall = ends.iter().copied().fold(0.0, f64::max);
    let total: usize = streams.iter().map(|s| s.borrow().tokens).sum();
    let per_stream = streams.iter().zip(&ends).map(|(s, &end)| s.borrow().tokens as f64 / end * 1000.0).sum::<f64>() / concurrency as f64;
    let first = streams.iter().map(|s| s.borrow().first.unwrap_or(wall)).sum::<f64>() / concurrency as f64;
    modes.sort();
    modes.dedup();
    let row = Row {
        who: mode.to_string(),
        concurrency,
        aggregate_tokens_per_s: total as f64 / wall * 1000.0,
        stream_tokens_per_s: per_stream,
        time_to_first_token_ms: first,
        modes: modes.join(","),
    };
    Ok((row, tokens))
}

pub struct Setup<'a> {
    pub concurrency: &'a [usize],
    pub modes: &'a [ModeArg],
    pub prompts: &'a [Prompt],
    pub max_tokens: usize,
    pub rounds: usize,
    pub grammar: &'a Option<GrammarSpec>,
    pub llama_server: Option<llama_server::Setup<'a>>,
}

/// Every concurrency in every mode, `rounds` times over (each concurrency takes every mode in
/// turn, then llama-server's, before the next), the rows averaged over the rounds. Greedy
/// outputs must equal each prompt's output in the first run of one stream at a time.
pub fn run(pool: &mut Pool, s: &Setup) -> Result<Vec<Row>> {
    let greedy = s.grammar.is_none();
    let mut alone: HashMap<usize, Vec<u32>> = HashMap::new();
    let mut sums: Vec<Vec<Row>> = Vec::new();
    for round in 0..s.rounds {
        let mut at = 0;
        for &c in s.concurrency {
            for &mode in s.modes {
                let (row, tokens) = run_streams(pool, s.prompts, c, mode, s.max_tokens, s.grammar)?;
                eprintln!(
                    "round {round} {mode} x{c}: {:.1} tok/s in all, {:.1} per stream, first token {:.0} ms ({})",
                    row.aggregate_tokens_per_s, row.stream_tokens_per_s, row.time_to_first_token_ms, row.modes
                );
                for (i, t) in tokens.into_iter().enumerate() {
                    let want = alone.entry(i % s.prompts.len()).or_insert_with(|| t.clone());
                    if greedy && *want != t {
                        return Err(Error::InvalidArgument(format!(
                            "{mode} with {c} streams gave stream {i} other tokens than its prompt alone: batching is not exact"
                        )));
                    }
                }
                push(&mut sums, at, row);
                at += 1;
            }
            if let Some(l) = &s.llama_server {
                for row in llama_server::run(l, c, s.prompts)? {
                    push(&mut sums, at, row);
                    at += 1;
                }
            }
        }
    }
    Ok(sums.into_iter().map(mean).collect())
}

fn push(sums: &mut Vec<Vec<Row>>, at: usize, row: Row) {
    if sums.len() <= at {
        sums.push(Vec::new());
    }
    sums[at].push(row);
}

fn mean(rows: Vec<Row>) -> Row {
    let n = rows.len() as f64;
    let avg = |f: fn(&Row) -> f64| rows.iter().map(f).sum::<f64>() / n;
    let mut modes: Vec<&str> = rows.iter().flat_map(|r| r.modes.split(',')).collect();
    modes.sort();
    modes.dedup();
    Row {
        aggregate_tokens_per_s: avg(|r| r.aggregate_tokens_per_s),
        stream_tokens_per_s: avg(|r| r.stream_tokens_per_s),
        time_to_first_token_ms: avg(|r| r.time_to_first_token_ms),
        modes: modes.join(","),
        who: rows[0].who.clone(),
        concurrency: rows[0].concurrency,
    }
}

/// The table: each row's aggregate against our AR's with one stream.
pub fn print(rows: &[Row]) {
    let base = rows.iter().find(|r| r.who == "ar" && r.concurrency == 1).map(|r| r.aggregate_tokens_per_s);
    println!("{:<22} {:>7} {:>12} {:>10} {:>12} {:>10}  modes", "who", "streams", "tok/s (all)", "x AR(1)", "tok/s each", "TTFT ms");
    for r in rows {
        let ratio = base.map_or("-".to_string(), |b| format!("{:.2}x", r.aggregate_tokens_per_s / b));
        println!(
            "{:<22} {:>7} {:>12.1} {:>10} {:>12.1} {:>10.0}  {}",
            r.who, r.concurrency, r.aggregate_tokens_per_s, ratio, r.stream_tokens_per_s, r.time_to_first_token_ms, r.modes
        );
    }
}

/// Whether `path` names a file that can run.
pub fn check_binary(path: &Path) -> Result<()> {
    if path.is_file() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!("--llama-server: {} is not a file", path.display())))
    }
}
