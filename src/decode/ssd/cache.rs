//! The speculation cache: verification outcome (k, t*) -> the next round's draft tokens (and,
//! when sampling, the distributions they were drawn from). Built from one round's tree and
//! consumed by that round's outcome, so it never holds more than one round.

use std::collections::HashMap;

use crate::decode::speculation::Proposal;

#[derive(Default)]
pub struct SpecCache {
    index: HashMap<(usize, u32), usize>,
    branches: Vec<Proposal>,
}

impl SpecCache {
    /// `keys[b]` = the outcome (k, t*) that branch `branches[b]` speculated on.
    pub fn new(keys: &[(usize, u32)], branches: Vec<Proposal>) -> Self {
        debug_assert_eq!(keys.len(), branches.len());
        let index = keys.iter().enumerate().map(|(b, &key)| (key, b)).collect();
        SpecCache { index, branches }
    }

    /// On a hit, the speculation for outcome (`accepted`, `bonus`), cut to `depth` tokens (a
    /// prefix of a drafted sequence is itself a valid proposal).
    pub fn take(&mut self, accepted: usize, bonus: u32, depth: usize) -> Option<Proposal> {
        let &b = self.index.get(&(accepted, bonus))?;
        let mut p = std::mem::take(&mut self.branches[b]);
        p.tokens.truncate(depth);
        p.q.truncate(depth);
        Some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn branch(tokens: &[u32], with_q: bool) -> Proposal {
        let q = if with_q { tokens.iter().map(|&t| vec![t as f32; 2]).collect() } else { vec![] };
        Proposal { tokens: tokens.to_vec(), q }
    }

    #[test]
    fn lookup_is_keyed_by_accepted_count_and_bonus_token() {
        let keys = [(0, 5), (0, 6), (2, 5)];
        let cache = || {
            SpecCache::new(&keys, vec![branch(&[1, 2, 3], true), branch(&[4, 5, 6], true), branch(&[7, 8, 9], true)])
        };
        assert_eq!(cache().take(1, 5, 3), None, "same token, other k: a miss");
        assert_eq!(cache().take(0, 7, 3), None);
        assert_eq!(cache().take(0, 6, 3).unwrap().tokens, vec![4, 5, 6]);
        let hit = cache().take(2, 5, 2).unwrap();
        assert_eq!(hit.tokens, vec![7, 8], "cut to the depth the round allows");
        assert_eq!(hit.q, vec![vec![7.0; 2], vec![8.0; 2]], "with the distributions they were drawn from");
        let greedy = SpecCache::new(&[(1, 3)], vec![branch(&[4], false)]).take(1, 3, 4).unwrap();
        assert_eq!((greedy.tokens, greedy.q.len()), (vec![4], 0));
        assert_eq!(SpecCache::default().take(0, 0, 1), None);
    }
}
