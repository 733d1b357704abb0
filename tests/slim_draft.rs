//! A cheaper draft: a pruned output head scores only its kept tokens, exactly as the full head
//! scores them, and every other token gets -inf; the kept set and the options are checked.

mod common;
mod util;

use futures::executor::block_on;

use saguaro::engine::EngineOptions;
use saguaro::model::quant::DType;
use saguaro::model::runner::{append, Want};
use saguaro::model::slim::{frequent_tokens, Slimming};
use saguaro::model::transformer::Transformer;
use saguaro::backend::cpu::CpuBackend;
use saguaro::Error;

use common::{runner, tiny_weights};

const VOCAB: usize = 40;

#[test]
fn a_pruned_head_scores_its_tokens_as_the_full_head_does() {
    let w = tiny_weights(5, VOCAB, 2, 1.0);
    let kept = vec![0u32, 3, 7, 20, 39];
    let pruned = Slimming { quant: None, head: Some(kept.clone()) }.apply(&w).unwrap();
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
    let bad = Slimming { quant: None, head: Some(vec![3, 1]) }.apply(&w);
    assert!(matches!(bad, Err(Error::InvalidOption { option: "draft_head", .. })), "{bad:?}");
    let bad = Slimming { quant: Some(DType::Q6K), head: None }.apply(&w);
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
