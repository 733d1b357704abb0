//! Reading the JS API's option objects (their fields and checks are in [`crate::contract`]) and
//! prompts.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;

use super::js_error_with;
use crate::contract::{GenerateOpts, Invalid};
use crate::engine::{GenerateOptions, Prompt};
use crate::error::ErrorCode;
use crate::model::config::ModelConfig;
use crate::model::tokenizer::ChatMessage;

fn invalid(msg: String) -> JsValue {
    js_error_with(ErrorCode::InvalidArgument, &msg)
}

impl From<Invalid> for JsValue {
    fn from(e: Invalid) -> JsValue {
        invalid(e.0)
    }
}

/// Read a JS value (`undefined` and `null` mean "all defaults"). It goes through JSON because
/// serde-wasm-bindgen reads a struct's fields by name and never sees the other keys of an
/// object: these structs' `deny_unknown_fields` is the one list of option names, for JS too.
pub fn parse<T: DeserializeOwned + Default>(v: JsValue) -> Result<T, JsValue> {
    parse_named(v, "options")
}

/// [`parse`], its errors starting with `what` (the object's name in the JS API).
pub fn parse_named<T: DeserializeOwned + Default>(v: JsValue, what: &str) -> Result<T, JsValue> {
    if v.is_undefined() || v.is_null() {
        return Ok(T::default());
    }
    let json = js_sys::JSON::stringify(&v)
        .ok()
        .and_then(|s| s.as_string())
        .ok_or_else(|| invalid(format!("{what}: expected a plain object")))?;
    serde_json::from_str(&json).map_err(|e| invalid(format!("{what}: {e}")))
}

#[derive(Deserialize)]
struct Conversation {
    messages: Vec<ChatMessage>,
}

/// A string (wrapped as one user message when `chat`), or `{messages: [{role, content}]}`.
pub fn prompt(v: JsValue, chat: bool) -> Result<Prompt, JsValue> {
    if let Some(text) = v.as_string() {
        return Ok(if chat { Prompt::Chat(vec![ChatMessage::new("user", &text)]) } else { Prompt::Text(text) });
    }
    let c: Conversation = serde_wasm_bindgen::from_value(v)
        .map_err(|e| invalid(format!("prompt: expected a string or {{messages: [{{role, content}}]}} ({e})")))?;
    if c.messages.is_empty() {
        return Err(invalid("prompt: messages is empty".into()));
    }
    Ok(Prompt::Chat(c.messages))
}

/// What a draft worker tells the engine about its model.
#[derive(Default, Serialize, Deserialize)]
pub struct DraftInfo {
    pub config: Option<ModelConfig>,
    pub vocab: String,
    /// Where it computes: "cpu" (the default) or "gpu".
    #[serde(default)]
    pub backend: Option<String>,
    /// Its backend's name, e.g. "gpu (SwiftShader …)".
    #[serde(default)]
    pub device: Option<String>,
}

/// A generate call's prompt and options (`opts` as [`GenerateOpts`] takes them).
pub fn generate_call(prompt_js: JsValue, opts: JsValue) -> Result<(Prompt, GenerateOptions), JsValue> {
    let opts: GenerateOpts = parse(opts)?;
    Ok((prompt(prompt_js, opts.chat)?, opts.generate_options()?))
}
