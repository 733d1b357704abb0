//! The server's answer to one `/generate` request, apart from HTTP: score the input positions
//! asked for, generate up to `max_new_tokens` after them, and report both as SGLang does.

use web_time::Instant;

use super::prefix::PrefixModel;
use super::protocol::{FinishReason, GenerateRequest, GenerateResponse, MetaInfo, TokenLogprob};
use crate::backend::Allowed;
use crate::grammar::Vocabulary;
use crate::sampling::{self, Rng, SamplingParams};

/// What a request may ask of the server.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Input positions scored per request (each costs a row of vocabulary-wide logits); a
    /// verification of K draft tokens scores K.
    pub max_scored: usize,
    pub max_top_logprobs: usize,
    pub max_new_tokens: usize,
    /// Wall time a generation may take; it stops with `abort` when over.
    pub time: std::time::Duration,
}

/// A request the server refuses (HTTP 400), or a failure while running it (HTTP 500).
#[derive(Debug)]
pub enum Refusal {
    BadRequest(String),
    Failed(String),
}

/// The top `n` (token, logprob) of one logits row, most likely first, ties to the lower id; and
/// the row's log-normaliser.
fn top_logprobs(row: &[f32], n: usize) -> (Vec<TokenLogprob>, f64) {
    let max = row.iter().copied().filter(|x| !x.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().filter(|x| !x.is_nan()).map(|&x| f64::from(x - max).exp()).sum();
    let lse = f64::from(max) + sum.ln();
    let key = |x: f32| if x.is_nan() { f32::NEG_INFINITY } else { x };
    let order = |a: &u32, b: &u32| key(row[*b as usize]).total_cmp(&key(row[*a as usize])).then(a.cmp(b));
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    let n = n.min(ids.len());
    if n > 0 && n < ids.len() {
        ids.select_nth_unstable_by(n - 1, order);
    }
    ids.truncate(n);
    ids.sort_unstable_by(order);
    (ids.into_iter().map(|id| TokenLogprob(Some(logprob(row[id as usize], lse)), id, None)).collect(), lse)
}

/// A finite log-probability: JSON has no -inf, so an impossible token gets the lowest f32.
fn logprob(logit: f32, lse: f64) -> f32 {
    let lp = (f64::from(logit) - lse) as f32;
    if lp.is_finite() {
        lp
    } else {
        f32::MIN
    }
}

/// Answer `req` on `model`, handing each output token to `emit` as soon as it is drawn; `emit`
/// returning `false` (nobody is listening any more) ends the generation there.
pub fn answer(
    model: &mut dyn PrefixModel,
    req: &GenerateRequest,
    limits: &Limits,
    vocabulary: Option<&Vocabulary>,
    emit: &mut dyn FnMut(u32) -> bool,
) -> Result<GenerateResponse, Refusal> {
    let t0 = Instant::now();
    let bad = |m: String| Err(Refusal::BadRequest(m));
    let input = &req.input_ids;
    let vocab = model.config().vocab_size;
    let n = input.len();
    if n == 0 {
        return bad("input_ids is empty".into());
    }
    if let Some(t) = input.iter().find(|&&t| t as usize >= vocab) {
        return bad(format!("input_ids: token {t} is outside the vocabulary of {vocab}"));
    }
    if n >= model.capacity() {
        return bad(format!("input_ids: {n} tokens leave no room in the context of {}", model.capacity()));
    }
    let top_n = if req.return_logprob { req.top_logprobs_num } else { 0 };
    if top_n > limits.max_top_logprobs {
        return bad(format!("top_logprobs_num {top_n} exceeds this server's limit of {}", limits.max_top_logprobs));
    }
    let start = match (req.return_logprob, req.logprob_start_len) {
        (false, _) | (true, -1) => n,
        (true, s) if s >= 0 && (s as usize) < n => s as usize,
        (true, s) => return bad(format!("logprob_start_len {s} is outside the input of {n} tokens (or -1)")),
    };
    if n - start > limits.max_scored {
        return bad(format!("scoring {} input positions exceeds this server's limit of {}", n - start, limits.max_scored));
    }
    let s = &req.sampling_params;
    // Written as one negated range test so that NaN is refused too.
    if !(s.temperature.is_finite() && s.temperature >= 0.0 && s.top_p > 0.0 && s.top_p <= 1.0) {
        return bad("sampling_params: temperature must be >= 0 and top_p in (0, 1]".into());
    }
    let params = SamplingParams {
        temperature: s.temperature,
        top_k: usize::try_from(s.top_k).unwrap_or(0),
        top_p: s.top_p,
        seed: s.sampling_seed.unwrap_or(0),
    };
    let max_new = s.max_new_tokens.min(limits.max_new_tokens).min(model.capacity() - n);
    let mut grammar = match (s.grammar().map_err(Refusal::BadRequest)?, vocabulary) {
        (None, _) => None,
        (Some(_), None) => return bad("this server takes no grammars".into()),
        (Some(spec), Some(v)) => Some(v.compile(&spec).map_err(|e| Refusal::BadRequest(e.to_string()))?.start(&s.stop_token_ids)),
    };

    // Position 0 has nothing before it; every later scored position p needs the logits after p - 1.
    let after: Vec<usize> = (start.max(1) - 1..n).collect();
    let failed = |e: crate::Error| Refusal::Failed(e.to_string());
    let (logits, cached) = model.run(input, &after).map_err(failed)?;
    let mut meta = MetaInfo { prompt_tokens: n, cached_tokens: cached, ..MetaInfo::default() };
    if req.return_logprob {
        if start == 0 {
            meta.input_token_logprobs.push(TokenLogprob(None, input[0], None));
            meta.input_top_logprobs.push(None);
        }
        for (row, &tok) in logits.chunks_exact(vocab).zip(&input[start.max(1)..]) {
            let (top, lse) = top_logprobs(row, top_n);
            meta.input_token_logprobs.push(TokenLogprob(Some(logprob(row[tok as usize], lse)), tok, None));
            meta.input_top_logprobs.push(Some(top));
        }
    }

    let mut rng = Rng::new(params.seed);
    let mut seq = input.clone();
    let mut last = logits[logits.len() - vocab..].to_vec();
    let mut output = Vec::new();
    let mut finish = FinishReason::Length { length: 0 };
    while output.len() < max_new {
        if let Some(g) = &mut grammar {
            let mut allowed = Allowed::new(vocab);
            allowed.push(&g.allowed().map_err(failed)?);
            allowed.apply(&mut last);
        }
        let next = if params.is_greedy() {
            sampling::argmax(&last)
        } else {
            sampling::sample(&sampling::probs(&last, &params), &mut rng)
        };
        if req.return_logprob {
            let (top, lse) = top_logprobs(&last, top_n);
            meta.output_token_logprobs.push(TokenLogprob(Some(logprob(last[next as usize], lse)), next, None));
            meta.output_top_logprobs.push(Some(top));
        }
        output.push(next);
        if !emit(next) {
            finish = FinishReason::Abort { message: "the client went away".into() };
            break;
        }
        finish = FinishReason::Length { length: output.len() };
        if s.stop_token_ids.contains(&next) {
            finish = FinishReason::Stop { matched: next };
            break;
        }
        if let Some(g) = &mut grammar {
            g.consume(&[next]).map_err(failed)?;
            if g.complete() {
                finish = FinishReason::Stop { matched: next };
                break;
            }
        }
        if output.len() == max_new {
            break;
        }
        if t0.elapsed() > limits.time {
            finish = FinishReason::Abort { message: format!("generation exceeded the server's time limit of {:?}", limits.time) };
            break;
        }
        seq.push(next);
        last = model.run(&seq, &[seq.len() - 1]).map_err(failed)?.0;
    }
    meta.completion_tokens = output.len();
    meta.finish_reason = Some(finish);
    meta.id = req.rid.clone();
    meta.e2e_latency = Some(t0.elapsed().as_secs_f64());
    Ok(GenerateResponse { text: String::new(), output_ids: output, meta_info: meta })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_logprobs_are_sorted_with_ties_to_the_lower_id() {
        let (top, _) = top_logprobs(&[1.0, 3.0, 3.0, f32::NAN, 2.0], 3);
        let ids: Vec<u32> = top.iter().map(|t| t.1).collect();
        assert_eq!(ids, vec![1, 2, 4]);
        let total: f32 = top_logprobs(&[0.5, -1.0], 2).0.iter().map(|t| t.0.unwrap().exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}
