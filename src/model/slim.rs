//! A cheaper draft: the same model with its matrices requantized to a smaller format and its
//! output head cut down to the tokens it is most likely to propose.
//!
//! A draft step is bound by the bytes of weights it reads, so fewer bytes make it faster, at the
//! price of proposals the target accepts less often. Neither changes the output: the target
//! verifies every proposal, and a token the pruned head cannot propose has draft probability 0,
//! which the verification's rejection step handles like any token the draft finds unlikely.

use crate::error::{Error, Result};
use crate::storage::quant::{self, DType};
use crate::storage::quantize::quantize;
use crate::model::tokenizer::Tokenizer;
use crate::model::weights::ModelWeights;
use crate::storage::{Bytes, Weight};

/// The format and row length a `from` matrix of rows of `cols` values takes when `want` is asked
/// for: `want`; for Q4_K on rows that are not whole 256-value blocks, either those rows padded
/// with zeros to whole blocks (`pad`) or Q4_K's 32-value counterpart with a min, Q4_1. `None` when
/// that is not smaller than `from` (the matrix stays as it is).
fn format_for(from: DType, cols: usize, want: DType, pad: bool) -> Option<(DType, usize)> {
    let (to, width) = match want {
        DType::Q4K if cols % quant::QK_K != 0 && pad => (want, cols.next_multiple_of(quant::QK_K)),
        DType::Q4K if cols % quant::QK_K != 0 => (DType::Q4_1, cols),
        _ => (want, cols),
    };
    let smaller = match (to.bytes_for(width), from.bytes_for(cols)) {
        (Ok(new), Ok(old)) => new < old,
        _ => false,
    };
    (width % to.block_size() == 0 && smaller).then_some((to, width))
}

/// `w` in format `to` with rows of `width >= w.cols` values (zeros after `w.cols`), through its
/// f32 values, a batch of rows per task.
fn requantize(w: &Weight, to: DType, width: usize) -> Result<Weight> {
    const ROWS: usize = 64;
    let row_bytes = to.bytes_for(width)?;
    let mut out = vec![0u8; row_bytes * w.rows];
    let convert = |(i, chunk): (usize, &mut [u8])| -> Result<()> {
        let first = i * ROWS;
        let rows = chunk.len() / row_bytes;
        let mut values = vec![0.0f32; rows * width];
        for (r, row) in values.chunks_exact_mut(width).enumerate() {
            w.dequantize_row(first + r, row);
        }
        quantize(to, &values, chunk)
    };
    #[cfg(feature = "native")]
    {
        use rayon::prelude::*;
        out.par_chunks_mut(ROWS * row_bytes).enumerate().try_for_each(convert)?;
    }
    #[cfg(not(feature = "native"))]
    out.chunks_mut(ROWS * row_bytes).enumerate().try_for_each(convert)?;
    Weight::new(to, w.rows, width, Bytes::from_vec(out))
}

/// `w` requantized to `want` (see [`format_for`]), or `w` itself.
fn shrink(w: &Weight, want: DType, pad: bool) -> Result<Weight> {
    match format_for(w.dtype, w.cols, want, pad) {
        Some((to, width)) => requantize(w, to, width),
        None => Ok(w.clone()),
    }
}

/// The token ids a pruned head of `n` tokens keeps: ids below `n` (a byte-level BPE vocabulary
/// lists its merges in the order they were learned, most frequent first; on code and English text
/// Qwen 2.5's ids below 65,536 make 98% of the tokens, below 100,000 all but 0.01%), plus the added
/// tokens (chat markers, end of text) and the end-of-generation tokens wherever they are.
pub fn frequent_tokens(tokenizer: &Tokenizer, n: usize, vocab: usize) -> Vec<u32> {
    let n = n.min(vocab) as u32;
    let mut ids: Vec<u32> = (0..n).chain(tokenizer.added_ids()).chain(tokenizer.eos_ids().iter().copied()).collect();
    ids.retain(|&id| (id as usize) < vocab);
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// An error unless `q` is a format a draft can be requantized to.
pub fn check_quant(q: DType) -> Result<()> {
    if [DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4K].contains(&q) {
        Ok(())
    } else {
        Err(Error::option("draft_quant", format!("{} is not one of q8_0, q4_0, q4_1, q4_k", q.name())))
    }
}

/// How to make a draft cheaper.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Slimming {
    /// Requantize every matrix (the output head included, the embedding table not: a step reads
    /// one of its rows per token) to this format where it is smaller than the matrix's own.
    /// Q4_K rows that are not whole 256-value blocks take Q4_1, or see `pad_rows`. One of Q8_0,
    /// Q4_0, Q4_1, Q4_K.
    pub quant: Option<DType>,
    /// Pad Q4_K rows that are not whole 256-value blocks with zeros to whole blocks instead of
    /// taking Q4_1. Only the CPU backend's matmul takes such a matrix (it pads its input with zeros
    /// alike). On Qwen 2.5 0.5B's rows of 896 values the padding adds 14% to their values, but a
    /// Q4_K value costs the CPU kernels about a third fewer instructions than a Q4_1 one, and a
    /// draft step there is bound by instructions, not by the memory bus.
    pub pad_rows: bool,
    /// Keep only these rows of the output head (sorted token ids, see [`frequent_tokens`]).
    pub head: Option<Vec<u32>>,
}

impl Slimming {
    /// A copy of `w`, made cheaper. The copied matrices live in memory of their own; the rest
    /// still shares `w`'s storage.
    pub fn apply(&self, w: &ModelWeights) -> Result<ModelWeights> {
        self.quant.map_or(Ok(()), check_quant)?;
        let mut out = w.clone();
        if let Some(tokens) = &self.head {
            out.output = head_rows(&w.output, tokens)?;
            out.head_tokens = Some(tokens.clone());
        }
        if let Some(q) = self.quant {
            for l in &mut out.layers {
                for m in [&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo, &mut l.w_gate, &mut l.w_up, &mut l.w_down] {
                    *m = shrink(m, q, self.pad_rows)?;
                }
            }
            out.output = shrink(&out.output, q, self.pad_rows)?;
        }
        Ok(out)
    }
}

/// The rows of `head` for `tokens` (sorted, distinct, each a row of `head`).
fn head_rows(head: &Weight, tokens: &[u32]) -> Result<Weight> {
    let valid = !tokens.is_empty()
        && tokens.windows(2).all(|p| p[0] < p[1])
        && tokens.last().is_some_and(|&t| (t as usize) < head.rows);
    if !valid {
        return Err(Error::option(
            "draft_head",
            format!("the kept tokens must be distinct, sorted ids of the {}-token head", head.rows),
        ));
    }
    let mut data = Vec::with_capacity(tokens.len() * head.row_bytes());
    for &t in tokens {
        data.extend_from_slice(head.row(t as usize));
    }
    Weight::new(head.dtype, tokens.len(), head.cols, Bytes::from_vec(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_larger_formats_are_requantized() {
        // Qwen 2.5 0.5B's rows of 896 values (3.5 blocks of 256) and its 4864-value ffn_down rows.
        for pad in [false, true] {
            assert_eq!(format_for(DType::Q5_0, 896, DType::Q4_0, pad), Some((DType::Q4_0, 896)));
            assert_eq!(format_for(DType::Q6K, 4864, DType::Q4K, pad), Some((DType::Q4K, 4864)));
            assert_eq!(format_for(DType::Q4K, 4864, DType::Q4_0, pad), None, "same size");
            assert_eq!(format_for(DType::Q4K, 4864, DType::Q4_1, pad), None, "larger");
            assert_eq!(format_for(DType::Q5_0, 896, DType::Q8_0, pad), None);
            assert_eq!(format_for(DType::F16, 896, DType::Q8_0, pad), Some((DType::Q8_0, 896)));
            assert_eq!(format_for(DType::F32, 40, DType::Q4_0, pad), None, "not whole blocks");
        }
        assert_eq!(format_for(DType::Q8_0, 896, DType::Q4K, false), Some((DType::Q4_1, 896)));
        assert_eq!(format_for(DType::Q8_0, 896, DType::Q4K, true), Some((DType::Q4K, 1024)));
        // Padded, 128 values of Q4_1 (80 bytes) would take 256 of Q4_K (144): kept as they are.
        assert_eq!(format_for(DType::Q4_1, 128, DType::Q4K, true), None);
    }

    fn matrix(rows: usize, cols: usize) -> Weight {
        let v: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
        Weight::from_f32(rows, cols, &v)
    }

    #[test]
    fn requantized_rows_are_the_quantized_values() {
        let w = matrix(130, 256);
        for pad in [false, true] {
            let got = shrink(&w, DType::Q4K, pad).unwrap();
            assert_eq!((got.dtype, got.rows, got.cols), (DType::Q4K, 130, 256));
            let mut want = vec![0u8; DType::Q4K.bytes_for(130 * 256).unwrap()];
            quantize(DType::Q4K, &w.to_f32(), &mut want).unwrap();
            assert_eq!(got.data.as_slice(), &want[..]);
        }
    }

    #[test]
    fn padded_rows_are_the_quantized_values_then_zeros() {
        let w = matrix(5, 896);
        let got = shrink(&w, DType::Q4K, true).unwrap();
        assert_eq!((got.dtype, got.rows, got.cols), (DType::Q4K, 5, 1024));
        let mut padded = vec![0.0f32; 5 * 1024];
        for (r, row) in padded.chunks_exact_mut(1024).enumerate() {
            w.dequantize_row(r, row);
        }
        let mut want = vec![0u8; DType::Q4K.bytes_for(5 * 1024).unwrap()];
        quantize(DType::Q4K, &padded, &mut want).unwrap();
        assert_eq!(got.data.as_slice(), &want[..]);
        let back = got.to_f32();
        assert!(back.chunks_exact(1024).all(|row| row[896..].iter().all(|&v| v == 0.0)), "the padding dequantizes to zeros");
    }

    #[test]
    fn head_rows_are_the_kept_tokens() {
        let w = matrix(10, 32);
        let h = head_rows(&w, &[1, 4, 9]).unwrap();
        assert_eq!(h.rows, 3);
        assert_eq!(h.row(1), w.row(4));
        assert_eq!(h.row(2), w.row(9));
        for bad in [&[][..], &[4, 1], &[1, 1], &[3, 10]] {
            assert!(head_rows(&w, bad).is_err(), "{bad:?}");
        }
    }
}
