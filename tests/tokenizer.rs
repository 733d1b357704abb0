//! The tokenizers rebuilt from the GGUF files in models/ against the reference ids in
//! tests/golden/ (recorded with Hugging Face transformers or llama.cpp, which agree), and the
//! SentencePiece (Gemma) tokenizer's BOS handling, chat template and errors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use saguaro::model::gguf::{Gguf, Value};
use saguaro::model::tokenizer::{
    apply_chat_template, chat_template, default_chat_template, ChatMessage, StreamDecoder, Tokenizer,
};
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

/// Encodings are compared with `encode` (no BOS); prompts with `encode_prompt`, which puts BOS
/// first for models that want it, as the references did.
#[test]
fn encodes_like_the_reference() {
    for m in models() {
        let texts = m.golden.iter().flat_map(|g| {
            let enc = g.tokenizer.iter().map(|e| (&e.text, &e.ids, false));
            enc.chain(g.cases.iter().map(|c| (&c.prompt, &c.prompt_ids, true)))
        });
        let mut n = 0;
        for (text, ids, prompt) in texts {
            let got = if prompt { m.tok.encode_prompt(text) } else { m.tok.encode(text) }.unwrap();
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
            let plain = m.tok.encode(text).unwrap();
            assert_eq!(&m.tok.decode(&plain).unwrap(), text, "{}: decoding {plain:?}", m.name);
            n += 1;
        }
        assert!(n > 0, "{}: golden data holds no encodings", m.name);
    }
}

#[test]
fn stream_decoder_emits_only_whole_characters() {
    // 𓀀 is in no vocabulary here: byte-level BPE and SentencePiece's byte fallback both spell it
    // with several tokens.
    let text = "naïve café — “quotes” 日本語 🚀 𓀀";
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
        // The token for the lone byte 0xF0, the start of a 4-byte character: "<0xF0>" in a
        // SentencePiece vocabulary, "ð" in a byte-level one.
        let lead = m.tok.token_to_id("<0xF0>").or_else(|| m.tok.token_to_id("ð")).unwrap();
        let mut stream = StreamDecoder::new(&m.tok);
        assert_eq!(stream.push(lead).unwrap(), "", "{}", m.name);
        assert_eq!(stream.finish().unwrap(), "\u{FFFD}", "{}", m.name);
        // finish leaves the decoder ready for a new stream.
        assert_eq!(stream.push(m.tok.token_to_id("a").unwrap()).unwrap(), "a", "{}", m.name);
    }
}

#[test]
fn special_tokens_and_eos() {
    for m in models().iter().filter(|m| m.tok.token_to_id("<|im_start|>").is_some()) {
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
    // Neither wants BOS before a prompt.
    for prefix in ["qwen", "smollm"] {
        let tok = &model(prefix).tok;
        assert!(!tok.add_bos(), "{prefix}");
        assert_eq!(tok.encode_prompt("Hello").unwrap(), tok.encode("Hello").unwrap(), "{prefix}");
    }
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

// ---- SentencePiece: Gemma 3 ----------------------------------------------------------------

const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

/// The Gemma 3 GGUF's metadata (parsed once; the tests below change copies of it).
fn gemma_gguf() -> &'static Gguf {
    static G: OnceLock<Gguf> = OnceLock::new();
    G.get_or_init(|| {
        let path = root().join("models").join(GEMMA);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}: run scripts/fetch-models.sh", path.display()));
        let g = Gguf::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // Only the metadata is needed.
        Gguf { version: g.version, metadata: g.metadata, tensors: Vec::new(), data_start: 0 }
    })
}

fn gemma() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_gguf(gemma_gguf()).unwrap())
}

/// Hard cases, with the ids llama.cpp gives (llama_tokenize, add_special off, parse_special on):
/// runs of spaces, tabs and newlines (user-defined tokens, matched whole), characters outside the
/// vocabulary (byte fallback), digits (one per token), HTML tags, and a literal "<0x0A>", which
/// is text, not the newline byte.
#[test]
fn gemma_encodes_like_llama_cpp() {
    let cases: &[(&str, &[u32])] = &[
        (" x  y   z ", &[1123, 138, 236762, 139, 236802, 236743]),
        ("𓀀🫨 fallback", &[478, 385, 366, 366, 478, 397, 409, 406, 90104]),
        ("<0x0A> literal", &[236820, 236771, 236781, 236771, 236776, 236813, 37087]),
        ("<table><tr><td>x</td></tr></table>", &[168, 173, 175, 236781, 183, 181, 176]),
        ("==========", &[84611]),
        ("\t\tdef f():\n\t\t\tpass\n", &[255969, 2063, 517, 6141, 107, 255970, 4373, 107]),
        (
            "1234567 3.14159",
            &[236770, 236778, 236800, 236812, 236810, 236825, 236832, 236743, 236800, 236761, 236770, 236812, 236770, 236810, 236819],
        ),
        ("emoji: 😀👍🏽", &[67906, 236787, 163543, 240493, 242713]),
        ("<bos>Hello<eos>", &[2, 9259, 1]),
        ("it's  \n  done", &[509, 236789, 236751, 138, 107, 138, 18450]),
        (
            "<start_of_turn>user\nWrite a Python function that reverses a string.<end_of_turn>\n<start_of_turn>model\n",
            &[105, 2364, 107, 6974, 496, 17856, 1292, 600, 140927, 496, 2483, 236761, 106, 107, 105, 4368, 107],
        ),
    ];
    let tok = gemma();
    for &(text, ids) in cases {
        assert_eq!(tok.encode(text).unwrap(), ids, "{text:?}");
        assert_eq!(tok.decode(ids).unwrap(), text, "{ids:?}");
    }
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.token_to_id("<start_of_turn>"), Some(105));
    assert_eq!(tok.id_to_token(248).as_deref(), Some("<0x0A>"));
}

#[test]
fn gemma_bos_and_eos() {
    let tok = gemma();
    assert!(tok.add_bos());
    assert_eq!(tok.bos_token().as_deref(), Some("<bos>"));
    // encode adds nothing; encode_prompt puts BOS first, once.
    assert_eq!(tok.encode("Hello").unwrap(), [9259]);
    assert_eq!(tok.encode_prompt("Hello").unwrap(), [2, 9259]);
    assert_eq!(tok.encode_prompt("<bos>Hello").unwrap(), [2, 9259]);
    assert_eq!(tok.encode_prompt("").unwrap(), [2]);
    // Generation ends at <end_of_turn> as well as at <eos>; templates' eos_token is <eos>.
    assert_eq!(tok.eos_ids(), [1, 106]);
    assert_eq!(tok.eos_token().as_deref(), Some("<eos>"));
    // The BOS setting can be given to a tokenizer.json, which does not carry it.
    let json = Tokenizer::from_json(tok.to_json().unwrap().as_bytes()).unwrap();
    assert!(!json.add_bos());
    assert_eq!(json.encode_prompt("Hello").unwrap(), [9259]);
    let json = json.with_bos(Some(2), true);
    assert!(json.add_bos());
    assert_eq!(json.encode_prompt("Hello").unwrap(), [2, 9259]);
}

#[test]
fn gemma_json_round_trip_encodes_the_same() {
    let tok = gemma();
    let back = Tokenizer::from_json(tok.to_json().unwrap().as_bytes()).unwrap();
    assert_eq!(back.vocab_size(), tok.vocab_size());
    for text in ["Hello, world!", "  two\t\ttabs\n\n", "𓀀 <start_of_turn>user\nhi<end_of_turn>", "x  y"] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(back.encode(text).unwrap(), ids, "{text:?}");
        assert_eq!(back.decode(&ids).unwrap(), text, "{text:?}");
    }
}

#[test]
fn gemma_byte_fallback_round_trips() {
    let tok = gemma();
    let text = "a𓀀b 🫨\u{1}";
    let ids = tok.encode(text).unwrap();
    // llama.cpp's ids: each character outside the vocabulary is its UTF-8 bytes, one <0xNN>
    // token each (U+0001 is in the vocabulary).
    assert_eq!(ids, [236746, 478, 385, 366, 366, 236763, 236743, 478, 397, 409, 406, 249732]);
    let bytes: Vec<String> = ids.iter().filter_map(|&i| tok.id_to_token(i)).filter(|t| t.starts_with("<0x")).collect();
    assert_eq!(bytes, ["<0xF0>", "<0x93>", "<0x80>", "<0x80>", "<0xF0>", "<0x9F>", "<0xAB>", "<0xA8>"]);
    assert_eq!(tok.decode(&ids).unwrap(), text);
    // Streamed, the pieces of a character are held back until it is whole.
    let mut stream = StreamDecoder::new(tok);
    let mut out = String::new();
    for &id in &ids {
        let piece = stream.push(id).unwrap();
        assert!(!piece.contains(char::REPLACEMENT_CHARACTER), "{piece:?}");
        out += &piece;
    }
    out += &stream.finish().unwrap();
    assert_eq!(out, text);
}

#[test]
fn gemma_chat_template() {
    let g = gemma_gguf();
    assert_eq!(g.get_str("tokenizer.chat_template"), None, "the file now has a template; test that one instead");
    let template = default_chat_template(g).expect("a built-in template for Gemma");
    assert_eq!(chat_template(g), Some(template));
    let tok = gemma();
    let render = |messages: &[ChatMessage]| {
        apply_chat_template(template, messages, tok.bos_token().as_deref(), tok.eos_token().as_deref()).unwrap()
    };
    let user = ChatMessage::new("user", "Write a Python function that reverses a string.");
    let text = render(std::slice::from_ref(&user));
    assert_eq!(
        text,
        "<bos><start_of_turn>user\nWrite a Python function that reverses a string.<end_of_turn>\n<start_of_turn>model\n"
    );
    // The template writes BOS: a prompt still starts with exactly one.
    let ids = tok.encode_prompt(&text).unwrap();
    assert_eq!(ids[..3], [2, 105, 2364]);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1);
    // A system message opens the first user turn; the assistant is "model"; text is trimmed.
    let text = render(&[
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", " hi \n"),
        ChatMessage::new("assistant", "Hello."),
        ChatMessage::new("user", "Bye"),
    ]);
    assert_eq!(
        text,
        "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
    // Only Gemma gets it; the others carry their own.
    for m in models().iter().filter(|m| !m.name.starts_with("gemma")) {
        let path = root().join("models").join(&m.name);
        let g = Gguf::parse(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(default_chat_template(&g), None, "{}", m.name);
        assert_eq!(chat_template(&g), g.get_str("tokenizer.chat_template"), "{}", m.name);
    }
}

/// A small SentencePiece vocabulary: specials, the 256 byte tokens, then pieces best first.
fn small_spm(space_prefix: bool) -> Gguf {
    const PIECES: [&str; 28] = [
        "▁", "e", "l", "o", "H", "w", "r", "d", "a", "b", "1", "2", "ll", "▁H", "He", "▁w", "llo", "▁He", "▁Hello", "or",
        "▁wor", "ld", "▁world", "▁▁", "ab", "▁a", "12", "▁1",
    ];
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "<|turn|>"].map(String::from).to_vec();
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    tokens.extend(PIECES.map(String::from));
    let n_fixed = 4 + 256;
    let scores = (0..tokens.len()).map(|i| Value::F32(if i < n_fixed { 0.0 } else { -((i - n_fixed) as f32) }));
    let types = (0..tokens.len()).map(|i| {
        Value::I32(match i {
            0 => 2,
            1..=3 => 3,
            4..=259 => 6,
            _ => 1,
        })
    });
    let mut m = HashMap::new();
    m.insert("general.architecture".into(), Value::String("llama".into()));
    m.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
    m.insert("tokenizer.ggml.tokens".into(), Value::Array(tokens.into_iter().map(Value::String).collect()));
    m.insert("tokenizer.ggml.scores".into(), Value::Array(scores.collect()));
    m.insert("tokenizer.ggml.token_type".into(), Value::Array(types.collect()));
    m.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(1));
    m.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(2));
    m.insert("tokenizer.ggml.unknown_token_id".into(), Value::U32(0));
    m.insert("tokenizer.ggml.add_space_prefix".into(), Value::Bool(space_prefix));
    Gguf { version: 3, metadata: m, tensors: Vec::new(), data_start: 0 }
}

/// `add_space_prefix` (Llama 2, Mistral): a space goes before each stretch of text, at the start
/// and after every special token. The ids are llama.cpp's for the same vocabulary.
#[test]
fn sentencepiece_space_prefix_like_llama_cpp() {
    let with: &[(&str, &[u32])] = &[
        ("Hello world", &[278, 282]),
        (" Hello", &[260, 278]),
        ("Hello  world", &[278, 260, 282]),
        ("<s>Hello", &[1, 278]),
        ("Hello<|turn|>world", &[278, 3, 282]),
        ("<|turn|> Hello", &[3, 260, 278]),
        ("ab 12 é", &[260, 284, 260, 286, 260, 199, 173]),
        ("", &[]),
        (" ", &[283]),
        ("\n", &[260, 14]),
        ("<unk>x", &[0, 260, 124]),
    ];
    let without: &[(&str, &[u32])] = &[
        ("Hello world", &[274, 276, 282]),
        (" Hello", &[278]),
        ("Hello  world", &[274, 276, 260, 282]),
        ("<s>Hello", &[1, 274, 276]),
        ("Hello<|turn|>world", &[274, 276, 3, 265, 279, 281]),
        ("<|turn|> Hello", &[3, 278]),
        ("ab 12 é", &[284, 260, 286, 260, 199, 173]),
        ("", &[]),
        (" ", &[260]),
        ("\n", &[14]),
        ("<unk>x", &[0, 124]),
    ];
    for (prefix, cases) in [(true, with), (false, without)] {
        let tok = Tokenizer::from_gguf(&small_spm(prefix)).unwrap();
        for &(text, ids) in cases {
            assert_eq!(tok.encode(text).unwrap(), ids, "add_space_prefix {prefix}: {text:?}");
        }
        // The prepended space is not decoded.
        assert_eq!(tok.decode(&tok.encode("Hello world").unwrap()).unwrap(), "Hello world", "{prefix}");
        // SentencePiece files that do not say want BOS.
        assert!(tok.add_bos());
        assert_eq!(tok.encode_prompt("Hello").unwrap()[0], 1);
    }
}

fn spm_error(edit: impl FnOnce(&mut HashMap<String, Value>)) -> String {
    let mut g = small_spm(false);
    edit(&mut g.metadata);
    match Tokenizer::from_gguf(&g) {
        Ok(_) => panic!("a malformed vocabulary was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn malformed_sentencepiece_vocabularies_are_clear_errors() {
    let set = |key: &'static str, v: Value| move |m: &mut HashMap<String, Value>| drop(m.insert(key.into(), v));
    let scores = "tokenizer.ggml.scores";
    let e = spm_error(|m| drop(m.remove(scores)));
    assert!(e.contains("tokenizer.ggml.scores is missing"), "{e}");
    let e = spm_error(set(scores, Value::Array(vec![Value::F32(0.0); 3])));
    assert!(e.contains("has 3 scores for 288 tokens"), "{e}");
    let e = spm_error(set(scores, Value::F32(0.0)));
    assert!(e.contains("tokenizer.ggml.scores is not an array"), "{e}");
    let e = spm_error(|m| {
        let Some(Value::Array(s)) = m.get_mut(scores) else { unreachable!() };
        s[270] = Value::F32(f32::NAN);
    });
    assert!(e.contains("tokenizer.ggml.scores[270]") && e.contains("not a number"), "{e}");
    let e = spm_error(|m| {
        let Some(Value::Array(s)) = m.get_mut(scores) else { unreachable!() };
        s[5] = Value::String("high".into());
    });
    assert!(e.contains("tokenizer.ggml.scores[5]"), "{e}");
    let e = spm_error(set("tokenizer.ggml.token_type", Value::Array(vec![Value::I32(1); 10])));
    assert!(e.contains("tokenizer.ggml.token_type has 10 entries for 288 tokens"), "{e}");
    let e = spm_error(|m| {
        let Some(Value::Array(t)) = m.get_mut("tokenizer.ggml.tokens") else { unreachable!() };
        t[287] = Value::String("▁H".into());
    });
    assert!(e.contains("token 287 (\"▁H\") repeats token 273"), "{e}");
    let e = spm_error(|m| {
        let Some(Value::Array(t)) = m.get_mut("tokenizer.ggml.tokens") else { unreachable!() };
        t[287] = Value::String("x".repeat(5000));
    });
    assert!(e.contains("token 287 is 5000 bytes long"), "{e}");
    let e = spm_error(set("tokenizer.ggml.tokens", Value::Array(Vec::new())));
    assert!(e.contains("tokenizer.ggml.tokens is empty"), "{e}");
    let e = spm_error(set("tokenizer.ggml.unknown_token_id", Value::U32(100_000)));
    assert!(e.contains("tokenizer.ggml.unknown_token_id"), "{e}");
    let e = spm_error(set("tokenizer.ggml.add_space_prefix", Value::String("yes".into())));
    assert!(e.contains("tokenizer.ggml.add_space_prefix"), "{e}");
    let e = spm_error(set("tokenizer.ggml.model", Value::String("t5".into())));
    assert!(e.contains("tokenizer model \"t5\" is not supported"), "{e}");
}
