//! Attention over the GPU KV cache: write the batch's K/V into its slots, then one workgroup per
//! KV head and block of 8 queries (consecutive rows x that head's query heads, so each K and V
//! row is read once for all of them) attends the slots the mask gives each row (a causal prefix, cut to a sliding window
//! where the layer has one, plus explicit extra slots for tree batches), with the softmax
//! computed online.

use crate::backend::{AttnShape, Batch};
use crate::error::{Error, Result};

use super::buffers::Meta;
use super::encoder::f;
use super::pipelines::ATTENTION;
use super::{groups, shape_check, Cache, GpuBackend, Tensor};

/// Head dimensions the kernel holds (64 threads x 4 values each). A kernel is built for the
/// values per thread a head needs, so that a 64-wide head does not carry (and multiply) 256.
const MAX_HEAD_DIM: usize = 256;
/// Queries one workgroup attends for (`QMAX` in attention.wgsl).
const QUERIES: usize = 8;

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
        shape_check(
            k.cols == kv_dim
                && v.cols == kv_dim
                && q.cols == s.n_heads * s.head_dim
                && q.rows == m
                && k.rows == m
                && v.rows == m
                && s.n_kv_heads * s.head_dim == kv_dim
                && s.n_kv_heads > 0
                && s.n_heads.is_multiple_of(s.n_kv_heads)
                && batch.slots.len() == m
                && mask.prefix.len() == m
                && mask.extra.len() == m * mask.extra_stride,
            "attention",
        )?;
        if s.head_dim > MAX_HEAD_DIM {
            return Err(Error::Unsupported(format!("head dimension {} (the GPU supports up to {MAX_HEAD_DIM})", s.head_dim)));
        }
        if layer >= cache.k.len() {
            return Err(Error::InvalidArgument(format!("layer {layer} of a {}-layer cache", cache.k.len())));
        }
        let extent = batch.slot_extent();
        if extent > cache.capacity {
            return Err(Error::ContextOverflow { prompt: extent, requested: 0, context: cache.capacity });
        }
        let start = (0..m).map(|r| batch.window_start(r, s.window) as u32);
        let key: Vec<u32> =
            batch.slots.iter().chain(&mask.prefix).copied().chain(start).chain(mask.extra.iter().copied()).collect();
        let meta = self.meta(Meta::Mask, &key, |k| k.to_vec())?;
        let params = [
            m as u32,
            s.n_heads as u32,
            (s.n_heads / s.n_kv_heads) as u32,
            s.head_dim as u32,
            kv_dim as u32,
            mask.extra_stride as u32,
            f(s.scale),
        ];
        let cache_bytes = (cache.capacity.max(1) * kv_dim * 4) as u64;
        let (kc, vc) = ((5, &cache.k[layer], cache_bytes), (6, &cache.v[layer], cache_bytes));
        let meta_bind = (4, &meta, meta.size());
        let dims = s.head_dim.div_ceil(64).to_string();
        let vars = [("DIMS", dims.as_str())];
        let write = self.kernel(&ATTENTION, "kv_write", &vars)?;
        self.dispatch(&write, &params, &[k.bind(2), v.bind(3), meta_bind, kc, vc], groups(m * kv_dim, 64)?)?;
        let out = self.tensor(m, q.cols)?;
        let attend = self.kernel(&ATTENTION, "attend", &vars)?;
        // One workgroup per KV head and block of QUERIES (rows x query heads) of it.
        let blocks = (m * (s.n_heads / s.n_kv_heads)).div_ceil(QUERIES);
        self.dispatch(&attend, &params, &[q.bind(1), meta_bind, kc, vc, out.bind(7)], groups(s.n_kv_heads * blocks, 1)?)?;
        Ok(out)
    }
}
