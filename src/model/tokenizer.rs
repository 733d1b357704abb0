//! Text to token ids and back. A GGUF file carries its vocabulary and merges as metadata; they are
//! rebuilt into the tokenizer Hugging Face would load from the original `tokenizer.json`, so GGUF
//! and HF-directory models share one implementation and agree with the reference token for token.

use std::fmt;

use minijinja::syntax::SyntaxConfig;
use minijinja::{context, Environment, ErrorKind, Value as JinjaValue};
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{Error, Result};
use crate::model::gguf::{Gguf, Value};

/// The pre-tokenizer regex of Qwen2's `tokenizer.json`.
const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token types (llama.cpp's `llama_token_type`) that are matched whole in the input text.
const TOKEN_TYPE_CONTROL: u64 = 3;
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

/// `tokenizers` 0.23 builds each BPE merge's token in a buffer as long as the vocabulary's
/// longest token and panics when a merge is longer, or when its second part is shorter than the
/// continuing-subword prefix it strips: refuse such merges first. Anything else wrong with the
/// model it reports as an error itself.
fn check_bpe_merges(model: &serde_json::Value) -> Result<()> {
    let (Some(vocab), Some(merges)) = (model["vocab"].as_object(), model["merges"].as_array()) else {
        return Ok(());
    };
    let longest = vocab.keys().map(String::len).max().unwrap_or(0);
    let prefix = model["continuing_subword_prefix"].as_str().unwrap_or("");
    for (i, merge) in merges.iter().enumerate() {
        let (a, b) = match merge {
            serde_json::Value::String(m) => m.split_once(' ').unwrap_or((m, "")),
            serde_json::Value::Array(p) if p.len() == 2 => (p[0].as_str().unwrap_or(""), p[1].as_str().unwrap_or("")),
            _ => continue,
        };
        if !b.starts_with(prefix) || a.len() + b.len() - prefix.len() > longest {
            return Err(Error::Tokenizer(format!(
                "tokenizer.json: merge {i} ({a:?} + {b:?}) makes a token that is not in the vocabulary"
            )));
        }
    }
    Ok(())
}

fn err(e: impl fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos_ids: Vec<u32>,
    bos_id: Option<u32>,
}

impl fmt::Debug for Tokenizer {
    // The derived form would print the whole vocabulary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("eos_ids", &self.eos_ids)
            .field("bos_id", &self.bos_id)
            .finish()
    }
}

impl Tokenizer {
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let model = g.get_str("tokenizer.ggml.model").ok_or_else(|| {
            Error::Tokenizer("the GGUF file has no tokenizer (metadata key tokenizer.ggml.model is missing)".into())
        })?;
        if model != "gpt2" {
            return Err(Error::Tokenizer(format!(
                "GGUF tokenizer model {model:?} is not supported (only byte-level BPE, \"gpt2\", is)"
            )));
        }
        let tokens = g.get_strings("tokenizer.ggml.tokens")?;
        let vocab: Vocab = tokens.iter().zip(0u32..).map(|(t, i)| (t.to_string(), i)).collect();
        let merges = g
            .get_strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| Error::Tokenizer(format!("GGUF merge {m:?} is not two tokens")))
            })
            .collect::<Result<_>>()?;
        let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(err)?;
        let mut inner = tokenizers::Tokenizer::new(bpe);

        // Each arm mirrors the normalizer and pre-tokenizer of the model family's tokenizer.json.
        let pre: PreTokenizerWrapper = match g.get_str("tokenizer.ggml.pre").unwrap_or("default") {
            "qwen2" => {
                inner.with_normalizer(Some(NFC)).map_err(err)?;
                let split = Split::new(
                    SplitPattern::Regex(QWEN2_PATTERN.into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(err)?;
                Sequence::new(vec![split.into(), ByteLevel::new(false, false, false).into()]).into()
            }
            // SmolLM2's vocabulary has no token with more than one digit, so plain GPT-2
            // pre-tokenization already yields one digit per token. Splitting digits out first, as
            // llama.cpp's "smollm" does, would also split a whitespace run before a digit
            // differently from the reference ("\n\n   0" must end its run one space early).
            "smollm" | "default" | "gpt-2" => ByteLevel::new(false, true, true).into(),
            other => {
                return Err(Error::Tokenizer(format!(
                    "GGUF pre-tokenizer {other:?} is not supported (known: qwen2, smollm, gpt-2)"
                )))
            }
        };
        inner.with_pre_tokenizer(Some(pre));
        inner.with_decoder(Some(ByteLevel::default()));

        let types = g
            .get("tokenizer.ggml.token_type")
            .and_then(Value::as_array)
            .unwrap_or_default();
        let added = |want: u64| {
            tokens
                .iter()
                .zip(types)
                .filter(move |(_, ty)| ty.as_u64() == Some(want))
                .map(move |(t, _)| AddedToken::from(*t, want == TOKEN_TYPE_CONTROL).normalized(false))
        };
        inner.add_special_tokens(added(TOKEN_TYPE_CONTROL)).map_err(err)?;
        inner.add_tokens(added(TOKEN_TYPE_USER_DEFINED)).map_err(err)?;

        let n = tokens.len() as u64;
        let id = |key: &str| -> Result<Option<u32>> {
            g.get(key)
                .map(|v| {
                    v.as_u64().filter(|&i| i < n).map(|i| i as u32).ok_or_else(|| {
                        Error::Tokenizer(format!("{key} = {v:?} is not a token of the {n}-token vocabulary"))
                    })
                })
                .transpose()
        };
        let bos_id = id("tokenizer.ggml.bos_token_id")?;
        let mut eos_ids: Vec<u32> = id("tokenizer.ggml.eos_token_id")?.into_iter().collect();
        if let Some(eot) = id("tokenizer.ggml.eot_token_id")?.filter(|e| !eos_ids.contains(e)) {
            eos_ids.push(eot);
        }
        Ok(Tokenizer { inner, eos_ids, bos_id })
    }

    /// A `tokenizer.json`. It names no end-of-generation tokens; set them with [`Self::with_eos`].
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        // Parsed as JSON first: `tokenizers` 0.23 panics (an `expect` in its decoder's
        // deserializer) when the decoder object is not valid JSON text, but from an already
        // parsed value it can only return errors.
        let json: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| Error::Tokenizer(format!("tokenizer.json is not valid JSON: {e}")))?;
        check_bpe_merges(&json["model"])?;
        let inner: tokenizers::Tokenizer = serde_json::from_value(json).map_err(err)?;
        Ok(Tokenizer {
            inner,
            eos_ids: Vec::new(),
            bos_id: None,
        })
    }

    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(err)
    }

    /// Special tokens written in the text (e.g. `<|im_start|>`) become their single ids; no BOS or
    /// other tokens are added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.inner.encode_fast(text, false).map_err(err)?.get_ids().to_vec())
    }

    /// Special tokens are kept in the text so a transcript shows exactly what the model produced.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(err)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        self.inner.token_to_id(s)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// A hash of the whole vocabulary (every id's token): two tokenizers that agree on it map
    /// ids to the same strings, which is what a draft and its target must share. For a draft
    /// in another worker, where the tokenizers cannot be compared directly.
    pub fn vocab_fingerprint(&self) -> String {
        const FNV_PRIME: u64 = 0x100_0000_01b3;
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let n = self.vocab_size() as u32;
        for id in 0..n {
            for b in self.id_to_token(id).unwrap_or_default().bytes().chain([0xff]) {
                h = (h ^ u64::from(b)).wrapping_mul(FNV_PRIME);
            }
        }
        format!("{n}:{h:016x}")
    }

    /// Ids of the added tokens (control and user-defined: chat markers, end of text, ...), sorted.
    pub fn added_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.inner.get_added_tokens_decoder().keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Token ids that end generation.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Replace the end-of-generation ids; the first is the one templates know as `eos_token`.
    pub fn with_eos(mut self, ids: Vec<u32>) -> Self {
        self.eos_ids = ids;
        self
    }

    pub fn bos_token(&self) -> Option<String> {
        self.bos_id.and_then(|id| self.id_to_token(id))
    }

    pub fn eos_token(&self) -> Option<String> {
        self.eos_ids.first().and_then(|&id| self.id_to_token(id))
    }
}

/// Incremental detokenizer: feed ids one at a time, get back only text whose UTF-8 is complete
/// (a multi-byte character split across byte-level tokens is held back until complete).
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    /// The tokens already emitted that are kept as context (decoders such as Metaspace treat
    /// the first token of a sequence differently), followed by those not yet emitted.
    ids: Vec<u32>,
    emitted: usize,
    /// The decoding of `ids[..emitted]`.
    prefix: String,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer) -> Self {
        StreamDecoder {
            tok,
            ids: Vec::new(),
            emitted: 0,
            prefix: String::new(),
        }
    }

    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tok.decode(&self.ids)?;
        // An incomplete UTF-8 sequence at the end decodes to U+FFFD: wait for its next bytes.
        if text.len() <= self.prefix.len() || text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(String::new());
        }
        let new = self.new_text(&text)?;
        self.ids.drain(..self.emitted);
        self.emitted = self.ids.len();
        self.prefix = self.tok.decode(&self.ids)?;
        Ok(new)
    }

    /// Whatever is still held back, incomplete characters included (as U+FFFD).
    pub fn finish(&mut self) -> Result<String> {
        let text = self.tok.decode(&self.ids)?;
        let rest = if text.len() > self.prefix.len() {
            self.new_text(&text)?
        } else {
            String::new()
        };
        *self = StreamDecoder::new(self.tok);
        Ok(rest)
    }

    fn new_text(&self, text: &str) -> Result<String> {
        text.strip_prefix(self.prefix.as_str())
            .map(str::to_owned)
            .ok_or_else(|| {
                Error::Tokenizer(format!(
                    "stream decoding: {text:?} does not extend the text already emitted, {:?}",
                    self.prefix
                ))
            })
    }
}

/// One message of a conversation, as chat templates (and OpenAI-style APIs) take them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

/// Render a chat template (Jinja, minijinja) for a conversation, with
/// `add_generation_prompt = true` so the model answers as the assistant next.
pub fn apply_chat_template(
    template: &str,
    messages: &[ChatMessage],
    bos: Option<&str>,
    eos: Option<&str>,
) -> Result<String> {
    let mut env = Environment::new();
    // transformers renders chat templates with these two set; templates are written for them.
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(err)?;
    env.set_syntax(syntax);
    env.add_function("raise_exception", |msg: String| -> Result<(), minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
    });
    let messages: Vec<_> = messages.iter().map(|m| context! { role => m.role.as_str(), content => m.content.as_str() }).collect();
    // An absent token must be undefined, which renders as "", not none, which renders as "none".
    let token = |t: Option<&str>| t.map_or(JinjaValue::UNDEFINED, JinjaValue::from);
    let ctx = context! {
        messages,
        add_generation_prompt => true,
        bos_token => token(bos),
        eos_token => token(eos),
    };
    env.render_str(template, ctx)
        .map_err(|e| Error::Tokenizer(format!("chat template: {e:#}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid GGUF header with one metadata entry and no tensors.
    fn gguf_without_tokenizer() -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        let (key, val) = ("general.architecture", "qwen2");
        b.extend((key.len() as u64).to_le_bytes());
        b.extend(key.as_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend((val.len() as u64).to_le_bytes());
        b.extend(val.as_bytes());
        b
    }

    #[test]
    fn gguf_without_tokenizer_is_a_clear_error() {
        let g = Gguf::parse(&gguf_without_tokenizer()).unwrap();
        let e = Tokenizer::from_gguf(&g).unwrap_err();
        assert!(matches!(e, Error::Tokenizer(_)), "{e:?}");
        assert!(
            e.to_string()
                .contains("no tokenizer (metadata key tokenizer.ggml.model is missing)"),
            "{e}"
        );
    }

    #[test]
    fn chat_template_with_system_message_and_tokens() {
        let t = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}\n{% endfor %}\
                 {% if add_generation_prompt %}[assistant]{% endif %}";
        let out = apply_chat_template(t, &[ChatMessage::new("system", "be brief"), ChatMessage::new("user", "hi")], Some("<s>"), None).unwrap();
        assert_eq!(out, "<s>[system]be brief\n[user]hi\n[assistant]");
    }

    #[test]
    fn chat_template_raise_exception_is_an_error() {
        let e = apply_chat_template("{{ raise_exception('no system role') }}", &[ChatMessage::new("user", "hi")], None, None).unwrap_err();
        assert!(e.to_string().contains("no system role"), "{e}");
    }
}
