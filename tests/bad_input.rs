//! Bad model files are clear errors: no panic, no huge allocation, a message that says what is wrong.

mod util;

use std::sync::Arc;

use saguaro::model::load::{from_gguf, open};
use saguaro::Error;
use util::gguf_writer::{GgufWriter, Val};

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
    assert!(msg.contains("extends past the end of the file"), "{msg}");
    let msg = load_err(bytes[..1000].to_vec());
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn tensor_larger_than_file_is_rejected() {
    let b = tiny_llama().tensor("huge", &[1 << 20, 1 << 20], 0, f32_bytes(4)).build();
    let msg = load_err(b);
    assert!(msg.contains("tensor huge") && msg.contains("extends past the end"), "{msg}");
}

#[test]
fn absurd_counts_do_not_allocate() {
    let msg = load_err(tiny_llama().build_with(Some(u64::MAX / 2)));
    assert!(msg.contains("tensor count"), "{msg}");
    let msg = load_err(tiny_llama().tensor("t", &[u64::MAX, 3], 0, vec![]).build());
    assert!(msg.contains("overflows") || msg.contains("too large"), "{msg}");
}

#[test]
fn unknown_architecture_is_rejected() {
    let b = GgufWriter::default().kv("general.architecture", Val::Str("mamba".into())).build();
    let msg = load_err(b);
    assert!(msg.contains("architecture 'mamba'"), "{msg}");
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
