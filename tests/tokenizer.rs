//! The tokenizers rebuilt from the GGUF files in models/ against the reference ids in
//! tests/golden/ (recorded with Hugging Face transformers; llama.cpp agrees).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use saguaro::model::gguf::Gguf;
use saguaro::model::tokenizer::{apply_chat_template, ChatMessage, StreamDecoder, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    /// The GGUF file the data was recorded with; absent in files that hold no ids.
    #[serde(default)]
    model: String,
    #[serde(default)]
    tokenizer: Vec<Encoded>,
    #[serde(default)]
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Encoded {
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    prompt_ids: Vec<u32>,
}

struct Model {
    name: String,
    tok: Tokenizer,
    chat_template: Option<String>,
    golden: Vec<Golden>,
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every model that tests/golden/ has data for, each loaded once for all tests. A missing model
/// file fails the tests rather than skipping them.
fn models() -> &'static [Model] {
    static MODELS: OnceLock<Vec<Model>> = OnceLock::new();
    MODELS.get_or_init(|| {
        let mut goldens: Vec<Golden> = std::fs::read_dir(root().join("tests/golden"))
            .expect("tests/golden/ is missing")
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .map(|p| {
                serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            })
            .filter(|g: &Golden| !g.model.is_empty())
            .collect();
        goldens.sort_by(|a, b| a.model.cmp(&b.model));
        let mut models: Vec<Model> = Vec::new();
        for golden in goldens {
            if let Some(m) = models.iter_mut().find(|m| m.name == golden.model) {
                m.golden.push(golden);
                continue;
            }
            let path: PathBuf = root().join("models").join(&golden.model);
            let bytes =
                std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}: run scripts/fetch-models.sh", path.display()));
            let g = Gguf::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let tok = Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let chat_template = g.get_str("tokenizer.chat_template").map(str::to_owned);
            models.push(Model {
                name: golden.model.clone(),
                tok,
                chat_template,
                golden: vec![golden],
            });
        }
        assert!(!models.is_empty(), "tests/golden/ names no model");
        models
    })
}

fn model(prefix: &str) -> &'static Model {
    models()
        .iter()
        .find(|m| m.name.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix}* model in models/: run scripts/fetch-models.sh"))
}

#[test]
fn encodes_like_the_reference() {
    for m in models() {
        let texts = m.golden.iter().flat_map(|g| {
            let enc = g.tokenizer.iter().map(|e| (&e.text, &e.ids));
            enc.chain(g.cases.iter().map(|c| (&c.prompt, &c.prompt_ids)))
        });
        let mut n = 0;
        for (text, ids) in texts {
            let got = m.tok.encode(text).unwrap();
            if &got != ids {
                // Long texts: show where the ids part, not two walls of numbers.
                let at = got.iter().zip(ids.iter()).take_while(|(a, b)| a == b).count();
                let window = |v: &[u32]| {
                    let w = &v[at.saturating_sub(3)..(at + 5).min(v.len())];
                    w.iter()
                        .map(|&i| m.tok.id_to_token(i).unwrap_or_default())
                        .collect::<Vec<_>>()
                };
                panic!(
                    "{}: encoding {:?}...: ids differ at {at}: got {:?}, want {:?}",
                    m.name,
                    text.chars().take(60).collect::<String>(),
                    window(&got),
                    window(ids)
                );
            }
            assert_eq!(&m.tok.decode(&got).unwrap(), text, "{}: decoding {ids:?}", m.name);
            n += 1;
        }
        assert!(n > 0, "{}: golden data holds no encodings", m.name);
    }
}

#[test]
fn stream_decoder_emits_only_whole_characters() {
    let text = "naïve café — “quotes” 日本語 🚀";
    for m in models() {
        let ids = m.tok.encode(text).unwrap();
        let mut stream = StreamDecoder::new(&m.tok);
        let (mut out, mut held) = (String::new(), 0);
        for &id in &ids {
            let piece = stream.push(id).unwrap();
            held += piece.is_empty() as usize;
            assert!(
                !piece.contains(char::REPLACEMENT_CHARACTER),
                "{}: {piece:?} after id {id}",
                m.name
            );
            out += &piece;
        }
        out += &stream.finish().unwrap();
        assert_eq!(out, m.tok.decode(&ids).unwrap(), "{}", m.name);
        assert_eq!(out, text, "{}", m.name);
        assert!(
            held > 0,
            "{}: no character of {text:?} spans two tokens; the test needs one",
            m.name
        );
    }
}

#[test]
fn stream_decoder_finish_flushes_an_incomplete_character() {
    for m in models() {
        // "ð" is the byte-level token for the lone byte 0xF0, the start of a 4-byte character.
        let lead = m.tok.token_to_id("ð").unwrap();
        let mut stream = StreamDecoder::new(&m.tok);
        assert_eq!(stream.push(lead).unwrap(), "", "{}", m.name);
        assert_eq!(stream.finish().unwrap(), "\u{FFFD}", "{}", m.name);
        // finish leaves the decoder ready for a new stream.
        assert_eq!(stream.push(m.tok.token_to_id("a").unwrap()).unwrap(), "a", "{}", m.name);
    }
}

#[test]
fn special_tokens_and_eos() {
    for m in models() {
        let (start, end) = (
            m.tok.token_to_id("<|im_start|>").unwrap(),
            m.tok.token_to_id("<|im_end|>").unwrap(),
        );
        assert_eq!(
            m.tok.encode("<|im_start|><|im_end|>").unwrap(),
            [start, end],
            "{}",
            m.name
        );
        assert_eq!(m.tok.id_to_token(end).as_deref(), Some("<|im_end|>"), "{}", m.name);
        assert_eq!(m.tok.eos_ids(), [end], "{}", m.name);
        assert_eq!(m.tok.eos_token().as_deref(), Some("<|im_end|>"), "{}", m.name);
        assert!(m.tok.vocab_size() > end as usize, "{}", m.name);
    }
    assert_eq!(model("qwen").tok.bos_token().as_deref(), Some("<|endoftext|>"));
    assert_eq!(model("smollm").tok.bos_token().as_deref(), Some("<|im_start|>"));
}

#[test]
fn json_round_trip_encodes_the_same() {
    let m = model("qwen");
    let json = m.tok.to_json().unwrap();
    let tok = Tokenizer::from_json(json.as_bytes())
        .unwrap()
        .with_eos(m.tok.eos_ids().to_vec());
    for g in &m.golden {
        for c in &g.cases {
            assert_eq!(tok.encode(&c.prompt).unwrap(), c.prompt_ids);
        }
    }
    assert_eq!(tok.vocab_size(), m.tok.vocab_size());
    assert_eq!(tok.eos_ids(), m.tok.eos_ids());
    assert_eq!(tok.bos_token(), None);
}

#[test]
fn qwen_chat_template() {
    let m = model("qwen");
    let template = m.chat_template.as_deref().expect("Qwen GGUF has a chat template");
    let (bos, eos) = (m.tok.bos_token(), m.tok.eos_token());
    let render = |system: Option<&str>| {
        let mut messages: Vec<_> = system.map(|s| ChatMessage::new("system", s)).into_iter().collect();
        messages.push(ChatMessage::new("user", "hi"));
        apply_chat_template(template, &messages, bos.as_deref(), eos.as_deref()).unwrap()
    };
    assert_eq!(
        render(None),
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        render(Some("Be brief.")),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn smollm_chat_template() {
    let m = model("smollm");
    let template = m.chat_template.as_deref().expect("SmolLM2 GGUF has a chat template");
    assert_eq!(
        apply_chat_template(template, &[ChatMessage::new("user", "hi")], None, None).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}
