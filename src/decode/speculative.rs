//! Speculative decoding (SD): the draft proposes K tokens, the target checks all of them in one
//! forward, and rejection sampling keeps the output exactly the target's (token for token when
//! greedy, in distribution when sampling). Also what SSD shares with it: the configuration,
//! drafting, and verification.

use std::fmt;
use std::str::FromStr;

use web_time::Instant;

use super::autoregressive::pick;
use super::drafter::{Drafter, ModelDrafter};
use super::ssd::tree::Tree;
use super::{elapsed_ms, Generation, Output, Request, RoundTimes, Sink, Stats};
use crate::backend::Batch;
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::runner::{append, Lm, Want};
use crate::runtime::Span;
use crate::sampling::{self, Rng, SamplingParams};

pub use super::ssd::fanout::Fanout;

/// The decoding strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Autoregressive: one target forward per token.
    Ar,
    /// Speculative decoding.
    Sd,
    /// Speculative speculative decoding.
    Ssd,
}

impl FromStr for Mode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "ar" => Ok(Mode::Ar),
            "sd" => Ok(Mode::Sd),
            "ssd" => Ok(Mode::Ssd),
            _ => Err(Error::option("mode", format!("'{s}': expected ar, sd or ssd"))),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Ar => "ar",
            Mode::Sd => "sd",
            Mode::Ssd => "ssd",
        })
    }
}

/// What SSD does when the verification outcome is not in the speculation cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Backup {
    /// Draft K tokens now, as SD does; the target waits for them.
    #[default]
    Jit,
    /// Verify the bonus token alone, so the target never waits for the draft; meanwhile the
    /// draft speculates on every likely next bonus token, so the next round usually hits again.
    /// Such a round yields one token.
    Fast,
}

impl FromStr for Backup {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "jit" => Ok(Backup::Jit),
            "fast" => Ok(Backup::Fast),
            _ => Err(Error::option("backup", format!("'{s}': expected jit or fast"))),
        }
    }
}

impl fmt::Display for Backup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backup::Jit => "jit",
            Backup::Fast => "fast",
        })
    }
}

/// A deliberately wrong verifier, for the statistical tests to prove they would notice one.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Fault {
    /// After a rejection, draw the bonus token from the target's distribution p instead of the
    /// residual norm(max(0, p - q)).
    ResidualIsTarget,
}

/// How SD and SSD speculate.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SpecConfig {
    /// Draft tokens per round (K).
    pub k: usize,
    /// SSD: which verification outcomes the draft speculates on.
    pub fanout: Fanout,
    /// SSD, when sampling: the Saguaro factor C in [0, 1] by which the draft scales its own top
    /// candidates before drafting (1 = off). Lower C trades a little acceptance for more cache
    /// hits; the output distribution is unchanged.
    pub saguaro_c: f32,
    /// SSD: what to do on a cache miss.
    pub backup: Backup,
    #[doc(hidden)]
    pub fault: Option<Fault>,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig::new(4, Fanout::default(), 1.0, Backup::default())
    }
}

impl SpecConfig {
    pub fn new(k: usize, fanout: Fanout, saguaro_c: f32, backup: Backup) -> Self {
        SpecConfig { k, fanout, saguaro_c, backup, fault: None }
    }

    /// KV slots the draft needs beyond prompt + output for SSD's glue pass and tree: size the
    /// draft's cache with this.
    pub fn draft_scratch(&self) -> usize {
        Tree::scratch(self.k, self.fanout.max_branches(self.k), self.k)
    }

    pub fn validate(&self) -> Result<()> {
        if self.k == 0 || self.k > 64 {
            return Err(Error::option("spec_k", format!("draft tokens per round must be in 1..=64, got {}", self.k)));
        }
        let c = self.saguaro_c;
        if !(0.0..=1.0).contains(&c) {
            return Err(Error::option("saguaro_c", format!("must be in [0, 1] (1 disables it), got {c}")));
        }
        self.fanout.validate()
    }
}

/// A draft model must speak the target's vocabulary: token ids are exchanged, never text.
pub fn check_draft(target: &ModelConfig, draft: &ModelConfig) -> Result<()> {
    if target.vocab_size != draft.vocab_size {
        return Err(Error::IncompatibleDraft(format!(
            "the target has a vocabulary of {} tokens and the draft {}; a draft must share the target's tokenizer",
            target.vocab_size, draft.vocab_size
        )));
    }
    Ok(())
}

/// Draft tokens and, when sampling, the distribution (over the whole vocabulary) each one was
/// drawn from: verification needs exactly that distribution.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// Empty when greedy.
    pub q: Vec<Vec<f32>>,
}

/// The verification outcome v = (k, t*).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    /// Draft tokens accepted (k).
    pub accepted: usize,
    /// The token the target adds after them (t*), the next round's first token.
    pub bonus: u32,
}

/// Turns draft logits into draft tokens when sampling.
pub(crate) struct Drafting<'a> {
    pub params: &'a SamplingParams,
    pub rng: &'a mut Rng,
    /// Saguaro sampling: the factor C and, per draft position j, how many bonus candidates the
    /// fan-out takes for the outcome k = j. The draft scales that many of its top tokens, plus
    /// one for the token it is about to draft, which the fan-out will exclude.
    pub saguaro: Option<(f32, &'a [usize])>,
}

impl Drafting<'_> {
    /// The draft token at position `j` and the distribution it was drawn from.
    pub fn draw(&mut self, j: usize, logits: &[f32]) -> (u32, Vec<f32>) {
        let mut q = sampling::probs(logits, self.params);
        if let Some((c, widths)) = self.saguaro {
            if c < 1.0 {
                let n = widths.get(j).copied().unwrap_or(0) + 1;
                let top = sampling::top_n(&q, n, None);
                sampling::saguaro_rescale(&mut q, &top, c);
            }
        }
        (sampling::sample(&q, self.rng), q)
    }
}

/// Draft `n` tokens autoregressively. `feed` is what the draft's cache lacks of the committed
/// sequence, ending with the last committed token. Leaves `feed` and the first `n - 1` draft
/// tokens committed in the draft's cache (none of it when `n == 0`); the caller truncates.
pub(crate) async fn draft(lm: &mut dyn Lm, feed: &[u32], n: usize, drafting: &mut Drafting<'_>) -> Result<Proposal> {
    let mut p = Proposal { tokens: Vec::with_capacity(n), q: Vec::new() };
    let mut input = feed.to_vec();
    for j in 0..n {
        let t = if drafting.params.is_greedy() {
            *append(lm, &input, Want::AllArgmax).await?.argmax().last().expect("a non-empty input")
        } else {
            let (t, q) = drafting.draw(j, &append(lm, &input, Want::LastLogits).await?.logits());
            p.q.push(q);
            t
        };
        p.tokens.push(t);
        input = vec![t];
    }
    Ok(p)
}

/// Run the target once over [rec, proposal] at the end of its committed sequence, decide the
/// outcome, and commit rec and the accepted draft tokens (the bonus token is left for the next
/// round to feed).
pub(crate) async fn verify(
    target: &mut dyn Lm,
    rec: u32,
    proposal: &Proposal,
    params: &SamplingParams,
    rng: &mut Rng,
    fault: Option<Fault>,
) -> Result<Outcome> {
    let n = proposal.tokens.len();
    let tokens: Vec<u32> = std::iter::once(rec).chain(proposal.tokens.iter().copied()).collect();
    let batch = Batch::causal(&tokens, target.len());
    let rows: Vec<u32> = (0..=n as u32).collect();
    let outcome = if params.is_greedy() {
        let best = target.argmax(&batch, &rows).await?;
        let accepted = proposal.tokens.iter().zip(&best).take_while(|(s, b)| s == b).count();
        Outcome { accepted, bonus: best[accepted] }
    } else {
        // Pairing tokens with distributions below would silently pass a token that lacks its q.
        assert_eq!(proposal.q.len(), n, "every sampled draft token must come with the q it was drawn from");
        let vocab = target.config().vocab_size;
        let logits = target.logits(&batch, &rows).await?;
        let p = |i: usize| sampling::probs(&logits[i * vocab..(i + 1) * vocab], params);
        let rejected = proposal.tokens.iter().zip(&proposal.q).enumerate().find_map(|(i, (&s, q))| {
            let p = p(i);
            (!sampling::accept(&p, q, s, rng)).then(|| {
                let r = match fault {
                    Some(Fault::ResidualIsTarget) => p,
                    None => sampling::residual(&p, q),
                };
                Outcome { accepted: i, bonus: sampling::sample(&r, rng) }
            })
        });
        rejected.unwrap_or_else(|| Outcome { accepted: n, bonus: sampling::sample(&p(n), rng) })
    };
    target.advance(outcome.accepted + 1)?;
    Ok(outcome)
}

/// The draft's random stream: independent of the target's, or acceptance would correlate with
/// the draws it judges.
pub(crate) fn draft_rng(seed: u64) -> Rng {
    Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15)
}

/// What SD and SSD count across rounds.
pub(crate) struct Tally {
    /// The start of decoding, which the timeline counts from.
    origin: Instant,
    rounds: usize,
    proposed: usize,
    accepted: usize,
    committed: usize,
    verify_ms: f64,
    timeline: Vec<RoundTimes>,
}

impl Tally {
    pub fn new(origin: Instant) -> Self {
        Tally { origin, rounds: 0, proposed: 0, accepted: 0, committed: 0, verify_ms: 0.0, timeline: Vec::new() }
    }

    fn times(&self, s: Span) -> [f64; 2] {
        let ms = |t: Instant| t.saturating_duration_since(self.origin).as_secs_f64() * 1000.0;
        [ms(s.start), ms(s.end)]
    }

    /// A round that proposed `proposed` tokens, had `outcome`, committed `committed` tokens to
    /// the output and whose verify forward took `verify`; `draft` is the draft's work on it, if
    /// known yet ([`Tally::drafted`] adds it later), `hit` whether SSD's cache held it.
    pub fn round(&mut self, proposed: usize, outcome: Outcome, committed: usize, verify: Span, draft: Option<Span>, hit: Option<bool>) {
        self.rounds += 1;
        self.proposed += proposed;
        self.accepted += outcome.accepted;
        self.committed += committed;
        self.verify_ms += verify.ms();
        let (verify, draft) = (self.times(verify), draft.map(|d| self.times(d)));
        self.timeline.push(RoundTimes { verify, draft, proposed, accepted: outcome.accepted, hit });
    }

    /// The draft's work on the last round, once it is known.
    pub fn drafted(&mut self, draft: Span) {
        let t = self.times(draft);
        if let Some(r) = self.timeline.last_mut() {
            r.draft = Some(t);
        }
    }

    pub fn write(&self, stats: &mut Stats) {
        let per = |x: f64, n: usize| (n > 0).then(|| x / n as f64);
        stats.rounds = self.rounds;
        stats.acceptance_rate = per(self.accepted as f64, self.proposed);
        stats.mean_accepted = per(self.committed as f64, self.rounds);
        stats.target_busy_ms = self.verify_ms;
        stats.verify_ms_mean = per(self.verify_ms, self.rounds);
        stats.timeline = Some(self.timeline.clone());
    }
}

/// Speculative decoding of `req` on `target` with proposals from `draft` (same vocabulary).
/// Uses `spec.k`; the fan-out, Saguaro factor and backup concern SSD only.
pub async fn generate_sd(
    target: &mut dyn Lm,
    draft: &mut dyn Lm,
    req: &Request,
    spec: &SpecConfig,
    sink: Sink<'_>,
) -> Result<Generation> {
    check_draft(target.config(), draft.config())?;
    req.validate(draft, 0)?;
    generate_sd_with(target, &mut ModelDrafter::new(draft), req, spec, sink).await
}

/// Speculative decoding of `req` on `target` with proposals of up to `spec.k` tokens from
/// `drafter`.
pub async fn generate_sd_with(
    target: &mut dyn Lm,
    drafter: &mut dyn Drafter,
    req: &Request,
    spec: &SpecConfig,
    sink: Sink<'_>,
) -> Result<Generation> {
    spec.validate()?;
    let target_room = req.validate(target, 0)?;
    let room = req.speculative_room(target_room, drafter.room(req))?;
    target.truncate(0);
    let mut rng = Rng::new(req.sampling.seed);
    let mut drng = draft_rng(req.sampling.seed);
    let mut stats = Stats { mode: "sd".into(), prompt_tokens: req.prompt.len(), ..Stats::default() };
    let t0 = Instant::now();
    let logits = append(target, &req.prompt, Want::LastLogits).await?.logits();
    let mut rec = pick(&logits, req, &mut rng);
    drafter.start(&req.prompt).await?;
    stats.prefill_ms = elapsed_ms(t0);

    let t1 = Instant::now();
    let mut out = Output::new(req, room, sink);
    out.push(&[rec]);
    let mut tally = Tally::new(t1);
    let mut draft_ms = 0.0;
    while !out.done() {
        let n = spec.k.min(out.remaining() - 1);
        let td = Instant::now();
        let proposal = drafter.propose(rec, n, &req.sampling, &mut drng).await?;
        let draft_span = Span::since(td);
        draft_ms += draft_span.ms();

        let tv = Instant::now();
        let o = verify(target, rec, &proposal, &req.sampling, &mut rng, spec.fault).await?;
        let verify_span = Span::since(tv);

        drafter.accept(&proposal, o.accepted);
        let mut toks = proposal.tokens[..o.accepted].to_vec();
        toks.push(o.bonus);
        let committed = out.push(&toks);
        tally.round(proposal.tokens.len(), o, committed, verify_span, Some(draft_span), None);
        rec = o.bonus;
    }
    let decode_ms = elapsed_ms(t1);
    tally.write(&mut stats);
    stats.draft_busy_ms = Some(draft_ms);
    stats.finish(out.tokens.len(), decode_ms);
    Ok(out.into_generation(stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cli_strings() {
        assert_eq!("ssd".parse::<Mode>().unwrap(), Mode::Ssd);
        assert_eq!("ar".parse::<Mode>().unwrap().to_string(), "ar");
        assert!("spec".parse::<Mode>().is_err());
        assert_eq!("fast".parse::<Backup>().unwrap(), Backup::Fast);
        assert_eq!(Backup::Jit.to_string(), "jit");
        assert!("slow".parse::<Backup>().is_err());
    }

    #[test]
    fn validates_config() {
        assert!(SpecConfig::default().validate().is_ok());
        let bad = |f: fn(&mut SpecConfig)| {
            let mut c = SpecConfig::default();
            f(&mut c);
            c.validate().is_err()
        };
        assert!(bad(|c| c.k = 0));
        assert!(bad(|c| c.saguaro_c = 1.5));
        assert!(bad(|c| c.saguaro_c = f32::NAN));
        assert!(bad(|c| c.fanout = Fanout::Uniform(0)));
    }

    #[test]
    fn draft_vocabulary_must_match() {
        let cfg = ModelConfig {
            arch: crate::model::config::Arch::Llama,
            n_layers: 1,
            d_model: 8,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 8,
            d_ffn: 8,
            vocab_size: 16,
            rope_theta: 1e4,
            rms_eps: 1e-5,
            context_length: 64,
            tied_embeddings: true,
        };
        assert!(check_draft(&cfg, &cfg.clone()).is_ok());
        let other = ModelConfig { vocab_size: 17, ..cfg.clone() };
        let err = check_draft(&cfg, &other).unwrap_err();
        assert!(matches!(err, Error::IncompatibleDraft(_)), "{err}");
        assert!(err.to_string().contains("16") && err.to_string().contains("17"), "{err}");
    }
}
