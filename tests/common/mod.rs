//! Tiny random-weight models, built in memory: fast enough to generate tens of thousands of
//! sequences, small enough in vocabulary to enumerate their exact output distribution (which
//! [`distribution`] does, and tests samples against).
#![allow(dead_code)]

pub mod distribution;

use saguaro::backend::cpu::CpuBackend;
use saguaro::model::config::{Arch, ModelConfig};
use saguaro::model::runner::Runner;
use saguaro::model::transformer::Transformer;
use saguaro::model::weights::{LayerWeights, ModelWeights};
use saguaro::sampling::Rng;
use saguaro::storage::Weight;

/// A llama-shaped model with `vocab` tokens and seeded random weights. `scale` sets the spread
/// of the embeddings (tied to the output head), and so how peaked the next-token distributions are.
pub fn tiny_weights(seed: u64, vocab: usize, n_layers: usize, scale: f32) -> ModelWeights {
    let config = ModelConfig {
        arch: Arch::Llama,
        n_layers,
        d_model: 16,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 8,
        d_ffn: 32,
        vocab_size: vocab,
        rope_theta: 10000.0,
        rms_eps: 1e-5,
        context_length: 512,
        tied_embeddings: true,
        rotary_dim: 8,
        rope_freq_scale: 1.0,
        rope_attn_factor: 1.0,
        sliding_window: None,
        attn_scale: 8f32.sqrt().recip(),
    };
    let mut rng = Rng::new(seed);
    let mut random = |rows: usize, cols: usize, scale: f32| {
        let v: Vec<f32> = (0..rows * cols).map(|_| (rng.uniform() * 2.0 - 1.0) * scale).collect();
        Weight::from_f32(rows, cols, &v)
    };
    let (d, q, kv, f) = (config.d_model, config.q_dim(), config.kv_dim(), config.d_ffn);
    let ones = |n: usize| Weight::from_f32(1, n, &vec![1.0; n]);
    let layers = (0..n_layers)
        .map(|_| LayerWeights {
            attn_norm: ones(d),
            wq: random(q, d, 0.3),
            wk: random(kv, d, 0.3),
            wv: random(kv, d, 0.3),
            bq: None,
            bk: None,
            bv: None,
            wo: random(d, q, 0.3),
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            ffn_norm: ones(d),
            w_gate: random(f, d, 0.3),
            w_up: random(f, d, 0.3),
            w_down: random(d, f, 0.3),
            post_ffn_norm: None,
        })
        .collect();
    let embed = random(vocab, d, scale);
    ModelWeights { config, output: embed.clone(), embed, layers, norm: ones(d), head_tokens: None, rope_factors: None, long_rope: None }
}

/// A single-threaded CPU runner over `weights` with `capacity` KV slots.
pub fn runner(weights: &ModelWeights, capacity: usize) -> Runner<CpuBackend> {
    let backend = CpuBackend::new(1).expect("a CPU backend");
    Runner::new(Transformer::new(backend, weights).expect("a transformer"), capacity).expect("a runner")
}
