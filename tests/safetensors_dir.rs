//! A Hugging Face directory (safetensors + config.json + tokenizer.json) written from a GGUF file
//! gives what the GGUF itself gives: SmolLM2's greedy tokens (F16), and the logits of each
//! random-weight family in HF's own layout (F32: Phi-3's fused projections, Gemma's norms stored
//! as w - 1 and named by position, Llama 3's and Phi-3's RoPE scaling as config.json says it).

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

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Write family model `m` (`name` of tests/util/families.rs) as an HF directory in F32.
fn write_family_dir(name: &str, m: &ModelFile, dir: &std::path::Path) {
    use util::families::{shape, LLAMA3_ROPE, PHI3_ORIG_CTX};
    let w = &m.weights;
    let c = &w.config;
    let fam = c.family();
    let norm = |t: &Weight| -> Vec<f32> { t.to_f32().iter().map(|x| x - fam.hf_norm_offset).collect() };
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut put = |n: String, t: Vec<&Weight>| {
        let rows: usize = t.iter().map(|t| t.rows).sum();
        let data: Vec<f32> = t.iter().flat_map(|t| t.to_f32()).collect();
        let shape = if rows == 1 { vec![t[0].cols] } else { vec![rows, t[0].cols] };
        tensors.push((n, shape, data));
    };
    put("model.embed_tokens.weight".into(), vec![&w.embed]);
    if !c.tied_embeddings {
        put("lm_head.weight".into(), vec![&w.output]);
    }
    let mut norms: Vec<(String, Vec<f32>)> = vec![("model.norm.weight".into(), norm(&w.norm))];
    for (i, l) in w.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        if fam.fused {
            put(format!("{p}.self_attn.qkv_proj.weight"), vec![&l.wq, &l.wk, &l.wv]);
            put(format!("{p}.mlp.gate_up_proj.weight"), vec![&l.w_gate, &l.w_up]);
        } else {
            for (n, t) in [("self_attn.q_proj", &l.wq), ("self_attn.k_proj", &l.wk), ("self_attn.v_proj", &l.wv), ("mlp.gate_proj", &l.w_gate), ("mlp.up_proj", &l.w_up)] {
                put(format!("{p}.{n}.weight"), vec![t]);
            }
        }
        put(format!("{p}.self_attn.o_proj.weight"), vec![&l.wo]);
        put(format!("{p}.mlp.down_proj.weight"), vec![&l.w_down]);
        let ffn_norm = if fam.post_norms { "pre_feedforward_layernorm" } else { "post_attention_layernorm" };
        norms.push((format!("{p}.input_layernorm.weight"), norm(&l.attn_norm)));
        norms.push((format!("{p}.{ffn_norm}.weight"), norm(&l.ffn_norm)));
        for (n, t) in [
            ("self_attn.q_norm", &l.q_norm),
            ("self_attn.k_norm", &l.k_norm),
            ("post_attention_layernorm", &l.post_attn_norm),
            ("post_feedforward_layernorm", &l.post_ffn_norm),
        ] {
            if let Some(t) = t {
                norms.push((format!("{p}.{n}.weight"), norm(t)));
            }
        }
    }
    tensors.extend(norms.into_iter().map(|(n, v)| (n, vec![v.len()], v)));
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors.into_iter().map(|(n, s, v)| (n, s, f32_bytes(&v))).collect();
    let views: Vec<(String, TensorView)> =
        bytes.iter().map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();

    let s = shape(name);
    let mut config = json!({
        "model_type": fam.hf[0],
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ffn,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": c.n_layers,
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.context_length,
        "tie_word_embeddings": c.tied_embeddings,
        "eos_token_id": m.tokenizer.eos_ids(),
    });
    let extra = match name {
        "llama3" => {
            let (factor, low, high, orig) = LLAMA3_ROPE;
            json!({"rope_scaling": {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                "high_freq_factor": high, "original_max_position_embeddings": orig}})
        }
        "phi3" => {
            let long = w.long_rope.as_ref().unwrap();
            json!({"partial_rotary_factor": s.n_rot as f64 / s.head_dim as f64,
                "original_max_position_embeddings": PHI3_ORIG_CTX,
                "rope_scaling": {"type": "longrope", "short_factor": w.rope_factors.as_ref().unwrap(), "long_factor": long.factors}})
        }
        "gemma3" => json!({"sliding_window": c.sliding_window, "query_pre_attn_scalar": c.head_dim}),
        _ => json!({}),
    };
    config.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), m.tokenizer.to_json().unwrap()).unwrap();
    let tc = json!({"add_bos_token": m.tokenizer.add_bos(), "bos_token": m.tokenizer.bos_token()});
    std::fs::write(dir.join("tokenizer_config.json"), tc.to_string()).unwrap();
}

/// Each family written as an HF directory loads to the same configuration and the same logits
/// (Gemma's norms pass through w - 1 + 1 in f32, so within rounding).
#[test]
fn family_hf_directories_match_their_gguf() {
    use saguaro::backend::Batch;
    use saguaro::model::runner::Lm;
    for name in util::families::FAMILIES {
        let gguf = saguaro::model::load::from_gguf(std::sync::Arc::new(util::families::family_gguf(name))).unwrap();
        let dir = std::env::temp_dir().join(format!("saguaro-hf-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_family_dir(name, &gguf, &dir);
        let hf = open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(hf.weights.config, gguf.weights.config, "{name}");
        assert_eq!(hf.weights.rope_factors, gguf.weights.rope_factors, "{name}: RoPE factors");
        assert_eq!(hf.tokenizer.encode_prompt(" the cat").unwrap(), gguf.tokenizer.encode_prompt(" the cat").unwrap(), "{name}: BOS");
        let tokens: Vec<u32> = (0..40).map(|i| (i * 37 % 250) as u32).collect();
        let rows: Vec<u32> = (0..40).collect();
        // Beyond Phi-3's original context too, where its long factors apply.
        for capacity in [64, 512] {
            let logits = |m: &ModelFile| {
                let mut lm = Runner::new(Transformer::new(CpuBackend::new(0).unwrap(), &m.weights).unwrap(), capacity).unwrap();
                block_on(lm.logits(&Batch::causal(&tokens, 0), &rows)).unwrap()
            };
            let (a, b) = (logits(&hf), logits(&gguf));
            let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-4, "{name} at capacity {capacity}: logits differ by {worst}");
        }
    }
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
