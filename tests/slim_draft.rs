//! A cheaper draft: a pruned output head scores only its kept tokens, exactly as the full head
//! scores them, and every other token gets -inf; rows padded with zeros to whole Q4_K blocks
//! multiply as the unpadded rows do; the kept set and the options are checked.

mod common;
mod util;

use futures::executor::block_on;

use saguaro::engine::EngineOptions;
use saguaro::storage::quant::DType;
use saguaro::model::runner::{append, Want};
use saguaro::model::slim::{frequent_tokens, Slimming};
use saguaro::model::transformer::Transformer;
use saguaro::backend::cpu::{CpuBackend, Precision, Tensor};
use saguaro::backend::Backend;
use saguaro::storage::quantize::quantize;
use saguaro::storage::{Bytes, Weight};
use saguaro::Error;

use common::{runner, tiny_weights};

const VOCAB: usize = 40;

#[test]
fn a_pruned_head_scores_its_tokens_as_the_full_head_does() {
    let w = tiny_weights(5, VOCAB, 2, 1.0);
    let kept = vec![0u32, 3, 7, 20, 39];
    let pruned = Slimming { head: Some(kept.clone()), ..Slimming::default() }.apply(&w).unwrap();
    let prompt = [1u32, 4, 9, 16, 25];
    let mut full = runner(&w, 64);
    let mut cut = runner(&pruned, 64);
    let want = block_on(append(&mut full, &prompt, Want::AllLogits)).unwrap().logits();
    let got = block_on(append(&mut cut, &prompt, Want::AllLogits)).unwrap().logits();
    assert_eq!(got.len(), want.len(), "logits over the whole vocabulary");
    for (row, (g, w)) in got.chunks(VOCAB).zip(want.chunks(VOCAB)).enumerate() {
        for t in 0..VOCAB {
            if kept.contains(&(t as u32)) {
                assert!((g[t] - w[t]).abs() <= 1e-6, "row {row} token {t}: {} vs {}", g[t], w[t]);
            } else {
                assert_eq!(g[t], f32::NEG_INFINITY, "row {row} token {t}");
            }
        }
    }
    // The argmax of the pruned head is the best kept token, by its id in the vocabulary.
    let mut cut = runner(&pruned, 64);
    let best = block_on(append(&mut cut, &prompt, Want::AllArgmax)).unwrap().argmax();
    for (row, &b) in best.iter().enumerate() {
        let w = &want[row * VOCAB..(row + 1) * VOCAB];
        let top = *kept.iter().max_by(|&&a, &&b| w[a as usize].total_cmp(&w[b as usize])).unwrap();
        assert_eq!(b, top, "row {row}");
    }
}

#[test]
fn a_head_that_does_not_match_its_tokens_is_refused() {
    let mut w = tiny_weights(5, VOCAB, 1, 1.0);
    w.head_tokens = Some(vec![0, 1, 2]);
    let err = Transformer::new(CpuBackend::new(1).unwrap(), &w).err().unwrap().to_string();
    assert!(err.contains("output head has 40 rows"), "{err}");
    let bad = Slimming { head: Some(vec![3, 1]), ..Slimming::default() }.apply(&w);
    assert!(matches!(bad, Err(Error::InvalidOption { option: "draft_head", .. })), "{bad:?}");
    let bad = Slimming { quant: Some(DType::Q6K), ..Slimming::default() }.apply(&w);
    assert!(matches!(bad, Err(Error::InvalidOption { option: "draft_quant", .. })), "{bad:?}");
}

#[test]
fn engine_options_name_a_bad_draft_setting() {
    let q = EngineOptions { draft_quant: Some(DType::Q5K), ..EngineOptions::default() }.validate();
    assert!(matches!(q, Err(Error::InvalidOption { option: "draft_quant", .. })), "{q:?}");
    let h = EngineOptions { draft_head: Some(0), ..EngineOptions::default() }.validate();
    assert!(matches!(h, Err(Error::InvalidOption { option: "draft_head", .. })), "{h:?}");
}

#[test]
fn the_kept_tokens_are_the_lowest_ids_and_the_special_ones() {
    let m = util::model(util::QWEN_05B);
    let vocab = m.weights.config.vocab_size;
    let kept = frequent_tokens(&m.tokenizer, 1000, vocab);
    assert_eq!(&kept[..1000], &(0..1000).collect::<Vec<u32>>()[..]);
    for id in m.tokenizer.eos_ids().iter().chain(&m.tokenizer.added_ids()) {
        assert!(kept.binary_search(id).is_ok(), "token {id} ({:?}) is kept", m.tokenizer.id_to_token(*id));
    }
    let im_end = m.tokenizer.token_to_id("<|im_end|>").unwrap();
    assert!(im_end > 150_000 && kept.contains(&im_end), "Qwen's end of turn, {im_end}, is kept");
    assert!(kept.len() < 1100, "{} tokens", kept.len());
    assert_eq!(frequent_tokens(&m.tokenizer, usize::MAX, vocab).len(), vocab, "all tokens at most");
}

/// A Q4_K matrix whose rows of 896 values were padded with zeros to 1,024 (as `Slimming::pad_rows`
/// makes them) multiplies 896-value inputs on the CPU backend as the same values unpadded do, at
/// both precisions and for a single row and a batch.
#[test]
fn rows_padded_to_whole_blocks_multiply_as_the_unpadded_rows() {
    let (n, k, wide) = (7, 896, 1024);
    let value = |i: usize| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 0.2;
    let mut padded = vec![0.0f32; n * wide];
    for (r, row) in padded.chunks_exact_mut(wide).enumerate() {
        row[..k].iter_mut().enumerate().for_each(|(j, v)| *v = value(r * k + j));
    }
    let mut bytes = vec![0u8; DType::Q4K.bytes_for(n * wide).unwrap()];
    quantize(DType::Q4K, &padded, &mut bytes).unwrap();
    let w = Weight::new(DType::Q4K, n, wide, Bytes::from_vec(bytes)).unwrap();
    // The reference: the quantized values, unpadded, as an f32 matrix.
    let deq = w.to_f32();
    let unpadded: Vec<f32> = deq.chunks_exact(wide).flat_map(|row| row[..k].to_vec()).collect();
    assert!(deq.chunks_exact(wide).all(|row| row[k..].iter().all(|&v| v == 0.0)));
    let reference = Weight::from_f32(n, k, &unpadded);
    // The reference runs the float kernel on unquantized activations: 16-bit activations stay
    // within 1.2e-6 of the largest output (measured), 8-bit ones within 3.3e-4.
    for (precision, tolerance) in [(Precision::Exact, 1e-5), (Precision::Fast, 2e-3)] {
        let cpu = CpuBackend::new(2).unwrap().with_precision(precision);
        for m in [1, 5] {
            let x = Tensor::new(m, k, (0..m * k).map(|i| value(i + 31) * 10.0).collect());
            let got = cpu.matmul(&x, &w, None).unwrap();
            let want = cpu.matmul(&x, &reference, None).unwrap();
            assert_eq!((got.rows, got.cols), (m, n));
            let scale = want.data.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            for (i, (g, e)) in got.data.iter().zip(&want.data).enumerate() {
                assert!((g - e).abs() <= tolerance * scale, "{precision:?} m={m} [{i}]: {g} vs {e}");
            }
        }
    }
    // An input as wide as the padded rows is an ordinary matmul; a narrower one by a whole block
    // or more is a shape error.
    let cpu = CpuBackend::new(1).unwrap();
    assert!(cpu.matmul(&Tensor::new(1, wide, vec![0.5; wide]), &w, None).is_ok());
    let err = cpu.matmul(&Tensor::new(1, 512, vec![0.5; 512]), &w, None).err().unwrap().to_string();
    assert!(err.contains("shape mismatch"), "{err}");
}
