//! Text to token ids and back. A GGUF file carries its vocabulary as metadata, with the merges
//! (byte-level BPE) or each token's score (SentencePiece, whose merges are derived from them); it is
//! rebuilt into the tokenizer Hugging Face would load from the original `tokenizer.json`, so GGUF
//! and HF-directory models share one implementation and agree with the reference token for token.

use std::borrow::Borrow;
use std::fmt;

use minijinja::syntax::SyntaxConfig;
use minijinja::{context, Environment, ErrorKind, Value as JinjaValue};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{Error, Result};
use crate::model::gguf::{Gguf, Value};

/// The pre-tokenizer regex of Qwen2's `tokenizer.json`.
const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer regex of Llama 3's `tokenizer.json`: Qwen2's, but digits go in runs of up to
/// three.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token types (llama.cpp's `llama_token_type`). Unknown, control and user-defined tokens
/// are matched whole in the input text, before the model sees it.
const TOKEN_TYPE_NORMAL: u64 = 1;
const TOKEN_TYPE_UNKNOWN: u64 = 2;
const TOKEN_TYPE_CONTROL: u64 = 3;
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

/// SentencePiece writes spaces as this character, so that they are part of the tokens.
const SPM_SPACE: &str = "\u{2581}";

/// The longest SentencePiece token (in bytes) whose merges are derived. Real vocabularies stay
/// under a hundred bytes; the bound keeps the derivation linear in the vocabulary's size.
const MAX_SPM_TOKEN_BYTES: usize = 1024;

/// Tokens that end a chat turn, for chat formats whose GGUF files often name only the
/// end-of-text token as EOS: generation must stop at them too.
const TURN_END_TOKENS: [&str; 4] = ["<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"];

/// Gemma's chat format, for Gemma GGUF files that carry no template: a system message opens the
/// first user turn, the assistant is called "model", and each turn's text is trimmed.
const GEMMA_CHAT_TEMPLATE: &str = "{{ bos_token }}\
{% set ns = namespace(prefix='') %}\
{% for m in messages %}\
{% if m.role == 'system' %}\
{% if not loop.first %}{{ raise_exception('Gemma: only the first message may be a system message') }}{% endif %}\
{% set ns.prefix = m.content ~ '\\n\\n' %}\
{% else %}\
{% if m.role == 'assistant' or m.role == 'model' %}{% set role = 'model' %}{% else %}{% set role = m.role %}{% endif %}\
{{ '<start_of_turn>' ~ role ~ '\\n' ~ ns.prefix ~ (m.content | trim) ~ '<end_of_turn>\\n' }}\
{% set ns.prefix = '' %}\
{% endif %}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

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

/// Each token's GGUF type; all normal when the file gives none, as llama.cpp reads it.
fn token_types(g: &Gguf, n: usize) -> Result<Vec<u64>> {
    const KEY: &str = "tokenizer.ggml.token_type";
    let Some(v) = g.get(KEY) else {
        return Ok(vec![TOKEN_TYPE_NORMAL; n]);
    };
    let types = v.as_array().ok_or_else(|| Error::Tokenizer(format!("GGUF {KEY} is not an array")))?;
    if types.len() != n {
        return Err(Error::Tokenizer(format!("GGUF {KEY} has {} entries for {n} tokens", types.len())));
    }
    types
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_u64().ok_or_else(|| Error::Tokenizer(format!("GGUF {KEY}[{i}] = {t:?} is not a token type")))
        })
        .collect()
}

/// A GGUF boolean flag, `default` when absent.
fn flag(g: &Gguf, key: &str, default: bool) -> Result<bool> {
    match g.get(key) {
        None => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| Error::Tokenizer(format!("GGUF {key} = {v:?} is not a boolean"))),
    }
}

/// The vocabulary as a map, refusing a token that appears twice: the second id would be
/// unreachable and decode to nothing.
fn vocab_map(tokens: &[&str]) -> Result<Vocab> {
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (&t, id) in tokens.iter().zip(0u32..) {
        if let Some(first) = vocab.insert(t.to_owned(), id) {
            return Err(Error::Tokenizer(format!("GGUF vocabulary: token {id} ({t:?}) repeats token {first}")));
        }
    }
    Ok(vocab)
}

/// Byte-level BPE (`tokenizer.ggml.model` = "gpt2"): the merges are in the file. Returns the
/// tokenizer and whether the model family adds BOS when the file does not say.
fn byte_level_bpe(g: &Gguf, tokens: &[&str]) -> Result<(tokenizers::Tokenizer, bool)> {
    let vocab: Vocab = tokens.iter().zip(0u32..).map(|(t, i)| (t.to_string(), i)).collect();
    let longest = tokens.iter().map(|t| t.len()).max().unwrap_or(0);
    let merges = g
        .get_strings("tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| {
            m.split_once(' ')
                // A merge longer than every token cannot make one (and `tokenizers` would panic).
                .filter(|(a, b)| a.len() + b.len() <= longest)
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| Error::Tokenizer(format!("GGUF merge {m:?} is not two tokens that make a token")))
        })
        .collect::<Result<_>>()?;

    // Each arm mirrors the normalizer, pre-tokenizer and BPE options of the model family's
    // tokenizer.json.
    let regex_split = |pattern: &str| -> Result<PreTokenizerWrapper> {
        let split =
            Split::new(SplitPattern::Regex(pattern.into()), SplitDelimiterBehavior::Isolated, false).map_err(err)?;
        Ok(Sequence::new(vec![split.into(), ByteLevel::new(false, false, false).into()]).into())
    };
    let (pre, nfc, ignore_merges, add_bos): (PreTokenizerWrapper, bool, bool, bool) =
        match g.get_str("tokenizer.ggml.pre").unwrap_or("default") {
            "qwen2" => (regex_split(QWEN2_PATTERN)?, true, false, false),
            // Llama 3 takes a word that is a token whole before trying merges, and wants BOS.
            "llama-bpe" | "llama3" | "llama-v3" => (regex_split(LLAMA3_PATTERN)?, false, true, true),
            // SmolLM2's vocabulary has no token with more than one digit, so plain GPT-2
            // pre-tokenization already yields one digit per token. Splitting digits out first, as
            // llama.cpp's "smollm" does, would also split a whitespace run before a digit
            // differently from the reference ("\n\n   0" must end its run one space early).
            "smollm" | "default" | "gpt-2" => (ByteLevel::new(false, true, true).into(), false, false, false),
            other => {
                return Err(Error::Tokenizer(format!(
                    "GGUF pre-tokenizer {other:?} is not supported (known: qwen2, llama-bpe, smollm, gpt-2)"
                )))
            }
        };
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(ignore_merges).build().map_err(err)?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    if nfc {
        inner.with_normalizer(Some(NFC)).map_err(err)?;
    }
    inner.with_pre_tokenizer(Some(pre));
    inner.with_decoder(Some(ByteLevel::default()));
    Ok((inner, add_bos))
}

/// Each token's SentencePiece score, checked: one finite-or-infinite number per token.
fn spm_scores(g: &Gguf, n: usize) -> Result<Vec<f32>> {
    const KEY: &str = "tokenizer.ggml.scores";
    let scores = g
        .get(KEY)
        .ok_or_else(|| {
            Error::Tokenizer(format!("GGUF {KEY} is missing: a SentencePiece vocabulary needs a score per token"))
        })?
        .as_array()
        .ok_or_else(|| Error::Tokenizer(format!("GGUF {KEY} is not an array")))?;
    if scores.len() != n {
        return Err(Error::Tokenizer(format!("GGUF {KEY} has {} scores for {n} tokens", scores.len())));
    }
    scores
        .iter()
        .enumerate()
        .map(|(i, s)| match s.as_f64() {
            // + 0.0 makes -0.0 equal to 0.0 under total ordering, as the scores compare in llama.cpp.
            Some(x) if !x.is_nan() => Ok(x as f32 + 0.0),
            _ => Err(Error::Tokenizer(format!("GGUF {KEY}[{i}] = {s:?} is not a number"))),
        })
        .collect()
}

/// The BPE merges that reproduce SentencePiece's BPE encoding: that joins, again and again, the
/// adjacent pair whose concatenation is the best-scored token (the leftmost among equals). So
/// every way of writing a token as two tokens is a merge, ranked by the token's score, best
/// first. Unknown, control and user-defined tokens are matched whole before BPE and make none.
///
/// Linear in the vocabulary's length in bytes: each token is cut at each character boundary and
/// both halves looked up.
pub(crate) fn spm_merges(
    tokens: &[&str],
    types: &[u64],
    scores: &[f32],
    vocab: &Vocab,
) -> Result<Vec<(String, String)>> {
    // (score, token, left, right): 16 bytes each while sorting.
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new();
    for ((&t, &ty), (&score, id)) in tokens.iter().zip(types).zip(scores.iter().zip(0u32..)) {
        if matches!(ty, TOKEN_TYPE_UNKNOWN | TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED) {
            continue;
        }
        if t.len() > MAX_SPM_TOKEN_BYTES {
            return Err(Error::Tokenizer(format!(
                "GGUF vocabulary: token {id} is {} bytes long (at most {MAX_SPM_TOKEN_BYTES} are supported)",
                t.len()
            )));
        }
        for (k, _) in t.char_indices().skip(1) {
            if let (Some(&a), Some(&b)) = (vocab.get(&t[..k]), vocab.get(&t[k..])) {
                ranked.push((score, id, a, b));
            }
        }
    }
    ranked.sort_unstable_by(|x, y| y.0.total_cmp(&x.0).then((x.1, x.2, x.3).cmp(&(y.1, y.2, y.3))));
    Ok(ranked.into_iter().map(|(_, _, a, b)| (tokens[a as usize].to_owned(), tokens[b as usize].to_owned())).collect())
}

/// SentencePiece BPE (`tokenizer.ggml.model` = "llama": Llama 2, Mistral, Gemma), as the
/// `tokenizer.json` Hugging Face converts from it: spaces become U+2581 (with one prepended to
/// each stretch of text when `add_space_prefix`), merges come from the scores, and a character
/// outside the vocabulary falls back to its UTF-8 bytes, tokens such as `<0x0A>`.
fn sentencepiece_bpe(g: &Gguf, tokens: &[&str], types: &[u64]) -> Result<tokenizers::Tokenizer> {
    let scores = spm_scores(g, tokens.len())?;
    let vocab = vocab_map(tokens)?;
    let merges = spm_merges(tokens, types, &scores, &vocab)?;
    let mut bpe = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
    if let Some(unk) = token_id(g, "tokenizer.ggml.unknown_token_id", tokens.len())? {
        bpe = bpe.unk_token(tokens[unk as usize].to_owned());
    }
    let mut inner = tokenizers::Tokenizer::new(bpe.build().map_err(err)?);

    // llama.cpp's default for SentencePiece files that do not say (Llama 2 wants the space).
    let space_prefix = flag(g, "tokenizer.ggml.add_space_prefix", true)?;
    let escape: NormalizerWrapper = Replace::new(" ", SPM_SPACE).map_err(err)?.into();
    let normalizer: NormalizerWrapper = if space_prefix {
        NormalizerSequence::new(vec![Prepend::new(SPM_SPACE.into()).into(), escape]).into()
    } else {
        escape
    };
    inner.with_normalizer(Some(normalizer)).map_err(err)?;
    let mut decoders: Vec<DecoderWrapper> =
        vec![Replace::new(SPM_SPACE, " ").map_err(err)?.into(), ByteFallback::new().into(), Fuse::new().into()];
    if space_prefix {
        // The prepended space is not part of the text.
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(inner)
}

/// A token id from the GGUF metadata, checked against the vocabulary.
fn token_id(g: &Gguf, key: &str, n: usize) -> Result<Option<u32>> {
    g.get(key)
        .map(|v| {
            v.as_u64()
                .filter(|&i| i < n as u64)
                .map(|i| i as u32)
                .ok_or_else(|| Error::Tokenizer(format!("{key} = {v:?} is not a token of the {n}-token vocabulary")))
        })
        .transpose()
}

#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos_ids: Vec<u32>,
    bos_id: Option<u32>,
    /// Whether prompts start with BOS (`tokenizer.ggml.add_bos_token`).
    add_bos: bool,
}

impl fmt::Debug for Tokenizer {
    // The derived form would print the whole vocabulary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("eos_ids", &self.eos_ids)
            .field("bos_id", &self.bos_id)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

impl Tokenizer {
    /// The tokenizer a GGUF file describes: byte-level BPE (`tokenizer.ggml.model` = "gpt2":
    /// Qwen, SmolLM, Llama 3) or SentencePiece BPE ("llama": Llama 2, Mistral, Gemma).
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let model = g.get_str("tokenizer.ggml.model").ok_or_else(|| {
            Error::Tokenizer("the GGUF file has no tokenizer (metadata key tokenizer.ggml.model is missing)".into())
        })?;
        let tokens = g.get_strings("tokenizer.ggml.tokens")?;
        if tokens.is_empty() {
            return Err(Error::Tokenizer("GGUF tokenizer.ggml.tokens is empty".into()));
        }
        let types = token_types(g, tokens.len())?;
        let (mut inner, add_bos_default) = match model {
            "gpt2" => byte_level_bpe(g, &tokens)?,
            // llama.cpp adds BOS for SentencePiece files that do not say.
            "llama" => (sentencepiece_bpe(g, &tokens, &types)?, true),
            other => {
                return Err(Error::Tokenizer(format!(
                    "GGUF tokenizer model {other:?} is not supported (only byte-level BPE, \"gpt2\", and SentencePiece BPE, \"llama\", are)"
                )))
            }
        };

        let added = |special: bool| {
            tokens
                .iter()
                .zip(&types)
                .filter(move |(_, &ty)| match ty {
                    TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN => special,
                    TOKEN_TYPE_USER_DEFINED => !special,
                    _ => false,
                })
                .map(move |(t, _)| AddedToken::from(*t, special).normalized(false))
        };
        inner.add_special_tokens(added(true)).map_err(err)?;
        inner.add_tokens(added(false)).map_err(err)?;

        let n = tokens.len();
        let bos_id = token_id(g, "tokenizer.ggml.bos_token_id", n)?;
        let mut eos_ids: Vec<u32> = token_id(g, "tokenizer.ggml.eos_token_id", n)?.into_iter().collect();
        let eot = token_id(g, "tokenizer.ggml.eot_token_id", n)?;
        let turn_ends = TURN_END_TOKENS.iter().filter_map(|t| inner.token_to_id(t));
        for id in eot.into_iter().chain(turn_ends) {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let add_bos = flag(g, "tokenizer.ggml.add_bos_token", add_bos_default)?;
        Ok(Tokenizer { inner, eos_ids, bos_id, add_bos })
    }

    /// A `tokenizer.json`. It names no end-of-generation tokens; set them with [`Self::with_eos`].
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        // Parsed as JSON first: `tokenizers` 0.23 panics (an `expect` in its decoder's
        // deserializer) when the decoder object is not valid JSON text, but from an already
        // parsed value it can only return errors.
        let json: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::Tokenizer(format!("tokenizer.json is not valid JSON: {e}")))?;
        check_bpe_merges(&json["model"])?;
        let inner: tokenizers::Tokenizer = serde_json::from_value(json).map_err(err)?;
        Ok(Tokenizer { inner, eos_ids: Vec::new(), bos_id: None, add_bos: false })
    }

    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(err)
    }

    /// Special tokens written in the text (e.g. `<|im_start|>`) become their single ids; no BOS or
    /// other tokens are added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.inner.encode_fast(text, false).map_err(err)?.get_ids().to_vec())
    }

    /// A prompt's ids: [`Self::encode`], with BOS first when the model wants it
    /// ([`Self::add_bos`]) and the text does not already begin with it (a chat template that
    /// writes `bos_token` itself).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(text)?;
        if let Some(bos) = self.bos_id.filter(|_| self.add_bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// Whether [`Self::encode_prompt`] starts prompts with BOS: the model was trained so (GGUF
    /// `tokenizer.ggml.add_bos_token`, or the model family's default) and it has a BOS token.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos_id.is_some()
    }

    /// Set the BOS token and whether prompts start with it, for a tokenizer from
    /// [`Self::from_json`] (where `tokenizer_config.json` says so).
    pub fn with_bos(mut self, id: Option<u32>, add: bool) -> Self {
        self.bos_id = id;
        self.add_bos = add;
        self
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

    /// The text of each token that ends generation.
    pub fn eos_texts(&self) -> Vec<String> {
        self.eos_ids.iter().filter_map(|&id| self.id_to_token(id)).collect()
    }

    pub fn eos_token(&self) -> Option<String> {
        self.eos_ids.first().and_then(|&id| self.id_to_token(id))
    }
}

/// Incremental detokenizer: feed ids one at a time, get back only text whose UTF-8 is complete
/// (a multi-byte character split across byte-level tokens is held back until complete). It
/// holds its tokenizer as `&Tokenizer`, or shared (`Rc<Tokenizer>`) where it outlives a borrow.
pub struct StreamDecoder<T: Borrow<Tokenizer>> {
    tok: T,
    /// The tokens already emitted that are kept as context (decoders such as Metaspace treat
    /// the first token of a sequence differently), followed by those not yet emitted.
    ids: Vec<u32>,
    emitted: usize,
    /// The decoding of `ids[..emitted]`.
    prefix: String,
}

impl<T: Borrow<Tokenizer>> StreamDecoder<T> {
    pub fn new(tok: T) -> Self {
        StreamDecoder { tok, ids: Vec::new(), emitted: 0, prefix: String::new() }
    }

    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tok.borrow().decode(&self.ids)?;
        // An incomplete UTF-8 sequence at the end decodes to U+FFFD: wait for its next bytes.
        if text.len() <= self.prefix.len() || text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(String::new());
        }
        let new = self.new_text(&text)?;
        self.ids.drain(..self.emitted);
        self.emitted = self.ids.len();
        self.prefix = self.tok.borrow().decode(&self.ids)?;
        Ok(new)
    }

    /// [`StreamDecoder::push`] of each of `ids`: their complete text.
    pub fn push_all(&mut self, ids: &[u32]) -> Result<String> {
        let mut text = String::new();
        for &id in ids {
            text += &self.push(id)?;
        }
        Ok(text)
    }

    /// Whatever is still held back, incomplete characters included (as U+FFFD).
    pub fn finish(&mut self) -> Result<String> {
        let text = self.tok.borrow().decode(&self.ids)?;
        let rest = if text.len() > self.prefix.len() { self.new_text(&text)? } else { String::new() };
        self.ids.clear();
        self.emitted = 0;
        self.prefix.clear();
        Ok(rest)
    }

    fn new_text(&self, text: &str) -> Result<String> {
        text.strip_prefix(self.prefix.as_str()).map(str::to_owned).ok_or_else(|| {
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
    /// `system`, `user`, `assistant` or `tool` (a call's result).
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls, as templates take them: `{type: "function", function:
    /// {name, arguments}}`, the arguments an object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage { role: role.into(), content: content.into(), tool_calls: Vec::new() }
    }
}

/// Render a chat template (Jinja, minijinja) for a conversation, with
/// `add_generation_prompt = true` so the model answers as the assistant next.
pub fn apply_chat_template(template: &str, messages: &[ChatMessage], bos: Option<&str>, eos: Option<&str>) -> Result<String> {
    apply_chat_template_with_tools(template, messages, &[], bos, eos)
}

/// [`apply_chat_template`] with the functions the model may call (OpenAI's `tools`, which
/// templates list as they are); none: `tools` is left undefined, as transformers leaves it.
pub fn apply_chat_template_with_tools(
    template: &str,
    messages: &[ChatMessage],
    tools: &[serde_json::Value],
    bos: Option<&str>,
    eos: Option<&str>,
) -> Result<String> {
    let mut env = Environment::new();
    // transformers renders chat templates with these two set; templates are written for them.
    let syntax = SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().map_err(err)?;
    env.set_syntax(syntax);
    env.add_function("raise_exception", |msg: String| -> Result<(), minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
    });
    let messages: Vec<_> = messages
        .iter()
        .map(|m| match m.tool_calls.is_empty() {
            true => context! { role => m.role.as_str(), content => m.content.as_str() },
            false => context! { role => m.role.as_str(), content => m.content.as_str(), tool_calls => JinjaValue::from(minijinja::value::Serde(&m.tool_calls)) },
        })
        .collect();
    // An absent token must be undefined, which renders as "", not none, which renders as "none".
    let token = |t: Option<&str>| t.map_or(JinjaValue::UNDEFINED, JinjaValue::from);
    let tools = if tools.is_empty() { JinjaValue::UNDEFINED } else { JinjaValue::from(minijinja::value::Serde(tools)) };
    let ctx = context! {
        messages,
        tools,
        add_generation_prompt => true,
        bos_token => token(bos),
        eos_token => token(eos),
    };
    env.render_str(template, ctx).map_err(|e| Error::Tokenizer(format!("chat template: {e:#}")))
}

/// The chat template built in for a model family whose GGUF files carry none: Gemma's turn
/// format (`<start_of_turn>user\n...<end_of_turn>\n`, the assistant's turns as `model`, a system
/// message folded into the first user turn), for a Gemma model with Gemma's turn tokens. `None`
/// for other models. Render it with [`apply_chat_template`] and the tokenizer's
/// [`Tokenizer::bos_token`]; it writes BOS itself.
pub fn default_chat_template(g: &Gguf) -> Option<&'static str> {
    let gemma = g.get_str("general.architecture")?.starts_with("gemma");
    let tokens = g.get("tokenizer.ggml.tokens").and_then(Value::as_array)?;
    let has = |t: &str| tokens.iter().any(|v| v.as_str() == Some(t));
    (gemma && has("<start_of_turn>") && has("<end_of_turn>")).then_some(GEMMA_CHAT_TEMPLATE)
}

/// The model's chat template: the GGUF file's own (`tokenizer.chat_template`), else the built-in
/// [`default_chat_template`].
pub fn chat_template(g: &Gguf) -> Option<&str> {
    g.get_str("tokenizer.chat_template").or_else(|| default_chat_template(g))
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
        assert!(e.to_string().contains("no tokenizer (metadata key tokenizer.ggml.model is missing)"), "{e}");
    }

    fn strings(v: &[&str]) -> Value {
        Value::Array(v.iter().map(|s| Value::String((*s).into())).collect())
    }

    /// A byte-level BPE GGUF's metadata: the given tokens after the 256 byte symbols (GPT-2's
    /// byte-to-character map; digits and letters stand for themselves), with these merges.
    fn byte_level_gguf(pre: &str, extra: &[&str], merges: &[&str]) -> Gguf {
        let bytes = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet();
        let mut tokens: Vec<String> = bytes.into_iter().map(String::from).collect();
        tokens.sort();
        tokens.extend(extra.iter().map(|s| s.to_string()));
        let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let mut m = std::collections::HashMap::new();
        m.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
        m.insert("tokenizer.ggml.pre".into(), Value::String(pre.into()));
        m.insert("tokenizer.ggml.tokens".into(), strings(&tokens));
        m.insert("tokenizer.ggml.merges".into(), strings(merges));
        Gguf { version: 3, metadata: m, tensors: Vec::new(), data_start: 0 }
    }

    fn pieces(tok: &Tokenizer, text: &str) -> Vec<String> {
        tok.encode(text).unwrap().into_iter().map(|i| tok.id_to_token(i).unwrap()).collect()
    }

    #[test]
    fn llama3_pre_tokenizer_groups_digits_in_threes_and_takes_whole_words() {
        // "3 4" ranks first: without the split into "123" and "45" it would make "34".
        let merges = ["3 4", "1 2", "12 3", "4 5"];
        let extra = ["34", "12", "123", "45", "abc"];
        let llama3 = Tokenizer::from_gguf(&byte_level_gguf("llama-bpe", &extra, &merges)).unwrap();
        assert_eq!(pieces(&llama3, "12345"), ["123", "45"]);
        // A word that is a token is taken whole, though no merges make it.
        assert_eq!(pieces(&llama3, "abc"), ["abc"]);
        // Llama 3 wants BOS when the file does not say; Qwen2 does not.
        let mut g = byte_level_gguf("llama-bpe", &extra, &merges);
        g.metadata.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(0));
        assert!(Tokenizer::from_gguf(&g).unwrap().add_bos());
        g.metadata.insert("tokenizer.ggml.pre".into(), Value::String("qwen2".into()));
        assert!(!Tokenizer::from_gguf(&g).unwrap().add_bos());
        let qwen = Tokenizer::from_gguf(&byte_level_gguf("qwen2", &extra, &merges)).unwrap();
        assert_eq!(pieces(&qwen, "12345"), ["1", "2", "3", "4", "5"]);
        assert_eq!(pieces(&qwen, "abc"), ["a", "b", "c"]);
        let gpt2 = Tokenizer::from_gguf(&byte_level_gguf("gpt-2", &extra, &merges)).unwrap();
        assert_eq!(pieces(&gpt2, "12345"), ["12", "34", "5"]);
    }

    #[test]
    fn byte_level_merge_longer_than_any_token_is_an_error() {
        let e = Tokenizer::from_gguf(&byte_level_gguf("gpt-2", &["ab"], &["ab ab"])).unwrap_err();
        assert!(e.to_string().contains("\"ab ab\" is not two tokens that make a token"), "{e}");
    }

    #[test]
    fn sentencepiece_merges_rank_by_the_merged_tokens_score() {
        let tokens = ["<ctl>", "a", "b", "c", "ab", "bc", "abc", "<a>"];
        let types = [TOKEN_TYPE_CONTROL, 1, 1, 1, 1, 1, 1, TOKEN_TYPE_USER_DEFINED];
        let scores = [0.0, -1.0, -2.0, -3.0, -6.0, -4.0, -5.0, 0.0];
        let vocab = vocab_map(&tokens).unwrap();
        let merges = spm_merges(&tokens, &types, &scores, &vocab).unwrap();
        let merges: Vec<(&str, &str)> = merges.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        // "bc" (-4) before both ways to "abc" (-5) before "ab" (-6); control and user-defined
        // tokens are matched whole and make no merges.
        assert_eq!(merges, [("b", "c"), ("a", "bc"), ("ab", "c"), ("a", "b")]);
    }

    #[test]
    fn chat_template_with_system_message_and_tokens() {
        let t = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}\n{% endfor %}\
                 {% if add_generation_prompt %}[assistant]{% endif %}";
        let out = apply_chat_template(
            t,
            &[ChatMessage::new("system", "be brief"), ChatMessage::new("user", "hi")],
            Some("<s>"),
            None,
        )
        .unwrap();
        assert_eq!(out, "<s>[system]be brief\n[user]hi\n[assistant]");
    }

    #[test]
    fn chat_template_raise_exception_is_an_error() {
        let e = apply_chat_template(
            "{{ raise_exception('no system role') }}",
            &[ChatMessage::new("user", "hi")],
            None,
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("no system role"), "{e}");
    }
}
