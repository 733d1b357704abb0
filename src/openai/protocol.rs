//! The OpenAI wire format `saguaro serve` speaks on `/v1/completions` and
//! `/v1/chat/completions`: the fields it reads and the ones it writes.

use serde::{Deserialize, Serialize};

use crate::model::tokenizer::ChatMessage;

/// `stop`: one string or several.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// What both endpoints take besides the prompt.
#[derive(Clone, Debug, Deserialize)]
pub struct Params {
    #[serde(default)]
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    /// OpenAI's default is 1 (sampling); 0 is greedy.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    pub n: Option<usize>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    /// `{"include_usage": true}`: a last chunk with the usage.
    pub stream_options: Option<serde_json::Value>,
    /// `{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"schema": ...}}`.
    pub response_format: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: String,
    #[serde(flatten)]
    pub params: Params,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub params: Params,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

/// One choice of an answer or of a streamed chunk: `text` (completions) or `message` / `delta`
/// (chat).
#[derive(Clone, Debug, Serialize)]
pub struct Choice {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<Message>,
    /// `stop` or `length`; `null` in a chunk before the last.
    pub finish_reason: Option<&'static str>,
}

/// An answer, or a streamed chunk of one.
#[derive(Clone, Debug, Serialize)]
pub struct Answer {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<Choice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// OpenAI's error body.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, Serialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub code: u16,
}
