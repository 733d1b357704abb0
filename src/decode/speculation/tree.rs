//! SSD's speculation tree: every branch (k, t) continues the committed prefix, the glue tokens
//! rec, s1..sk and the candidate bonus token t, for `depth` draft steps. All branches advance
//! together: one batched draft forward per step, with a tree mask instead of a causal one.
//!
//! Its slots are scratch of the draft's KV cache, under the rules of the `kv` module, whose
//! `DraftKv::tree` runs it. Layout of a round whose glue pass wrote [rec, s1..sn] at slots base..=base+n:
//! tree step j of branch b writes slot `base + n + 1 + j * width + b`, so steps never collide
//! and the glue slots stay intact. Branch (k, t) at step j sits at rope position
//! base + k + 1 + j (right after the k glue tokens it keeps) and attends to slots
//! [0, base + k + 1) plus its own tree slots of steps 0..=j.

use super::config::SpecConfig;
use super::drafter::{Drafting, Proposal};
use crate::backend::{Batch, Mask, NO_SLOT};
use crate::error::Result;
use crate::model::runner::Lm;
use crate::runtime::Span;

pub struct Tree {
    base: usize,
    glue_len: usize,
    /// (k, candidate bonus token) of each branch.
    branches: Vec<(usize, u32)>,
}

impl Tree {
    /// The tree over a glue pass of `glue_len` tokens written at slot `base` onwards.
    pub fn new(base: usize, glue_len: usize, branches: Vec<(usize, u32)>) -> Self {
        debug_assert!(branches.iter().all(|&(k, _)| k < glue_len));
        Tree { base, glue_len, branches }
    }

    pub fn branches(&self) -> &[(usize, u32)] {
        &self.branches
    }

    pub fn width(&self) -> usize {
        self.branches.len()
    }

    /// KV slots beyond the committed sequence that a round of `n` draft tokens, `width`
    /// branches and `depth` tree steps writes.
    pub fn scratch(n: usize, width: usize, depth: usize) -> usize {
        n + 1 + width * depth
    }

    fn slot(&self, step: usize, branch: usize) -> u32 {
        (self.base + self.glue_len + step * self.width() + branch) as u32
    }

    /// The batch of tree step `step`, where branch b feeds `inputs[b]` (its candidate at step 0,
    /// then the token it drafted at the previous step).
    pub fn step(&self, step: usize, inputs: &[u32]) -> Batch {
        let width = self.width();
        debug_assert_eq!(inputs.len(), width);
        let stride = step + 1;
        let mut extra = Vec::with_capacity(width * stride);
        for b in 0..width {
            extra.extend((0..=step).map(|s| self.slot(s, b)));
        }
        Batch {
            tokens: inputs.to_vec(),
            positions: self.branches.iter().map(|&(k, _)| (self.base + k + 1 + step) as u32).collect(),
            slots: (0..width).map(|b| self.slot(step, b)).collect(),
            mask: Mask {
                prefix: self.branches.iter().map(|&(k, _)| (self.base + k + 1) as u32).collect(),
                extra_stride: stride,
                extra,
                base: vec![],
            },
            allowed: None,
        }
    }

    /// Run `depth` tree steps on the draft and return each branch's drafted tokens (with their
    /// distributions when sampling) and the time each step took. Stops early, with the branches
    /// cut short, once `stop` says so (the generation this tree was for has ended or is cancelled).
    pub(super) async fn decode(
        &self,
        lm: &mut dyn Lm,
        depth: usize,
        drafting: &mut Drafting<'_>,
        stop: &dyn Fn() -> bool,
    ) -> Result<(Vec<Proposal>, Vec<Span>)> {
        let width = self.width();
        let vocab = lm.config().vocab_size;
        let rows: Vec<u32> = (0..width as u32).collect();
        let none = vec![NO_SLOT; width];
        let mut branches = vec![Proposal::default(); width];
        let mut inputs: Vec<u32> = self.branches.iter().map(|&(_, t)| t).collect();
        let mut spans = Vec::with_capacity(depth);
        for step in 0..depth {
            if width == 0 || stop() {
                break;
            }
            let start = web_time::Instant::now();
            let batch = self.step(step, &inputs);
            if drafting.params.is_greedy() {
                inputs = lm.argmax(&batch, &rows).await?;
            } else {
                let top = lm.top_k(&batch, &rows, drafting.width(), drafting.params.temperature, &none).await?;
                for b in 0..width {
                    let (ids, values) = top.row(b);
                    let (t, q) = drafting.draw(step, ids, values, vocab);
                    inputs[b] = t;
                    branches[b].q.push(q);
                }
            }
            for (branch, &t) in branches.iter_mut().zip(&inputs) {
                branch.tokens.push(t);
            }
            spans.push(Span::since(start));
        }
        Ok((branches, spans))
    }
}

impl SpecConfig {
    /// KV slots the draft needs beyond prompt + output for SSD's glue pass and tree: size the
    /// draft's cache with this.
    pub fn draft_scratch(&self) -> usize {
        Tree::scratch(self.k, self.fanout.max_branches(self.k), self.k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_mask_attends_to_prefix_glue_and_own_branch() {
        // Committed 10 tokens; glue [rec, s1, s2] at slots 10..=12; branches for k = 0, 2, 2.
        let tree = Tree::new(10, 3, vec![(0, 7), (2, 8), (2, 9)]);
        assert_eq!(Tree::scratch(2, 3, 4), 3 + 12);
        let b0 = tree.step(0, &[7, 8, 9]);
        assert_eq!(b0.tokens, vec![7, 8, 9]);
        assert_eq!(b0.slots, vec![13, 14, 15], "tree slots start after the glue");
        assert_eq!(b0.positions, vec![11, 13, 13], "a branch continues right after its k glue tokens");
        assert_eq!(b0.attended(0, None).collect::<Vec<_>>(), [(0..11).collect::<Vec<_>>(), vec![13]].concat());
        assert_eq!(b0.attended(2, None).collect::<Vec<_>>(), [(0..13).collect::<Vec<_>>(), vec![15]].concat());

        let b2 = tree.step(2, &[1, 2, 3]);
        assert_eq!(b2.slots, vec![19, 20, 21]);
        assert_eq!(b2.positions, vec![13, 15, 15]);
        assert_eq!(b2.mask.extra_stride, 3);
        assert_eq!(b2.mask.extra[3..6], [14, 17, 20], "branch 1 sees its own steps 0..=2 only");
        assert!(!b2.mask.extra.contains(&NO_SLOT));
        assert_eq!(b2.attended(1, None).collect::<Vec<_>>(), [(0..13).collect::<Vec<_>>(), vec![14, 17, 20]].concat());
        assert_eq!(b2.slot_extent(), 22, "within base + scratch");
        assert_eq!(10 + Tree::scratch(2, 3, 3), 22);
    }
}
