//! Attention over the GPU KV cache: write the batch's K/V into its slots, then one workgroup per
//! KV head and block of 8 queries (consecutive rows x that head's query heads, so each K and V
//! row is read once for all of them) attends the slots the mask gives each row (a causal prefix, cut to a sliding window
//! where the layer has one, plus explicit extra slots for tree batches), with the softmax
//! computed online. A small batch's walk over a long cache is split into parts attended by
//! workgroups of their own and merged by a second pass (as flash-decoding does), so that a decode
//! does not leave a GPU with two busy workgroups (one per KV head) and the rest idle.

use crate::backend::{check_attention, AttnShape, Batch, CacheDims, KvCache};
use crate::error::{Error, Result};

use super::buffers::Meta;
use super::encoder::f;
use super::pipelines::{wgsl, Shader};
use super::{groups, Cache, GpuBackend, Tensor};

const ATTENTION: Shader = Shader {
    name: "attention",
    source: wgsl!("attention"),
    includes: &[],
    snippets: &[("@kv_f32", wgsl!("kv_f32")), ("@kv_f16", wgsl!("kv_f16"))],
};

/// Head dimensions the kernel holds (64 threads x 4 values each). A kernel is built for the
/// values per thread a head needs, so that a 64-wide head does not carry (and multiply) 256.
const MAX_HEAD_DIM: usize = 256;
/// Queries one workgroup attends for (`QMAX` in attention.wgsl).
const QUERIES: usize = 8;
/// Slots each workgroup walks (two of the kernel's 64-slot chunks) when a small batch's walk is
/// split on a GPU: the part's written state is 1/64 of the K and V it reads.
const SPLIT_SLOTS: usize = 128;
/// The most parts a walk over a full cache is split into: a longer cache takes longer parts, so
/// that the parts' state stays small (and their number depends on the cache, never the batch).
const MAX_PARTS: usize = 64;
/// The largest batch whose walk is split: every batch the matmul's small-batch kernel serves
/// (decodes, verifications up to K = 63, tree steps), so that a verification and its rows'
/// decodes take the same path. A prefill already has a workgroup per block of queries.
const SPLIT_ROWS: usize = 64;

/// Slots per part for the options and whether the adapter computes on the CPU (0: never split).
pub(super) fn split_slots(asked: Option<usize>, cpu_adapter: bool) -> usize {
    match asked {
        // Past 2^24 slots (more than any cache holds) a part is the whole walk anyway.
        Some(n) => n.min(1 << 24).next_multiple_of(64),
        None if cpu_adapter => 0,
        None => SPLIT_SLOTS,
    }
}

impl GpuBackend {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cache: &mut Cache,
        layer: usize,
        batch: &Batch,
        s: AttnShape,
    ) -> Result<Tensor> {
        let (m, kv_dim, mask) = (batch.len(), cache.kv_dim, &batch.mask);
        let dims = CacheDims { layers: cache.k.len(), capacity: cache.capacity, kv_dim };
        check_attention([(q.rows, q.cols), (k.rows, k.cols), (v.rows, v.cols)], dims, layer, batch, &s)?;
        if s.head_dim > MAX_HEAD_DIM {
            return Err(Error::Unsupported(format!("head dimension {} (the GPU supports up to {MAX_HEAD_DIM})", s.head_dim)));
        }
        let start: Vec<u32> = (0..m).map(|r| batch.window_start(r, s.window) as u32).collect();
        let key: Vec<u32> =
            batch.slots.iter().chain(&mask.prefix).chain(&start).chain(&mask.extra).copied().collect();
        let meta = self.meta(Meta::Mask, &key, |k| k.to_vec())?;
        let group = s.n_heads / s.n_kv_heads;
        let stride = cache.kind.stride(kv_dim);
        let part = self.attention_split.max(cache.capacity.div_ceil(MAX_PARTS).next_multiple_of(64));
        let splits = match self.attention_split {
            0 => 1,
            _ if m > SPLIT_ROWS => 1,
            _ => longest_walk(&mask.prefix, &start, mask.extra_stride, group, part).div_ceil(part).max(1),
        };
        // Unsplit, a part past any walk: the shader ends a part at its walk's end or the part's.
        let split = if splits > 1 { part } else { u32::MAX as usize };
        let params = [
            m as u32,
            s.n_heads as u32,
            group as u32,
            s.head_dim as u32,
            kv_dim as u32,
            stride as u32,
            mask.extra_stride as u32,
            f(s.scale),
            split as u32,
            splits as u32,
        ];
        let cache_bytes = (cache.capacity.max(1) * stride * cache.kind.bytes()) as u64;
        let (kc, vc) = ((5, &cache.k[layer], cache_bytes), (6, &cache.v[layer], cache_bytes));
        let meta_bind = (4, &meta, meta.size());
        let dims = s.head_dim.div_ceil(64).to_string();
        let kv = match cache.kind {
            KvCache::F32 => "@kv_f32",
            KvCache::F16 => "@kv_f16",
        };
        let vars = [("DIMS", dims.as_str()), ("KV", kv)];
        let write = self.kernel(&ATTENTION, "kv_write", &vars)?;
        let blocks = m * stride / cache.kind.block();
        self.dispatch(&write, &params, &[k.bind(2), v.bind(3), meta_bind, kc, vc], groups(blocks, 64)?)?;
        let out = self.tensor(m, q.cols)?;
        let attend = self.kernel(&ATTENTION, "attend", &vars)?;
        // One workgroup per KV head, block of QUERIES (rows x query heads) of it and part.
        let workgroups = groups(s.n_kv_heads * (m * group).div_ceil(QUERIES) * splits, 1)?;
        if splits == 1 {
            self.dispatch(&attend, &params, &[q.bind(1), meta_bind, kc, vc, out.bind(7)], workgroups)?;
        } else {
            let parts = self.tensor(m * s.n_heads * splits, s.head_dim + 2)?;
            self.dispatch(&attend, &params, &[q.bind(1), meta_bind, kc, vc, parts.bind(7)], workgroups)?;
            let combine = self.kernel(&ATTENTION, "combine", &vars)?;
            self.dispatch(&combine, &params, &[parts.bind(8), out.bind(7)], groups(m * q.cols, 64)?)?;
        }
        Ok(out)
    }
}

/// The most entries any block of queries walks (as `attend` counts them) when split into parts
/// of `part`: from its rows' lowest window start, rounded down to a multiple of `part`, to their
/// highest prefix, then its rows' extra slots.
fn longest_walk(prefix: &[u32], start: &[u32], stride: usize, group: usize, part: usize) -> usize {
    let queries = prefix.len() * group;
    (0..queries.div_ceil(QUERIES))
        .map(|b| {
            let rows = b * QUERIES / group..=((b * QUERIES + QUERIES).min(queries) - 1) / group;
            let hi = rows.clone().map(|r| prefix[r]).max().unwrap_or(0);
            let lo = rows.clone().map(|r| start[r]).min().unwrap_or(0).min(hi) as usize;
            hi as usize - (lo - lo % part) + rows.count() * stride
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::split_slots;

    #[test]
    fn part_lengths_are_whole_chunks_and_bounded() {
        assert_eq!(split_slots(None, false), 128);
        assert_eq!(split_slots(None, true), 0);
        assert_eq!(split_slots(Some(0), false), 0);
        assert_eq!(split_slots(Some(100), true), 128);
        assert_eq!(split_slots(Some(usize::MAX), false), 1 << 24);
    }
}
