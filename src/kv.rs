//! KV-cache bookkeeping. The backend owns the storage (`Backend::Cache`, slots `0..capacity`);
//! this tracks how many leading slots hold the committed sequence. Rollback after a rejected
//! speculation is `truncate`: stale slots beyond `len` are simply overwritten later.

use crate::error::{Error, Result};

pub struct KvCache<C> {
    pub(crate) store: C,
    len: usize,
    capacity: usize,
}

impl<C> KvCache<C> {
    pub fn new(store: C, capacity: usize) -> Self {
        KvCache { store, len: 0, capacity }
    }

    /// Slots holding the committed sequence.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Roll back to the first `len` slots (no-op if already shorter).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Mark `n` more slots, just written by a causal batch starting at `len`, as committed.
    pub fn advance(&mut self, n: usize) -> Result<()> {
        let new = self.len + n;
        if new > self.capacity {
            return Err(Error::ContextOverflow { prompt: self.len, requested: n, context: self.capacity });
        }
        self.len = new;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_and_advance_keep_bookkeeping() {
        let mut kv = KvCache::new((), 10);
        kv.advance(6).unwrap();
        assert_eq!(kv.len(), 6);
        kv.truncate(4);
        assert_eq!(kv.len(), 4);
        kv.truncate(9);
        assert_eq!(kv.len(), 4, "truncate never grows");
        kv.advance(6).unwrap();
        assert_eq!(kv.len(), 10);
        let err = kv.advance(1).unwrap_err();
        assert!(matches!(err, Error::ContextOverflow { context: 10, .. }), "{err}");
        assert_eq!(kv.len(), 10, "a failed advance changes nothing");
    }
}
