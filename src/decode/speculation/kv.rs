//! The draft model's KV cache, and the one type that writes it: [`DraftKv`]. SD's model drafter
//! and SSD's draft worker both hold their draft model in one, so these rules hold for both.
//!
//! - Committed prefix. Slots `[0, prefix)` hold the committed sequence (prompt and output) in
//!   order, less its newest tokens, which the draft has not been fed: always `rec`, the token the
//!   target added last (it arrives with the next round), and, after SD's target accepted a whole
//!   proposal, the last draft token, which drafting never feeds. These are the unfed tokens; the
//!   next run feeds them first. Only a prefill and a resolution move the prefix.
//! - Scratch. Whatever a round writes lies past the prefix and commits nothing by itself. A run
//!   writes causally from slot `prefix` on: the unfed tokens, `rec`, then draft tokens. SD's
//!   drafting and SSD's backup feed each drafted token to draw the next, so their last one is
//!   never written (unless a confidence stop dropped the token drawn after it); SSD's glue pass
//!   writes a whole proposal at once, and its tree fills the slots after the glue pass ([`Tree`]
//!   lays them out). A new run replaces an unresolved one, and [`DraftKv::discard`] forgets one:
//!   stale slots are simply overwritten later.
//! - Resolution. When the target's outcome (k, t*) arrives, the run's leading tokens that the
//!   target committed (the fed ones and s1..sk, as far as the run wrote them) join the prefix and
//!   the rest of the scratch is forgotten. Committed tokens the run did not write stay unfed; t*
//!   is the next round's `rec`.
//! - Room. SD's runs stay within the length the output may reach. SSD's glue pass and tree write
//!   up to [`Tree::scratch`] slots past the prefix, so SSD's draft keeps
//!   [`SpecConfig::draft_scratch`](super::SpecConfig::draft_scratch) slots beyond the context it
//!   follows.
//!
//! A run is appended to the model like committed tokens (so the model's own length counts it);
//! resolving or discarding the run brings that length back to the prefix.

use std::sync::Arc;

use super::drafter::{Drafting, Proposal};
use super::tree::Tree;
use crate::backend::{Allowed, TopK, NO_SLOT};
use crate::decode::generation::costs::DraftCosts;
use crate::error::{Error, Result};
use crate::grammar::Constraint;
use crate::model::runner::{append, append_masked, Lm, Output, Want};
use crate::runtime::Span;

/// A draft model however it is held: borrowed by SD, owned by SSD's worker (and `Send` when the
/// worker is a thread).
pub trait DraftLm {
    fn get(&self) -> &dyn Lm;
    fn get_mut(&mut self) -> &mut dyn Lm;
}

impl DraftLm for &mut dyn Lm {
    fn get(&self) -> &dyn Lm {
        &**self
    }
    fn get_mut(&mut self) -> &mut dyn Lm {
        &mut **self
    }
}

impl DraftLm for Box<dyn Lm> {
    fn get(&self) -> &dyn Lm {
        &**self
    }
    fn get_mut(&mut self) -> &mut dyn Lm {
        &mut **self
    }
}

impl DraftLm for Box<dyn Lm + Send> {
    fn get(&self) -> &dyn Lm {
        &**self
    }
    fn get_mut(&mut self) -> &mut dyn Lm {
        &mut **self
    }
}

/// The draft model with its committed prefix and the round's run.
pub(crate) struct DraftKv<M> {
    lm: M,
    prefix: usize,
    /// Committed tokens past the prefix, before the next `rec`.
    unfed: Vec<u32>,
    run: Run,
}

/// What one round wrote past the prefix, causally from slot `prefix` on.
#[derive(Default)]
struct Run {
    /// The unfed tokens and `rec`, then the draft tokens.
    line: Vec<u32>,
    /// How many leading tokens of `line` were committed when the run began.
    fed: usize,
    /// How many leading tokens of `line` the run wrote.
    written: usize,
}

impl<M: DraftLm> DraftKv<M> {
    pub fn new(lm: M) -> Self {
        DraftKv { lm, prefix: 0, unfed: Vec::new(), run: Run::default() }
    }

    /// The model, for its configuration and capacity.
    pub fn model(&self) -> &dyn Lm {
        self.lm.get()
    }

    /// Begin a generation: the prompt is the whole committed prefix.
    pub async fn prefill(&mut self, prompt: &[u32]) -> Result<()> {
        let lm = self.lm.get_mut();
        lm.truncate(0);
        self.prefix = 0;
        self.unfed.clear();
        self.run = Run::default();
        // Nothing of the output is used: its top entry, the least an append reads back.
        append(lm, prompt, Want::LastTopK { k: 1, temperature: 1.0 }).await?;
        self.prefix = prompt.len();
        Ok(())
    }

    /// Draft up to `n` tokens after `rec` autoregressively: the run feeds the unfed tokens and
    /// `rec`, then each drafted token but the last, to draw the next. Drafting stops at a
    /// position where the draft's likeliest token has less than `confidence` probability (0
    /// drafts all `n`): the target would likely reject what it drew there, and that token's
    /// verification and the steps after it would be spent for nothing. The stop looks at the
    /// distribution, never at the token drawn from it: a proposed token must be distributed as
    /// the q that verification is given, which a stop depending on the draw would skew.
    ///
    /// Under a `grammar`, each position is masked as it masks the output, the grammar walked
    /// along the draft and rolled back after; drafting stops after a stop token, where the
    /// grammar is complete, and where the draft's pick is not allowed (a pruned head may score
    /// none of the allowed tokens).
    pub async fn draft(
        &mut self,
        rec: u32,
        n: usize,
        confidence: f32,
        drafting: &mut Drafting<'_>,
        mut grammar: Option<&mut Constraint>,
    ) -> Result<Proposal> {
        let mut walked = 0;
        let proposal = self.draft_walking(rec, n, confidence, drafting, &mut grammar, &mut walked).await;
        if let Some(g) = grammar {
            g.rollback(walked)?;
        }
        proposal
    }

    async fn draft_walking(
        &mut self,
        rec: u32,
        n: usize,
        confidence: f32,
        drafting: &mut Drafting<'_>,
        grammar: &mut Option<&mut Constraint>,
        walked: &mut usize,
    ) -> Result<Proposal> {
        self.open(rec, &[]);
        let mut p = Proposal { tokens: Vec::with_capacity(n), q: Vec::new() };
        let greedy = drafting.params.is_greedy();
        for j in 0..n {
            let mask = grammar.as_deref_mut().map(Constraint::allowed).transpose()?;
            let (t, prob) = if greedy && confidence <= 0.0 {
                (*self.feed(Want::AllArgmax, mask.as_deref()).await?.argmax().last().expect("a non-empty input"), 1.0)
            } else if greedy {
                // The greedy token and its softmax probability, from the row's top entry and
                // log-sum-exp: the row itself stays on the backend.
                let top = self.feed(Want::LastTopK { k: 1, temperature: 1.0 }, mask.as_deref()).await?.top_k();
                let (t, v) = (top.ids[0], top.values[0]);
                // An infinite top logit is certain; a row of NaN gives 0, which stops drafting.
                (t, if v == f32::INFINITY { 1.0 } else { (v - top.lse[0]).exp().max(0.0) })
            } else {
                let want = Want::LastTopK { k: drafting.width(), temperature: drafting.params.temperature };
                let top = self.feed(want, mask.as_deref()).await?.top_k();
                let (ids, values) = top.row(0);
                let (t, q) = drafting.draw(j, ids, values, self.lm.get_mut().config().vocab_size);
                let top = q.iter().copied().fold(0.0, f32::max);
                p.q.push(q);
                (t, top)
            };
            let refused = mask.as_ref().is_some_and(|m| m[t as usize / 32] >> (t % 32) & 1 == 0);
            if prob < confidence || refused {
                p.q.truncate(j);
                break;
            }
            p.tokens.push(t);
            self.run.line.push(t);
            if let Some(g) = grammar.as_deref_mut() {
                if g.is_stop(t) {
                    break;
                }
                g.consume(&[t])?;
                *walked += 1;
                if g.complete() {
                    break;
                }
            }
        }
        Ok(p)
    }

    /// SSD's glue pass: a run of the unfed tokens and `tokens` = [rec, s1..sn], all written at
    /// once. Returns the `k` likeliest tokens of the draft's distributions after rec and after
    /// each s_i (n + 1 rows) at `temperature`, row i with the value of s_(i+1): the fan-out's
    /// candidates, without the rows themselves leaving the device.
    pub async fn glue(&mut self, tokens: &[u32], k: usize, temperature: f32) -> Result<TopK> {
        let Some((&rec, drafted)) = tokens.split_first() else {
            return Err(Error::InvalidArgument("a glue pass needs at least the token rec".into()));
        };
        self.open(rec, drafted);
        let unfed = self.run.fed - 1;
        let at = std::iter::repeat_n(NO_SLOT, unfed).chain(drafted.iter().copied()).chain([NO_SLOT]).collect();
        let top = self.feed(Want::AllTopK { k, temperature, at }, None).await?.top_k();
        Ok(top.skip_rows(unfed))
    }

    /// SSD's tree over the glue pass: `depth` batched steps, branch (k, t) continuing rec,
    /// s1..sk with the candidate bonus token t. Writes only the slots after the glue pass. Returns
    /// each branch's draft tokens and each step's time; `stop` cuts the tree short.
    pub async fn tree(
        &mut self,
        branches: &[(usize, u32)],
        depth: usize,
        drafting: &mut Drafting<'_>,
        stop: &dyn Fn() -> bool,
    ) -> Result<(Vec<Proposal>, Vec<Span>)> {
        let unfed = self.run.fed - 1;
        let tree = Tree::new(self.prefix + unfed, self.run.written - unfed, branches.to_vec());
        tree.decode(self.lm.get_mut(), depth, drafting, stop).await
    }

    /// The target accepted `accepted` (at most the run's draft tokens) of the run: what the run
    /// wrote of the tokens the target committed joins the prefix, the others of them stay unfed.
    pub fn resolve(&mut self, accepted: usize) {
        let run = std::mem::take(&mut self.run);
        let committed = run.fed + accepted;
        let kept = committed.min(run.written);
        self.prefix += kept;
        self.lm.get_mut().truncate(self.prefix);
        self.unfed = run.line[kept..committed].to_vec();
    }

    /// Time the model for the engine's choice of mode (see [`DraftCosts::measure`]): this ends
    /// the generation it was following, and leaves the cache empty.
    pub async fn measure(&mut self, tree_rows: usize) -> Result<DraftCosts> {
        self.prefix = 0;
        self.unfed.clear();
        self.run = Run::default();
        DraftCosts::measure(self.lm.get_mut(), tree_rows).await
    }

    /// Forget the run without committing any of it.
    pub fn discard(&mut self) {
        self.run = Run::default();
        self.lm.get_mut().truncate(self.prefix);
    }

    /// Begin a run of the unfed tokens, `rec` and `drafted`, replacing any run not resolved.
    fn open(&mut self, rec: u32, drafted: &[u32]) {
        self.lm.get_mut().truncate(self.prefix);
        let line: Vec<u32> = self.unfed.iter().chain(&[rec]).chain(drafted).copied().collect();
        self.run = Run { fed: self.unfed.len() + 1, written: 0, line };
    }

    /// Write the run's tokens not written yet after the others, and read `want` back, its last
    /// row masked by `mask` where a grammar gives one.
    async fn feed(&mut self, want: Want<'_>, mask: Option<&[u32]>) -> Result<Output> {
        let run = &mut self.run;
        let tokens = &run.line[run.written..];
        let allowed = mask.map(|row| {
            let rows = if matches!(want, Want::AllArgmax) { tokens.len() } else { 1 };
            Arc::new(Allowed::last_of(self.lm.get().config().vocab_size, rows, row))
        });
        let out = append_masked(self.lm.get_mut(), tokens, want, allowed).await?;
        run.written = run.line.len();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Batch;
    use crate::model::config::ModelConfig;
    use crate::sampling::{Rng, SamplingParams};
    use futures::executor::block_on;
    use futures::future::{ready, LocalBoxFuture};

    /// A model that records the first slot and the tokens of each batch it runs, and always
    /// predicts token 9.
    struct Recorder {
        config: ModelConfig,
        len: usize,
        batches: Vec<(u32, Vec<u32>)>,
    }

    impl Lm for Recorder {
        fn config(&self) -> &ModelConfig {
            &self.config
        }
        fn backend_name(&self) -> String {
            "recorder".into()
        }
        fn len(&self) -> usize {
            self.len
        }
        fn capacity(&self) -> usize {
            64
        }
        fn truncate(&mut self, len: usize) {
            self.len = self.len.min(len);
        }
        fn advance(&mut self, n: usize) -> Result<()> {
            if self.len + n > 64 {
                return Err(Error::InvalidArgument("full".into()));
            }
            self.len += n;
            Ok(())
        }
        fn logits<'a>(&'a mut self, batch: &'a Batch, rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<f32>>> {
            self.batches.push((batch.slots[0], batch.tokens.clone()));
            let vocab = self.config.vocab_size;
            Box::pin(ready(Ok(rows.iter().flat_map(|_| (0..vocab).map(|t| if t == 9 { 1.0 } else { 0.0 })).collect())))
        }
        fn argmax<'a>(&'a mut self, batch: &'a Batch, rows: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<u32>>> {
            self.batches.push((batch.slots[0], batch.tokens.clone()));
            Box::pin(ready(Ok(vec![9; rows.len()])))
        }
    }

    fn recorder() -> Recorder {
        let config = ModelConfig::tiny();
        Recorder { config, len: 0, batches: Vec::new() }
    }

    fn draft(kv: &mut DraftKv<&mut dyn Lm>, rec: u32, n: usize) -> Vec<u32> {
        let params = SamplingParams::default();
        let mut rng = Rng::new(0);
        let mut drafting = Drafting { params: &params, rng: &mut rng, saguaro: None, candidates: 64 };
        block_on(kv.draft(rec, n, 0.0, &mut drafting, None)).unwrap().tokens
    }

    #[test]
    fn a_run_commits_only_what_the_target_committed_and_it_wrote() {
        let mut lm = recorder();
        let mut kv = DraftKv::new(&mut lm as &mut dyn Lm);
        block_on(kv.prefill(&[1, 2, 3])).unwrap();
        assert_eq!(draft(&mut kv, 4, 3), vec![9, 9, 9]);
        assert_eq!(kv.model().len(), 6, "rec and two draft tokens written; the last never fed");
        // All 3 accepted: rec, s1, s2 are kept; s3 was never written, so the next run feeds it.
        kv.resolve(3);
        assert_eq!((kv.prefix, kv.model().len(), kv.unfed.clone()), (6, 6, vec![9]));
        draft(&mut kv, 5, 2);
        // One accepted of two: the fed s3 and rec, then s1, join the prefix.
        kv.resolve(1);
        assert_eq!((kv.prefix, kv.unfed.len()), (9, 0));
        // Nothing drafted: the fed rec stays unfed.
        draft(&mut kv, 7, 0);
        kv.resolve(0);
        assert_eq!((kv.prefix, kv.unfed.clone()), (9, vec![7]));
        drop(kv);
        let runs: Vec<_> = lm.batches[1..].to_vec();
        assert_eq!(
            runs,
            vec![(3, vec![4]), (4, vec![9]), (5, vec![9]), (6, vec![9, 5]), (8, vec![9])],
            "each run writes causally from the prefix, unfed tokens first"
        );
    }

    #[test]
    fn a_greedy_draft_stops_where_its_pick_is_unsure() {
        // The recorder's logits: 1 for token 9, 0 for the other 15, so its pick has probability
        // e / (e + 15) = 0.153.
        let drafted = |confidence: f32| {
            let mut lm = recorder();
            let mut kv = DraftKv::new(&mut lm as &mut dyn Lm);
            block_on(kv.prefill(&[1, 2])).unwrap();
            let params = SamplingParams::default();
            let mut rng = Rng::new(0);
            let mut drafting = Drafting { params: &params, rng: &mut rng, saguaro: None, candidates: 64 };
            block_on(kv.draft(3, 4, confidence, &mut drafting, None)).unwrap().tokens
        };
        assert_eq!(drafted(0.15), vec![9; 4]);
        assert_eq!(drafted(0.16), Vec::<u32>::new());
    }

    #[test]
    fn glue_and_tree_stay_scratch_until_resolved() {
        let mut lm = recorder();
        let mut kv = DraftKv::new(&mut lm as &mut dyn Lm);
        block_on(kv.prefill(&[1, 2])).unwrap();
        draft(&mut kv, 3, 2);
        kv.discard();
        assert_eq!(kv.model().len(), 2, "a discarded run leaves the prefix as it was");
        let glue = block_on(kv.glue(&[3, 4, 5], 4, 1.0)).unwrap();
        assert_eq!((glue.rows(), glue.k), (3, 4), "a row after rec and after each draft token");
        assert_eq!(glue.row(0).0[0], 9, "the recorder predicts 9");
        let params = SamplingParams::default();
        let mut rng = Rng::new(0);
        let mut drafting = Drafting { params: &params, rng: &mut rng, saguaro: None, candidates: 64 };
        let (branches, spans) = block_on(kv.tree(&[(0, 6), (2, 7)], 2, &mut drafting, &|| false)).unwrap();
        assert_eq!((branches.len(), spans.len()), (2, 2));
        assert_eq!(kv.model().len(), 5, "the tree commits nothing");
        kv.resolve(1);
        assert_eq!((kv.prefix, kv.model().len(), kv.unfed.len()), (4, 4, 0), "rec and s1 kept");
        drop(kv);
        let slots: Vec<u32> = lm.batches.iter().map(|b| b.0).collect();
        assert_eq!(slots, vec![0, 2, 3, 2, 5, 7], "the glue pass rewrites the backup's slots; the tree follows it");
    }
}
