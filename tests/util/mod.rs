//! Shared by the integration tests: model files and the golden reference outputs.
#![allow(dead_code)]

pub mod families;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod rand;
pub mod serve;
pub mod reference;

// Each test binary uses some of these.
#[cfg(feature = "gpu")]
#[allow(unused_imports)]
pub use gpu::{gpu_available, open_gpu, open_gpu_f16, shared_gpu};

use std::path::PathBuf;

use serde::Deserialize;

use saguaro::model::load::{open, ModelFile};
use saguaro::model::weights::ModelWeights;

pub const SMOLLM2: &str = "smollm2-135m-instruct-q4_1";
pub const QWEN_05B: &str = "qwen2.5-coder-0.5b-instruct";
pub const QWEN_15B: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m";


pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Open `models/<name>.gguf`, failing loudly (never skipping) when the models are not fetched.
pub fn model(name: &str) -> ModelFile {
    let path = root().join("models").join(format!("{name}.gguf"));
    assert!(path.exists(), "{} is missing: run scripts/fetch-models.sh first", path.display());
    open(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// The same weights with all but the first two layers dropped: same vocabulary, poor proposals,
/// so that speculation is rejected often and rollback is exercised.
pub fn truncated(weights: &ModelWeights) -> ModelWeights {
    let mut w = weights.clone();
    w.layers.truncate(2);
    w.config.n_layers = 2;
    w
}

#[derive(Deserialize)]
pub struct Golden {
    pub tokenizer: Vec<TokCase>,
    pub cases: Vec<Case>,
}

#[derive(Deserialize)]
pub struct TokCase {
    pub text: String,
    pub ids: Vec<u32>,
}

#[derive(Deserialize)]
pub struct Case {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    /// `top5[j]` = the reference's five largest (token, logit) at generated position j.
    pub top5: Vec<Vec<(u32, f32)>>,
}

pub fn golden(file: &str) -> Golden {
    let p = root().join("tests/golden").join(format!("{file}.json"));
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Where the reference's top-1/top-2 margin at position j is below this, either token is a
/// legitimate greedy choice and the continuations may diverge from there.
pub const NEAR_TIE: f32 = 0.01;

/// Compare generated greedy ids with the reference under the near-tie rule, which ends the
/// comparison at the first near tie the generation took the other way; at least `at_least`
/// positions must have been compared (a tie taken early would otherwise leave nothing checked).
pub fn check_greedy(case: &Case, got: &[u32], at_least: usize, what: &str) {
    let compared = greedy_positions(case, got, what);
    assert!(
        compared >= at_least,
        "{what}: only {compared} of {} positions compared before a near tie, {at_least} required",
        case.greedy_ids.len()
    );
}

/// How many positions of `got` match the reference before a near tie taken the other way (all of
/// them where none is); panics at a real difference.
fn greedy_positions(case: &Case, got: &[u32], what: &str) -> usize {
    for (j, &want) in case.greedy_ids.iter().enumerate() {
        let g = *got.get(j).unwrap_or_else(|| panic!("{what}: generation stopped at {j}, reference has {want} next"));
        if g == want {
            continue;
        }
        let t = &case.top5[j];
        let tie = t[0].1 - t[1].1 < NEAR_TIE && (g == t[0].0 || g == t[1].0);
        assert!(tie, "{what}: position {j}: got {g}, reference {want} (top5 {t:?})");
        return j;
    }
    assert!(
        got.len() == case.greedy_ids.len(),
        "{what}: generated {} tokens, reference {}",
        got.len(),
        case.greedy_ids.len()
    );
    case.greedy_ids.len()
}

/// Check teacher-forced logits (`logits[j]` predicts generated position j) against the
/// reference top-5 within `tol`.
pub fn check_top5(case: &Case, logits: &[f32], vocab: usize, tol: f32, what: &str) {
    let mut worst = (0.0f32, 0, 0);
    for (j, t) in case.top5.iter().enumerate() {
        let row = &logits[j * vocab..(j + 1) * vocab];
        for &(id, want) in t {
            let err = (row[id as usize] - want).abs();
            if err > worst.0 {
                worst = (err, j, id);
            }
        }
    }
    eprintln!("{what}: largest top-5 logit error {:.4} (position {}, token {})", worst.0, worst.1, worst.2);
    assert!(worst.0 <= tol, "{what}: top-5 logit error {:.4} at position {} token {} exceeds {tol}", worst.0, worst.1, worst.2);
}
