//! Structured output: a JSON Schema, "any JSON object", a regex or a Lark grammar, compiled once
//! against the model's vocabulary (llguidance, the grammar engine of llama.cpp and vLLM) into a
//! [`Grammar`]. Each generation walks it with a [`Constraint`], which says which tokens may come
//! next; the decoding strategies turn that into masks on the models' output rows
//! ([`crate::backend::Allowed`]).
//!
//! One rule makes every mode agree: where the grammar forces the next bytes, the next token is
//! the first of their canonical tokenization (llguidance's forced tokens), whatever the model
//! scores; elsewhere it is the model's pick among the tokens the grammar allows. A stop token
//! is allowed exactly where the grammar accepts.

mod constraint;
pub mod tools;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

pub use constraint::{Constraint, GrammarStats};

use crate::error::{Error, Result};
use crate::model::tokenizer::Tokenizer;

/// What the output must match.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrammarSpec {
    /// A JSON Schema (draft 2020-12 and its common subset).
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// A regular expression the whole output matches.
    Regex(String),
    /// A Lark grammar in llguidance's dialect (it also takes JSON schemas and regexes inside rules).
    Lark(String),
}

impl GrammarSpec {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonSchema(schema) => TopLevelGrammar::from_json_schema(schema.clone()),
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(serde_json::json!({ "type": "object" })),
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonSchema(_) => "JSON schema",
            GrammarSpec::JsonObject => "JSON object",
            GrammarSpec::Regex(_) => "regex",
            GrammarSpec::Lark(_) => "grammar",
        }
    }
}

/// A model's vocabulary as the grammar engine sees it: every token's bytes (special tokens
/// marked as such), built once per engine.
pub struct Vocabulary {
    factory: ParserFactory,
    cols: usize,
}

impl Vocabulary {
    /// The vocabulary of `tokenizer`, over a model's `vocab_size` output columns (a model may
    /// have more columns than its tokenizer has tokens; those are never allowed).
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Vocabulary> {
        let json: serde_json::Value = serde_json::from_str(&tokenizer.to_json()?).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| Error::Tokenizer(e.to_string()))?;
        if words.len() > vocab_size {
            return Err(Error::Tokenizer(format!("{} tokens for a model of {vocab_size} outputs", words.len())));
        }
        words.resize(vocab_size, Vec::new());
        let eos = tokenizer.eos_ids().first().copied().unwrap_or(0);
        let trie = TokTrie::from(&TokRxInfo::new(vocab_size as u32, eos), &words).with_eos_tokens(tokenizer.eos_ids());
        let env = Arc::new(Env { trie, tokenizer: tokenizer.clone() });
        let mut factory = ParserFactory::new_simple(&(env as llguidance::toktrie::TokEnv)).map_err(|e| Error::Tokenizer(e.to_string()))?;
        factory.quiet();
        Ok(Vocabulary { factory, cols: vocab_size })
    }

    /// Whether the tokenizer holds `name` as a special token.
    pub fn is_special(&self, name: &str) -> bool {
        self.factory.tok_env().tok_trie().get_special_token(name).is_some()
    }

    /// Compile `spec`; an invalid or unsupported one is refused with [`Error::InvalidGrammar`]
    /// before anything runs.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar> {
        let invalid = |e: String| Error::InvalidGrammar(format!("{}: {e}", spec.kind()));
        let parser = self.factory.create_parser(spec.top_level()).map_err(|e| invalid(e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        // A grammar that admits nothing at all fails on its first mask, not midway.
        matcher.compute_mask().map_err(|e| invalid(e.to_string()))?;
        Ok(Grammar { matcher, cols: self.cols })
    }
}

/// A compiled grammar at its start; [`Grammar::start`] gives each generation its own walk.
pub struct Grammar {
    matcher: Matcher,
    cols: usize,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Grammar over {} tokens", self.cols)
    }
}

impl Grammar {
    /// A walk from the start, where `stop` are the tokens that end a generation.
    pub fn start(&self, stop: &[u32]) -> Constraint {
        Constraint::new(self.matcher.deep_clone(), stop, self.cols)
    }
}

/// The grammar engine's tokenizer: our own for canonical tokenizations of forced bytes, the
/// trie's greedy split for bytes that are not UTF-8.
struct Env {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        std::str::from_utf8(s)
            .ok()
            .and_then(|text| self.tokenizer.encode(text).ok())
            .unwrap_or_else(|| self.trie.greedy_tokenize(s))
    }
}
