//! The statistics of one generation (the `stats` object of the CLI's `--json` output), including
//! what a target on a server cost.

use serde::Serialize;

use super::costs::Choice;

/// Statistics of one generation (the `stats` object of the CLI's `--json` output).
#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "camelCase", optional_fields))]
pub struct Stats {
    #[cfg_attr(test, ts(as = "crate::decode::Mode"))]
    pub mode: String,
    pub prompt_tokens: usize,
    pub generated: usize,
    pub tokens_per_s: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// Target forwards after prefill (one per token for AR, one per round for SD/SSD).
    pub rounds: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acceptance_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_accepted: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_hit_rate: Option<f64>,
    /// SSD: cache hits that supplied two or more draft tokens (their later tokens were drawn at
    /// tree steps past the first, so a sampled one is verified against a q from such a step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multi_token_hits: Option<usize>,
    pub target_busy_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_busy_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify_ms_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree_step_ms_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub glue_ms_mean: Option<f64>,
    /// SD/SSD: each round's times, for drawing how draft and target overlap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<RoundTimes>>,
    /// When the engine chose the mode and K: its choice and the costs it measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto: Option<Choice>,
    /// With a target on a server: what its requests cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteStats>,
    /// With a grammar: the tokens it forced and what its masks cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grammar: Option<crate::grammar::GrammarStats>,
}

/// What talking to a server target cost, over the requests since its counters were last taken.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "camelCase"))]
pub struct RemoteStats {
    /// Requests answered (each one target forward on the server).
    pub round_trips: usize,
    /// Failed attempts that were sent again.
    pub retries: usize,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Client-side time of the answered requests, and the server's own time for them.
    pub round_trip_ms: f64,
    pub server_ms: f64,
    /// Tokens sent that the server already held in its prefix cache, and all tokens sent.
    pub cached_tokens: usize,
    pub input_tokens: usize,
}

/// One SD/SSD round, in ms from the start of decoding (after the prefill).
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(rename_all = "camelCase"))]
pub struct RoundTimes {
    /// The target's verification forward.
    pub verify: [f64; 2],
    /// The draft's work on this round: SD's drafting before the verify; SSD's glue pass and
    /// tree for the next round, which runs during the verify.
    pub draft: Option<[f64; 2]>,
    pub proposed: usize,
    pub accepted: usize,
    /// SSD: whether the proposal came from the speculation cache.
    pub hit: Option<bool>,
}

impl Stats {
    pub(crate) fn finish(&mut self, generated: usize, decode_ms: f64) {
        self.generated = generated;
        self.decode_ms = decode_ms;
        // The first token comes from the prefill, so the decode phase produced one fewer.
        let decoded = generated.saturating_sub(1) as f64;
        self.tokens_per_s = if decode_ms > 0.0 { decoded * 1000.0 / decode_ms } else { 0.0 };
    }
}

pub(crate) fn elapsed_ms(since: web_time::Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}
