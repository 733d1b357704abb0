//! The wire format: SGLang's native `/generate` (its `GenerateReqInput` request and the
//! `meta_info` of its answer), the subset a verifier needs. Followed from SGLang's
//! `python/sglang/srt/managers/io_struct.py` at commit 001067ff (main, 2026); not yet run against
//! SGLang itself.
//!
//! Positions: with `logprob_start_len = s`, `meta_info.input_top_logprobs[i]` is the target's
//! distribution over the token at input position `s + i` (computed after the tokens before it);
//! the distribution after the last input token is the first output token's,
//! `output_top_logprobs[0]`. Each entry is `[logprob, token_id, text]`, most likely first.

use crate::grammar::GrammarSpec;
use serde::{Deserialize, Serialize};

/// One `[logprob, token_id, text]` entry; `text` is null unless `return_text_in_logprobs`.
/// SGLang gives `logprob` as null for the first input position, which nothing precedes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob(pub Option<f32>, pub u32, pub Option<String>);

/// The sampling fields of `sampling_params` this protocol uses; SGLang's defaults apply to the
/// rest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WireSampling {
    pub max_new_tokens: usize,
    pub temperature: f32,
    /// -1 (SGLang's spelling) or 0: no top-k filter.
    pub top_k: i64,
    pub top_p: f32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop_token_ids: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampling_seed: Option<u64>,
    /// SGLang's structured output: a JSON schema (as a JSON string), a regex, or a grammar
    /// (llguidance's Lark dialect), at most one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ebnf: Option<String>,
}

impl Default for WireSampling {
    fn default() -> Self {
        WireSampling {
            max_new_tokens: 128,
            temperature: 1.0,
            top_k: -1,
            top_p: 1.0,
            stop_token_ids: Vec::new(),
            sampling_seed: None,
            json_schema: None,
            regex: None,
            ebnf: None,
        }
    }
}

impl WireSampling {
    /// The grammar asked for, if any.
    pub fn grammar(&self) -> Result<Option<GrammarSpec>, String> {
        let given = [&self.json_schema, &self.regex, &self.ebnf].iter().filter(|g| g.is_some()).count();
        if given > 1 {
            return Err("sampling_params: give at most one of json_schema, regex and ebnf".into());
        }
        if let Some(s) = &self.json_schema {
            let schema = serde_json::from_str(s).map_err(|e| format!("sampling_params.json_schema: not JSON: {e}"))?;
            return Ok(Some(GrammarSpec::JsonSchema(schema)));
        }
        Ok(self.regex.clone().map(GrammarSpec::Regex).or_else(|| self.ebnf.clone().map(GrammarSpec::Lark)))
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    pub input_ids: Vec<u32>,
    #[serde(default)]
    pub sampling_params: WireSampling,
    #[serde(default)]
    pub return_logprob: bool,
    /// -1: logprobs of the output tokens only.
    #[serde(default = "only_output")]
    pub logprob_start_len: i64,
    #[serde(default)]
    pub top_logprobs_num: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rid: Option<String>,
    /// Answer as server-sent events, `data: {GenerateResponse}` per token and `data: [DONE]`.
    /// SGLang's events carry all output ids so far, `saguaro serve`'s only the new ones (as SGLang
    /// with `--incremental-streaming-output`); `meta_info.completion_tokens` tells which.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
}

fn only_output() -> i64 {
    -1
}

/// Why generation stopped: SGLang's `{"type": "length", "length": n}` or
/// `{"type": "stop", "matched": token}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FinishReason {
    Length { length: usize },
    Stop { matched: u32 },
    Abort { message: String },
}

/// Empty and absent fields are left out of what the server writes (a streamed answer sends one of
/// these per token) and read as empty.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MetaInfo {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV the server already held (its prefix cache).
    pub cached_tokens: usize,
    /// Seconds from the request's arrival to its answer, on the server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub e2e_latency: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub input_token_logprobs: Vec<TokenLogprob>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub input_top_logprobs: Vec<Option<Vec<TokenLogprob>>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output_token_logprobs: Vec<TokenLogprob>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output_top_logprobs: Vec<Option<Vec<TokenLogprob>>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerateResponse {
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub output_ids: Vec<u32>,
    pub meta_info: MetaInfo,
}

/// `GET /get_model_info`. SGLang answers `model_path` and more; `vocab_size` and
/// `vocab_fingerprint` are what `saguaro serve` adds so a client can check its draft's
/// vocabulary, `context_length` so it knows the room.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelInfo {
    pub model_path: String,
    pub is_generation: bool,
    pub vocab_size: Option<usize>,
    pub vocab_fingerprint: Option<String>,
    pub context_length: Option<usize>,
}

/// The body of every error answer: `{"error": {"message": ..., "code": ...}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    pub code: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_sglang_style_answer() {
        let body = r#"{"text":"","output_ids":[7],"meta_info":{"id":"a","finish_reason":{"type":"length","length":1},
            "prompt_tokens":3,"completion_tokens":1,"cached_tokens":2,"e2e_latency":0.01,
            "input_token_logprobs":[[-0.5,4,null]],"input_top_logprobs":[[[-0.1,5,null],[-2.5,4,null]]],
            "output_token_logprobs":[[-0.2,7,null]],"output_top_logprobs":[[[-0.2,7,null]]]}}"#;
        let r: GenerateResponse = serde_json::from_str(body).unwrap();
        assert_eq!(r.meta_info.input_top_logprobs[0].as_ref().unwrap()[1], TokenLogprob(Some(-2.5), 4, None));
        assert_eq!(r.meta_info.finish_reason, Some(FinishReason::Length { length: 1 }));
    }

    #[test]
    fn a_request_takes_sglang_defaults() {
        let r: GenerateRequest = serde_json::from_str(r#"{"input_ids":[1,2]}"#).unwrap();
        assert_eq!((r.logprob_start_len, r.sampling_params.max_new_tokens, r.return_logprob), (-1, 128, false));
    }
}
