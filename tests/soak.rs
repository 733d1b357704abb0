//! A long run loses nothing: 1,000 greedy tokens of SSD on SmolLM2, drafting for itself (at fast
//! precision), equal AR token for token, on engines (target runner and draft worker) reused across calls before
//! and after the long one.

mod util;

use futures::executor::block_on;

use saguaro::backend::cpu::{CpuBackend, Precision};
use saguaro::decode::{generate_ar, generate_ssd, Backup, DraftWorker, Generation, Request, SpecConfig};
use saguaro::model::runner::Runner;
use saguaro::model::transformer::Transformer;
use saguaro::model::weights::ModelWeights;
use saguaro::sampling::SamplingParams;

const LONG: usize = 1000;

fn cpu_runner(w: &ModelWeights, precision: Precision, capacity: usize) -> Runner<CpuBackend> {
    let cpu = CpuBackend::new(0).unwrap().with_precision(precision);
    Runner::new(Transformer::new(cpu, w).unwrap(), capacity).unwrap()
}

#[test]
fn a_thousand_ssd_tokens_equal_ar() {
    let m = util::model(util::SMOLLM2);
    // One candidate per outcome keeps the tree small: the run tests bookkeeping over a long
    // sequence, not the fan-out, and must fit the CI budget on two cores.
    let spec = SpecConfig::new(4, "uniform:1".parse().unwrap(), 1.0, Backup::Jit);
    let capacity = 64 + LONG;
    let mut target = cpu_runner(&m.weights, Precision::Exact, capacity);
    // The draft at fast precision, as the CLI runs it: it is sometimes wrong, so rollback of
    // both caches is exercised all along the run.
    let draft = cpu_runner(&m.weights, Precision::Fast, capacity + spec.draft_scratch());
    let mut worker = DraftWorker::new(Box::new(draft)).unwrap();
    let calls = [("The capital of France is", 48), ("def fibonacci(n):", LONG), ("Once upon a time", 48)];
    for (text, max_tokens) in calls {
        // No stop tokens: the long call runs its full length.
        let req = Request {
            prompt: m.tokenizer.encode(text).unwrap(),
            max_tokens,
            sampling: SamplingParams::default(),
            ..Request::default()
        };
        let ar: Generation = block_on(generate_ar(&mut target, &req, &mut |_| true)).unwrap();
        let ssd = block_on(generate_ssd(&mut target, &mut worker, &req, &spec, &mut |_| true)).unwrap();
        assert_eq!(ar.tokens.len(), max_tokens, "{text:?}");
        let diverged = ssd.tokens.iter().zip(&ar.tokens).position(|(s, a)| s != a);
        assert_eq!(diverged, None, "{text:?}: SSD and AR differ at token {diverged:?}");
        assert_eq!(ssd.tokens.len(), ar.tokens.len(), "{text:?}");
        eprintln!(
            "{text:?}: {max_tokens} tokens, AR {:.1} tok/s, SSD {:.1} tok/s, acceptance {:?}, cache hits {:?}",
            ar.stats.tokens_per_s, ssd.stats.tokens_per_s, ssd.stats.acceptance_rate, ssd.stats.cache_hit_rate
        );
    }
}
