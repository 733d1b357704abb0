//! Bad model files are clear errors: no panic, no huge allocation, a message that says what is wrong.

mod util;

use std::sync::Arc;

use saguaro::model::gguf_writer::{GgufWriter, Val};
use saguaro::model::load::{from_gguf, from_hf, open, FileSource};
use saguaro::storage::Storage;
use saguaro::Error;

fn load_err(bytes: Vec<u8>) -> String {
    match from_gguf(Arc::new(bytes)) {
        Ok(_) => panic!("a bad file loaded"),
        Err(e) => e.to_string(),
    }
}

fn f32_bytes(n: usize) -> Vec<u8> {
    vec![0u8; n * 4]
}

/// A structurally valid GGUF header for a one-layer llama with a 4-token vocabulary.
fn tiny_llama() -> GgufWriter {
    GgufWriter::default()
        .kv("general.architecture", Val::Str("llama".into()))
        .kv("llama.block_count", Val::U32(1))
        .kv("llama.embedding_length", Val::U32(8))
        .kv("llama.feed_forward_length", Val::U32(16))
        .kv("llama.attention.head_count", Val::U32(2))
        .kv("llama.attention.head_count_kv", Val::U32(1))
        .tensor("token_embd.weight", &[8, 4], 0, f32_bytes(32))
}

#[test]
fn wrong_magic_is_rejected() {
    let mut b = tiny_llama().build();
    b[..4].copy_from_slice(b"GGUX");
    assert!(load_err(b).contains("bad magic"));
}

#[test]
fn truncated_real_file_is_rejected() {
    let path = util::root().join(format!("models/{}.gguf", util::SMOLLM2));
    assert!(path.exists(), "run scripts/fetch-models.sh first");
    let bytes = std::fs::read(path).unwrap();
    let msg = load_err(bytes[..bytes.len() / 2].to_vec());
    assert!(msg.contains("extend past the end of the file"), "{msg}");
    let msg = load_err(bytes[..1000].to_vec());
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn tensor_larger_than_file_is_rejected() {
    let b = tiny_llama().tensor("huge", &[1 << 20, 1 << 20], 0, f32_bytes(4)).build();
    let msg = load_err(b);
    assert!(msg.contains("tensor huge") && msg.contains("extend past the end"), "{msg}");
}

#[test]
fn absurd_counts_do_not_allocate() {
    let msg = load_err(tiny_llama().build_with(Some(u64::MAX / 2)));
    assert!(msg.contains("tensor_count"), "{msg}");
    let msg = load_err(tiny_llama().tensor("t", &[u64::MAX, 3], 0, vec![]).build());
    assert!(msg.contains("dimensions") && msg.contains("overflow"), "{msg}");
}

#[test]
fn unknown_architecture_is_rejected() {
    let b = GgufWriter::default().kv("general.architecture", Val::Str("mamba".into())).build();
    let msg = load_err(b);
    assert!(msg.contains("architecture 'mamba'"), "{msg}");
    for family in ["llama", "qwen2", "qwen3", "gemma3", "phi3"] {
        assert!(msg.contains(family), "the supported architectures are listed: {msg}");
    }
}

#[test]
fn missing_tokenizer_is_rejected() {
    let err = from_gguf(Arc::new(tiny_llama().build())).err().expect("loaded without a tokenizer");
    assert!(matches!(err, Error::Tokenizer(_)), "{err}");
    assert!(err.to_string().contains("has no tokenizer"), "{err}");
}

#[test]
fn missing_files_are_clear() {
    let err = open(std::path::Path::new("no/such/model.gguf")).err().unwrap();
    assert!(err.to_string().contains("no/such/model.gguf"), "{err}");
    let dir = std::env::temp_dir().join(format!("saguaro-empty-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let err = open(&dir).err().unwrap();
    assert!(err.to_string().contains("config.json missing"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The GGUF v3 header: magic, version, tensor_count, metadata_kv_count.
fn header(tensor_count: u64, kv_count: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(tensor_count.to_le_bytes());
    b.extend(kv_count.to_le_bytes());
    b
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

/// A 100-byte file: `body` after a header declaring `kv_count` metadata entries, zero-padded.
fn hundred_bytes(kv_count: u64, body: &[u8]) -> Vec<u8> {
    let mut b = header(0, kv_count);
    b.extend(body);
    b.resize(100, 0);
    b
}

#[test]
fn a_small_file_claiming_huge_sizes_is_refused_naming_the_field() {
    let msg = load_err(hundred_bytes(1 << 40, &[]));
    assert!(msg.contains("metadata_kv_count = 1099511627776"), "{msg}");
    let mut b = header(1 << 40, 0);
    b.resize(100, 0);
    assert!(load_err(b).contains("tensor_count = 1099511627776"), "tensor count");

    let mut body = Vec::new();
    put_str(&mut body, "tokenizer.ggml.tokens");
    body.extend(9u32.to_le_bytes()); // array
    body.extend(8u32.to_le_bytes()); // of strings
    body.extend((1u64 << 40).to_le_bytes());
    let msg = load_err(hundred_bytes(1, &body));
    assert!(msg.contains("metadata tokenizer.ggml.tokens array length = 1099511627776"), "{msg}");

    let msg = load_err(hundred_bytes(1, &(1u64 << 40).to_le_bytes()));
    assert!(msg.contains("metadata key 0 length"), "{msg}");

    // A terabyte tensor.
    let b = tiny_llama().tensor("blk.0.ffn_up.weight", &[1 << 20, 1 << 18], 0, vec![]).build();
    let msg = load_err(b);
    assert!(msg.contains("tensor blk.0.ffn_up.weight: 1099511627776 bytes"), "{msg}");
}

#[test]
fn malformed_structure_is_refused_naming_the_field() {
    let entry = |ty: u32, rest: &[u8]| {
        let mut b = Vec::new();
        put_str(&mut b, "general.name");
        b.extend(ty.to_le_bytes());
        b.extend(rest);
        b
    };
    let msg = load_err(hundred_bytes(1, &entry(13, &[])));
    assert!(msg.contains("metadata general.name: value type 13 unknown"), "{msg}");
    let array_of_arrays = [&9u32.to_le_bytes()[..], &1u64.to_le_bytes()].concat();
    let msg = load_err(hundred_bytes(1, &entry(9, &array_of_arrays)));
    assert!(msg.contains("array element type 9 unknown or nested"), "{msg}");

    let mut b = header(1, 0);
    put_str(&mut b, "t");
    b.extend(5u32.to_le_bytes());
    b.resize(100, 0);
    assert!(load_err(b).contains("tensor t has 5 dimensions"));

    for (alignment, what) in [(3, "3"), (1 << 20, "1048576")] {
        let msg = load_err(tiny_llama().kv("general.alignment", Val::U32(alignment)).build());
        assert!(msg.contains(&format!("general.alignment = U32({what}) is not a power of two")), "{msg}");
    }
}

const D: u64 = 8;
const FFN: u64 = 16;
const KV_DIM: u64 = 4;
const VOCAB: u64 = 4;

/// A complete one-layer llama (2 heads of 4, one kv head) with a 4-token vocabulary, all F32 and
/// zero; `dims` may override a tensor's dimensions or add a tensor, and `tokens` the vocabulary.
fn full_llama(dims: &[(&str, &[u64])], tokens: &[&str], extra: Vec<(&str, Val)>) -> Vec<u8> {
    let mut w = GgufWriter::default()
        .kv("general.architecture", Val::Str("llama".into()))
        .kv("llama.block_count", Val::U32(1))
        .kv("llama.embedding_length", Val::U32(D as u32))
        .kv("llama.feed_forward_length", Val::U32(FFN as u32))
        .kv("llama.attention.head_count", Val::U32(2))
        .kv("llama.attention.head_count_kv", Val::U32(1))
        .kv("tokenizer.ggml.model", Val::Str("gpt2".into()))
        .kv("tokenizer.ggml.tokens", Val::Strs(tokens.iter().map(|t| t.to_string()).collect()))
        .kv("tokenizer.ggml.merges", Val::Strs(vec![]));
    for (k, v) in extra {
        w = w.kv(k, v);
    }
    let shapes: [(&str, Vec<u64>); 11] = [
        ("token_embd.weight", vec![D, VOCAB]),
        ("output_norm.weight", vec![D]),
        ("blk.0.attn_norm.weight", vec![D]),
        ("blk.0.ffn_norm.weight", vec![D]),
        ("blk.0.attn_q.weight", vec![D, D]),
        ("blk.0.attn_k.weight", vec![D, KV_DIM]),
        ("blk.0.attn_v.weight", vec![D, KV_DIM]),
        ("blk.0.attn_output.weight", vec![D, D]),
        ("blk.0.ffn_gate.weight", vec![D, FFN]),
        ("blk.0.ffn_up.weight", vec![D, FFN]),
        ("blk.0.ffn_down.weight", vec![FFN, D]),
    ];
    for (name, default) in shapes.clone() {
        let d = dims.iter().find(|(n, _)| *n == name).map_or(default, |(_, d)| d.to_vec());
        let n: u64 = d.iter().product();
        w = w.tensor(name, &d, 0, f32_bytes(n as usize));
    }
    for (name, d) in dims.iter().filter(|(n, _)| !shapes.iter().any(|(s, _)| s == n)) {
        w = w.tensor(name, d, 0, f32_bytes(d.iter().product::<u64>() as usize));
    }
    w.build()
}

const TOKENS: [&str; 4] = ["a", "b", "c", "d"];

#[test]
fn a_complete_tiny_model_loads() {
    let m = from_gguf(Arc::new(full_llama(&[], &TOKENS, vec![]))).unwrap();
    assert_eq!((m.weights.config.vocab_size, m.weights.config.head_dim), (4, 4));
}

/// Shapes that disagree with the configuration were once un-permuted before being checked,
/// dividing by a zero head size; now they are refused by name.
#[test]
fn a_tensor_of_the_wrong_shape_is_refused_by_name() {
    let msg = load_err(full_llama(&[("blk.0.attn_k.weight", &[D, 1])], &TOKENS, vec![]));
    assert!(msg.contains("tensor blk.0.attn_k.weight is 1x8, expected 4x8"), "{msg}");
    let msg = load_err(full_llama(&[("blk.0.attn_q.weight", &[D, 1])], &TOKENS, vec![]));
    assert!(msg.contains("tensor blk.0.attn_q.weight is 1x8, expected 8x8"), "{msg}");
}

#[test]
fn bad_rope_shapes_and_factors_are_refused_by_name() {
    let dim = |n: u32| vec![("llama.rope.dimension_count", Val::U32(n))];
    let msg = load_err(full_llama(&[], &TOKENS, dim(3)));
    assert!(msg.contains("RoPE dimension 3 must be even and within the head's 4"), "{msg}");
    let msg = load_err(full_llama(&[], &TOKENS, dim(6)));
    assert!(msg.contains("RoPE dimension 6 must be even and within the head's 4"), "{msg}");
    // Head dimension 4: two rotated pairs, so two factors, each positive (these are zeros).
    for n in [3, 2] {
        let msg = load_err(full_llama(&[("rope_freqs.weight", &[n])], &TOKENS, vec![]));
        assert!(msg.contains("RoPE factors must hold 2 positive factors (one per rotated pair)"), "{msg}");
    }
}

#[test]
fn implausible_dimensions_are_refused_by_name() {
    for (key, value, want) in [
        ("llama.feed_forward_length", 1u32 << 31, "d_ffn = 2147483648 is outside"),
        ("llama.attention.head_count", 0, "n_heads = 0 is outside"),
        ("llama.attention.key_length", 1 << 20, "head_dim = 1048576 is outside"),
        ("llama.context_length", 0, "context_length = 0 is outside"),
    ] {
        let msg = load_err(full_llama(&[], &TOKENS, vec![(key, Val::U32(value))]));
        assert!(msg.contains(want), "{key}: {msg}");
    }
    let msg = load_err(full_llama(&[], &TOKENS, vec![("llama.rope.freq_base", Val::F32(f32::NAN))]));
    assert!(msg.contains("rope_theta = NaN must be a positive number"), "{msg}");
}

#[test]
fn a_tokenizer_larger_than_the_vocabulary_is_refused() {
    let msg = load_err(full_llama(&[], &["a", "b", "c", "d", "e"], vec![]));
    assert!(msg.contains("the tokenizer has 5 tokens but the model's vocabulary only 4"), "{msg}");
}

/// HF directory files held in memory.
struct Files(Vec<(&'static str, Vec<u8>)>);

impl FileSource for Files {
    fn read(&self, name: &str) -> saguaro::Result<Option<Storage>> {
        Ok(self.0.iter().find(|(n, _)| *n == name).map(|(_, b)| Arc::new(b.clone()) as Storage))
    }
}

fn hf_err(files: Vec<(&'static str, Vec<u8>)>) -> String {
    match from_hf(&Files(files)) {
        Ok(_) => panic!("a bad directory loaded"),
        Err(e) => e.to_string(),
    }
}

fn hf_files(config: serde_json::Value) -> Vec<(&'static str, Vec<u8>)> {
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "d": 3}, "merges": []}
    });
    vec![("config.json", config.to_string().into_bytes()), ("tokenizer.json", tokenizer.to_string().into_bytes())]
}

fn hf_config(eos: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "model_type": "llama", "hidden_size": D, "intermediate_size": FFN, "num_attention_heads": 2,
        "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": VOCAB, "eos_token_id": eos
    })
}

#[test]
fn an_hf_rope_scaling_this_engine_does_not_apply_is_refused_by_name() {
    let with = |scaling: serde_json::Value| {
        let mut config = hf_config(serde_json::json!(3));
        config["rope_scaling"] = scaling;
        hf_err(hf_files(config))
    };
    let msg = with(serde_json::json!({"rope_type": "yarn", "factor": 4.0}));
    assert!(msg.contains("RoPE scaling type 'yarn' (supported: linear, llama3, longrope)"), "{msg}");
    let msg = with(serde_json::json!({"rope_type": "llama3", "factor": -1.0}));
    assert!(msg.contains("rope_scaling: factor must be a positive number"), "{msg}");
    let msg = with(serde_json::json!({"type": "longrope", "short_factor": [1.0], "long_factor": "x"}));
    assert!(msg.contains("rope_scaling: long_factor must be a list of numbers"), "{msg}");
    let msg = with(serde_json::json!({"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}));
    assert!(msg.contains("rope_scaling: long RoPE needs original_max_position_embeddings"), "{msg}");
}

#[test]
fn an_hf_index_cannot_name_files_outside_the_directory() {
    for shard in ["../../etc/passwd", "/etc/passwd", "sub/model.safetensors", ".."] {
        let mut files = hf_files(hf_config(serde_json::json!(3)));
        let index = serde_json::json!({"weight_map": {"model.embed_tokens.weight": shard}});
        files.push(("model.safetensors.index.json", index.to_string().into_bytes()));
        let msg = hf_err(files);
        assert!(msg.contains("which is not a file name in the model directory"), "{shard}: {msg}");
    }
}

#[test]
fn an_hf_eos_token_outside_the_vocabulary_is_refused() {
    for eos in [serde_json::json!(4), serde_json::json!([1, 1u64 << 40]), serde_json::json!("x")] {
        let msg = hf_err(hf_files(hf_config(eos.clone())));
        assert!(msg.contains("config.json: eos_token_id") && msg.contains("4-token vocabulary"), "{eos}: {msg}");
    }
}

/// Found by the hf_dir fuzzer: a decoder object that is not valid JSON text made `tokenizers`
/// panic while deserializing it.
#[test]
fn a_tokenizer_json_that_is_not_json_is_an_error() {
    use saguaro::model::tokenizer::Tokenizer;
    for bad in [&b"{\"decoder\": {\"type\": \"ByteLeve\x9a\x99\n\xd7c>\n"[..], b"{\"decoder\": {\"type\": \"BPE\x01\"}}", b""] {
        let err = Tokenizer::from_json(bad).unwrap_err();
        assert!(matches!(err, Error::Tokenizer(ref m) if m.contains("not valid JSON")), "{err}");
    }
    let mut files = hf_files(hf_config(serde_json::json!(3)));
    files[1].1 = b"{\"decoder\": {\"type\": \"ByteLevel\x01\"}}".to_vec();
    assert!(hf_err(files).contains("tokenizer.json is not valid JSON"));
}

/// Found by the `hf_dir` fuzzer: a merge whose token is longer than every vocabulary entry made
/// `tokenizers` panic while building the BPE model.
#[test]
fn a_merge_longer_than_any_token_is_an_error() {
    let json = |merges: &str| {
        format!(
            r#"{{"version":"1.0","model":{{"type":"BPE","vocab":{{"a":0,"b":1,"ab":2}},"merges":[{merges}]}}}}"#
        )
    };
    assert!(saguaro::model::tokenizer::Tokenizer::from_json(json(r#""a b""#).as_bytes()).is_ok());
    for merges in [r#""ab ab""#, r#"["ab", "ab"]"#] {
        let e = saguaro::model::tokenizer::Tokenizer::from_json(json(merges).as_bytes()).err().expect("an error");
        assert!(e.to_string().contains("merge 0"), "{e}");
    }
}
