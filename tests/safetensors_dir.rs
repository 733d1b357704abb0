//! A Hugging Face directory (F16 safetensors + config.json + tokenizer.json) written from the
//! SmolLM2 GGUF gives the same greedy tokens as the GGUF itself.

mod util;

use futures::executor::block_on;
use half::f16;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::json;

use saguaro::backend::cpu::CpuBackend;
use saguaro::decode::{generate_ar, Request};
use saguaro::model::load::{open, ModelFile};
use saguaro::model::runner::Runner;
use saguaro::model::transformer::Transformer;
use saguaro::storage::Weight;
use saguaro::sampling::SamplingParams;

fn f16_bytes(w: &Weight) -> Vec<u8> {
    w.to_f32().iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect()
}

/// Write `m` as an HF directory; the loaded weights are already in HF's (un-permuted) row order.
fn write_hf_dir(m: &ModelFile, dir: &std::path::Path) {
    let w = &m.weights;
    let c = &w.config;
    let mut tensors: Vec<(String, &Weight)> = vec![("model.embed_tokens.weight".into(), &w.embed), ("model.norm.weight".into(), &w.norm)];
    for (i, l) in w.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        for (n, t) in [
            ("input_layernorm", &l.attn_norm),
            ("self_attn.q_proj", &l.wq),
            ("self_attn.k_proj", &l.wk),
            ("self_attn.v_proj", &l.wv),
            ("self_attn.o_proj", &l.wo),
            ("post_attention_layernorm", &l.ffn_norm),
            ("mlp.gate_proj", &l.w_gate),
            ("mlp.up_proj", &l.w_up),
            ("mlp.down_proj", &l.w_down),
        ] {
            tensors.push((format!("{p}.{n}.weight"), t));
        }
    }
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| {
            let shape = if t.rows == 1 { vec![t.cols] } else { vec![t.rows, t.cols] };
            (n.clone(), shape, f16_bytes(t))
        })
        .collect();
    let views: Vec<(String, TensorView)> =
        data.iter().map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::F16, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let config = json!({
        "model_type": "llama",
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ffn,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "num_hidden_layers": c.n_layers,
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.context_length,
        "tie_word_embeddings": true,
        "eos_token_id": m.tokenizer.eos_ids(),
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), m.tokenizer.to_json().unwrap()).unwrap();
}

fn greedy(m: &ModelFile, prompt: &str, n: usize) -> Vec<u32> {
    let prompt = m.tokenizer.encode(prompt).unwrap();
    let mut lm = Runner::new(Transformer::new(CpuBackend::new(0).unwrap(), &m.weights).unwrap(), prompt.len() + n).unwrap();
    let req = Request { prompt, max_tokens: n, sampling: SamplingParams::default(), stop: m.tokenizer.eos_ids().to_vec(), ..Request::default() };
    block_on(generate_ar(&mut lm, &req, &mut |_| true)).unwrap().tokens
}

#[test]
fn hf_directory_matches_gguf() {
    let gguf = util::model(util::SMOLLM2);
    let dir = std::env::temp_dir().join(format!("saguaro-hf-smollm2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_hf_dir(&gguf, &dir);
    let hf = open(&dir).unwrap();
    assert_eq!(hf.weights.config, gguf.weights.config);
    assert_eq!(hf.tokenizer.eos_ids(), gguf.tokenizer.eos_ids());
    let prompts: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(util::root().join("tests/golden/prompts.json")).unwrap()).unwrap();
    for p in prompts["prompts"].as_array().unwrap() {
        let p = p.as_str().unwrap();
        assert_eq!(hf.tokenizer.encode(p).unwrap(), gguf.tokenizer.encode(p).unwrap());
        assert_eq!(greedy(&hf, p, 24), greedy(&gguf, p, 24), "prompt {p:?}");
    }
    // A directory without its tokenizer is a clear error.
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let err = open(&dir).err().unwrap();
    assert!(err.to_string().contains("tokenizer.json missing"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
