//! How SD and SSD are configured: K, SSD's fan-out, Saguaro factor and backup, and the
//! check that a draft can serve a target at all.

use std::fmt;
use std::str::FromStr;

use super::adapt::AdaptiveK;
use crate::backend::MAX_TOP_K;
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;

/// Candidates per position when a fan-out strategy is not told its budget.
pub const DEFAULT_WIDTH: usize = 3;

/// Off: SD's draft model drafts all K tokens of every round (see [`SpecConfig::confidence`]).
pub const DEFAULT_CONFIDENCE: f32 = 0.0;

/// How many of its likeliest tokens the draft samples among (see [`SpecConfig::draft_candidates`]).
pub const DEFAULT_DRAFT_CANDIDATES: usize = 64;

/// What SSD does when the verification outcome is not in the speculation cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "lowercase"))]
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

/// How SSD spreads its branches over the verification outcomes (SSD's fan-out policy carries
/// the strategy out).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Fanout {
    /// The same number of candidates for every k.
    Uniform(usize),
    /// The paper's geometric allocation of a budget of branches (`None`: `DEFAULT_WIDTH` per
    /// position).
    Geometric(Option<usize>),
    /// Candidate sets holding this much draft probability, under a budget that follows the hit
    /// rate.
    TopP(f32),
}

impl Default for Fanout {
    fn default() -> Self {
        Fanout::Uniform(DEFAULT_WIDTH)
    }
}

impl Fanout {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::option("fanout", m));
        match *self {
            Fanout::Uniform(0) => bad("uniform fan-out needs at least 1 candidate per position".into()),
            Fanout::Geometric(Some(0)) => bad("geometric fan-out needs a budget of at least 1 branch".into()),
            Fanout::TopP(p) if !(p > 0.0 && p <= 1.0) => bad(format!("top-p fan-out needs p in (0, 1], got {p}")),
            _ => Ok(()),
        }
    }

    /// The most branches a round with `k` draft tokens can have: the tree's KV scratch is this
    /// many slots per tree step.
    pub fn max_branches(&self, k: usize) -> usize {
        match *self {
            Fanout::Uniform(f) => f * (k + 1),
            Fanout::Geometric(budget) => budget.unwrap_or(DEFAULT_WIDTH * (k + 1)),
            Fanout::TopP(_) => 2 * DEFAULT_WIDTH * (k + 1),
        }
    }
}

impl FromStr for Fanout {
    type Err = Error;

    /// `uniform:F`, `geometric`, `geometric:B` or `top-p:P`.
    fn from_str(s: &str) -> Result<Self> {
        let bad =
            || Error::option("fanout", format!("'{s}': expected uniform:F, geometric, geometric:B or top-p:P"));
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let f = match (name, arg) {
            ("uniform", Some(a)) => Fanout::Uniform(a.parse().map_err(|_| bad())?),
            ("geometric", None) => Fanout::Geometric(None),
            ("geometric", Some(a)) => Fanout::Geometric(Some(a.parse().map_err(|_| bad())?)),
            ("top-p", Some(a)) => Fanout::TopP(a.parse().map_err(|_| bad())?),
            _ => return Err(bad()),
        };
        f.validate()?;
        Ok(f)
    }
}

impl fmt::Display for Fanout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fanout::Uniform(w) => write!(f, "uniform:{w}"),
            Fanout::Geometric(None) => write!(f, "geometric"),
            Fanout::Geometric(Some(b)) => write!(f, "geometric:{b}"),
            Fanout::TopP(p) => write!(f, "top-p:{p}"),
        }
    }
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
    /// SD with a draft model: a round's drafting stops at a position where the draft's likeliest
    /// token has less than this probability, so K is a maximum (0 = always K). What it drew there
    /// would likely be rejected, its verification and the draft steps after it spent for
    /// nothing. Output is unchanged: the target verifies whatever is proposed.
    pub confidence: f32,
    /// When sampling: the draft draws each token among its this many likeliest tokens, so only
    /// their ids and logits leave its backend, not a row over the whole vocabulary. Fewer read
    /// back less; more keep the draft's tail mass, which the target may accept. Output is
    /// unchanged: verification uses the distribution each token was drawn from.
    pub draft_candidates: usize,
    /// SD: where set (mode auto), K is chosen again after every round from the acceptance the
    /// generation has shown so far; `k` is then the first round's K.
    #[serde(skip)]
    pub adapt: Option<AdaptiveK>,
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
        SpecConfig {
            k,
            fanout,
            saguaro_c,
            backup,
            confidence: DEFAULT_CONFIDENCE,
            draft_candidates: DEFAULT_DRAFT_CANDIDATES,
            adapt: None,
            fault: None,
        }
    }

    pub fn validate(&self) -> Result<()> {
        if self.k == 0 || self.k > 64 {
            return Err(Error::option("spec_k", format!("draft tokens per round must be in 1..=64, got {}", self.k)));
        }
        let c = self.saguaro_c;
        if !(0.0..=1.0).contains(&c) {
            return Err(Error::option("saguaro_c", format!("must be in [0, 1] (1 disables it), got {c}")));
        }
        let p = self.confidence;
        if !(0.0..1.0).contains(&p) {
            return Err(Error::option("draft_confidence", format!("must be in [0, 1) (0 disables it), got {p}")));
        }
        let n = self.draft_candidates;
        if !(1..=MAX_TOP_K).contains(&n) {
            return Err(Error::option("draft_candidates", format!("must be in 1..={MAX_TOP_K}, got {n}")));
        }
        self.fanout.validate()
    }
}

/// Prompt lookup (`crate::decode::ngram`): matches are tried from `max` suffix tokens down to `min`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    pub min: usize,
    pub max: usize,
}

impl Default for NgramConfig {
    /// One-token matches propose mostly noise, which costs verification; three tokens of context
    /// find the copied passage.
    fn default() -> Self {
        NgramConfig { min: 2, max: 3 }
    }
}

impl NgramConfig {
    pub fn validate(&self) -> Result<()> {
        if self.min == 0 || self.min > self.max {
            return Err(Error::InvalidArgument(format!(
                "n-gram lengths must satisfy 1 <= min <= max, got {}..{}",
                self.min, self.max
            )));
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cli_strings() {
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
        assert!(bad(|c| c.confidence = 1.0));
        assert!(bad(|c| c.confidence = -0.1));
        assert!(bad(|c| c.confidence = f32::NAN));
        assert!(bad(|c| c.fanout = Fanout::Uniform(0)));
        assert!(bad(|c| c.draft_candidates = 0));
        assert!(bad(|c| c.draft_candidates = MAX_TOP_K + 1));
    }

    #[test]
    fn draft_vocabulary_must_match() {
        let cfg = ModelConfig::tiny();
        assert!(check_draft(&cfg, &cfg.clone()).is_ok());
        let other = ModelConfig { vocab_size: 17, ..cfg.clone() };
        let err = check_draft(&cfg, &other).unwrap_err();
        assert!(matches!(err, Error::IncompatibleDraft(_)), "{err}");
        assert!(err.to_string().contains("16") && err.to_string().contains("17"), "{err}");
    }

    #[test]
    fn parses_and_prints_strategies() {
        for (s, f) in [
            ("uniform:3", Fanout::Uniform(3)),
            ("geometric", Fanout::Geometric(None)),
            ("geometric:12", Fanout::Geometric(Some(12))),
            ("top-p:0.9", Fanout::TopP(0.9)),
        ] {
            assert_eq!(s.parse::<Fanout>().unwrap(), f);
            assert_eq!(f.to_string(), s);
        }
        for bad in ["uniform", "uniform:0", "uniform:x", "geometric:0", "top-p:0", "top-p:1.5", "top-p", "fixed:3"] {
            assert!(bad.parse::<Fanout>().is_err(), "{bad} should not parse");
        }
    }
}
