//! What a cheaper draft buys: for each draft setting (`--draft-quant`, `--draft-head`), the draft
//! step's time, and greedy SD's acceptance and speed against AR on the same prompts. The settings
//! take turns, round after round, so that a shared machine's load slows all of them alike; each
//! figure is the median over the rounds.
//!
//! cargo run --release --example draft_cost -- TARGET DRAFT ROUNDS SETTING...
//! where a SETTING is QUANT:HEAD, e.g. none:0 (the draft as stored), q4_0:65536.

use futures::executor::block_on;
use web_time::Instant;

use saguaro::backend::cpu::Precision;
use saguaro::decode::{generate_ar, generate_sd, Request, SpecConfig};
use saguaro::engine::Device;
use saguaro::model::load::open;
use saguaro::model::runner::{append, BoxedLm, Want};
use saguaro::model::slim::{frequent_tokens, Slimming};
use saguaro::model::weights::ModelWeights;
use saguaro::Result;

/// Code to continue: the workload a coder draft is for.
const PROMPTS: [&str; 2] = [
    "def quicksort(arr):\n    \"\"\"Sort a list with quicksort.\"\"\"\n",
    "fn main() {\n    let v: Vec<i32> = (1..=10).collect();\n",
];
const MAX_TOKENS: usize = 32;
const CAPACITY: usize = 512;
const STEPS: usize = 12;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median time of one-token forwards after a short prompt.
fn step_ms(lm: &mut BoxedLm) -> Result<f64> {
    lm.truncate(0);
    block_on(append(lm.as_mut(), &[1, 2, 3, 4, 5, 6, 7, 8], Want::LastLogits))?;
    let mut times: Vec<f64> = (0..STEPS)
        .map(|i| {
            let t = Instant::now();
            block_on(append(lm.as_mut(), &[100 + i as u32], Want::LastLogits)).map(|_| t.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_>>()?;
    Ok(median(&mut times))
}

struct Figures {
    step_ms: Vec<f64>,
    sd_tok_s: Vec<f64>,
    ratio: Vec<f64>,
    acceptance: f64,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, target, draft, rounds, settings @ ..] = &args[..] else {
        panic!("usage: draft_cost TARGET DRAFT ROUNDS QUANT:HEAD...");
    };
    let rounds: usize = rounds.parse().expect("ROUNDS is a number");
    let (target, draft) = (open(target.as_ref())?, open(draft.as_ref())?);
    let vocab = draft.weights.config.vocab_size;
    let drafts: Vec<(String, ModelWeights)> = settings
        .iter()
        .map(|s| {
            let (q, h) = s.split_once(':').expect("QUANT:HEAD");
            let quant = (q != "none").then(|| q.parse().expect("a weight type"));
            let n: usize = h.parse().expect("HEAD is a number");
            let head = (n > 0).then(|| frequent_tokens(&draft.tokenizer, n, vocab));
            // The drafts run on the CPU, where the engine pads Q4_K rows to whole blocks.
            Ok((s.clone(), Slimming { quant, head, pad_rows: true }.apply(&draft.weights)?))
        })
        .collect::<Result<_>>()?;
    let cpu = |p| Device::Cpu { threads: 0, precision: p };
    let mut t = block_on(cpu(Precision::Exact).runner(&target.weights, CAPACITY))?;
    let reqs: Vec<Request> = PROMPTS
        .iter()
        .map(|p| {
            let prompt = target.tokenizer.encode(p)?;
            Ok(Request { prompt, max_tokens: MAX_TOKENS, stop: target.tokenizer.eos_ids().to_vec(), ..Request::default() })
        })
        .collect::<Result<_>>()?;
    let spec = SpecConfig::default();
    let mut figures: Vec<Figures> =
        drafts.iter().map(|_| Figures { step_ms: vec![], sd_tok_s: vec![], ratio: vec![], acceptance: 0.0 }).collect();
    for round in 0..rounds {
        let (mut ar_tokens, mut ar_s, mut want) = (0, 0.0, vec![]);
        for req in &reqs {
            let g = block_on(generate_ar(t.as_mut(), req, &mut |_| true))?;
            ar_tokens += g.stats.generated;
            ar_s += g.stats.generated as f64 / g.stats.tokens_per_s;
            want.push(g.tokens);
        }
        let ar = ar_tokens as f64 / ar_s;
        println!("round {round}: ar {ar:.2} tok/s");
        for ((name, w), f) in drafts.iter().zip(&mut figures) {
            let mut d = block_on(cpu(Precision::Fast).runner(w, CAPACITY))?;
            let step = step_ms(&mut d)?;
            let (mut tokens, mut secs, mut accepted) = (0, 0.0, 0.0);
            for (req, want) in reqs.iter().zip(&want) {
                let g = block_on(generate_sd(t.as_mut(), d.as_mut(), req, &spec, &mut |_| true))?;
                assert_eq!(&g.tokens, want, "{name}: greedy SD equals AR");
                tokens += g.stats.generated;
                secs += g.stats.generated as f64 / g.stats.tokens_per_s;
                accepted += g.stats.acceptance_rate.unwrap_or(0.0) * g.stats.generated as f64;
            }
            let sd = tokens as f64 / secs;
            f.acceptance = accepted / tokens as f64;
            println!("  {name:>12}: draft step {step:6.1} ms, acceptance {:.3}, sd {sd:.2} tok/s ({:.2}x ar)", f.acceptance, sd / ar);
            f.step_ms.push(step);
            f.sd_tok_s.push(sd);
            f.ratio.push(sd / ar);
        }
    }
    println!("median over {rounds} rounds:");
    for ((name, _), f) in drafts.iter().zip(&mut figures) {
        println!(
            "  {name:>12}: draft step {:6.1} ms, acceptance {:.3}, sd {:.2} tok/s, {:.2}x ar",
            median(&mut f.step_ms),
            f.acceptance,
            median(&mut f.sd_tok_s),
            median(&mut f.ratio)
        );
    }
    Ok(())
}
