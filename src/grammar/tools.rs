//! Tool calls as OpenAI's API describes them, in the format of models whose chat template lists
//! tools and asks for each call as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
//! (Qwen2.5, Hermes). The output is held to a grammar that admits only calls of the given tools,
//! each call's arguments to its schema; a choice of `auto` admits plain text too.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::GrammarSpec;
use crate::error::{Error, Result};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// A function the model may call: OpenAI's `{type: 'function', function: {name, description,
/// parameters}}`, as the chat template takes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Function,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS), ts(optional_fields))]
pub struct Function {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The arguments' JSON schema (default: any object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(type = "Record<string, unknown>"))]
    pub parameters: Option<Value>,
}

/// Whether the model must call a tool: OpenAI's `tool_choice`.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ToolChoice {
    /// A call or plain text, as the model likes.
    #[default]
    Auto,
    /// At least one call.
    Required,
    /// A call of this function.
    Named(String),
    /// No call: the tools are listed, the output is free text.
    None,
}

impl ToolChoice {
    /// OpenAI's `tool_choice`: `"auto"`, `"required"`, `"none"` or `{type: "function",
    /// function: {name}}`.
    pub fn from_openai(v: &Value) -> Result<ToolChoice> {
        match (v.as_str(), v["function"]["name"].as_str()) {
            (Some("auto"), _) => Ok(ToolChoice::Auto),
            (Some("required"), _) => Ok(ToolChoice::Required),
            (Some("none"), _) => Ok(ToolChoice::None),
            (None, Some(name)) if v["type"] == "function" => Ok(ToolChoice::Named(name.into())),
            _ => Err(Error::option("tool_choice", format!("must be \"auto\", \"required\", \"none\" or {{type: \"function\", function: {{name}}}}, got {v}"))),
        }
    }
}

/// A call the model made.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text, as OpenAI's API gives them (and so untouched by the JS API's
    /// renaming of result keys).
    pub arguments: String,
}

/// The grammar for calling `tools` as `choice` says (none for [`ToolChoice::None`]); `special`
/// says whether the tokenizer holds the call's tags as special tokens (then the grammar names
/// them as such, else it spells them).
pub fn grammar(tools: &[Tool], choice: &ToolChoice, special: bool) -> Result<Option<GrammarSpec>> {
    if tools.is_empty() {
        return Err(Error::option("tools", "is empty: give at least one function, or leave tools out"));
    }
    if let Some(t) = tools.iter().find(|t| t.kind != "function") {
        return Err(Error::InvalidArgument(format!("tools: type {:?} is not supported (only \"function\")", t.kind)));
    }
    let callable: Vec<&Tool> = match choice {
        ToolChoice::None => return Ok(None),
        ToolChoice::Named(name) => {
            let t = tools.iter().filter(|t| &t.function.name == name).collect::<Vec<_>>();
            if t.is_empty() {
                return Err(Error::InvalidArgument(format!("tool_choice names {name:?}, which is not among the tools")));
            }
            t
        }
        _ => tools.iter().collect(),
    };
    let calls: Vec<Value> = callable
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {
                    "name": { "const": t.function.name },
                    "arguments": t.function.parameters.clone().unwrap_or_else(|| json!({ "type": "object" })),
                },
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = json!({ "anyOf": calls });
    let tag = |t: &str| if special { t.to_string() } else { format!("{t:?}") };
    let mut lark = format!(
        "calls: call (\"\\n\" call)*\ncall: {} \"\\n\" args \"\\n\" {}\nargs: %json {schema}\n",
        tag(OPEN),
        tag(CLOSE)
    );
    lark = match choice {
        // Plain text never begins with the tag's first character.
        ToolChoice::Auto => format!("start: calls | TEXT\nTEXT: /[^<](.|\\n)*/\n{lark}"),
        _ => format!("start: calls\n{lark}"),
    };
    Ok(Some(GrammarSpec::Lark(lark)))
}

/// The calls in an output written as [`grammar`] admits; none for plain text.
pub fn parse(text: &str) -> Result<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = text.trim_start();
    while let Some(body) = rest.strip_prefix(OPEN) {
        let end = body.find(CLOSE).ok_or_else(|| Error::InvalidGrammar(format!("a tool call without its {CLOSE}")))?;
        let call: Value = serde_json::from_str(body[..end].trim()).map_err(|e| Error::InvalidGrammar(format!("a tool call that is not JSON: {e}")))?;
        let name = call["name"].as_str().ok_or_else(|| Error::InvalidGrammar("a tool call without a name".into()))?;
        calls.push(ToolCall { name: name.to_string(), arguments: call["arguments"].to_string() });
        rest = body[end + CLOSE.len()..].trim_start();
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tool {
        serde_json::from_value(json!({
            "type": "function",
            "function": { "name": "weather", "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] } }
        }))
        .unwrap()
    }

    #[test]
    fn calls_are_parsed_and_bad_choices_refused() {
        let text = "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
        let calls = parse(text).unwrap();
        assert_eq!(calls.len(), 2);
        let args: Value = serde_json::from_str(&calls[1].arguments).unwrap();
        assert_eq!((calls[1].name.as_str(), &args["city"]), ("weather", &json!("Rome")));
        assert!(parse("It is sunny.").unwrap().is_empty());
        assert!(grammar(&[weather()], &ToolChoice::Named("time".into()), true).is_err());
        assert!(grammar(&[], &ToolChoice::Auto, true).is_err());
        let Some(GrammarSpec::Lark(g)) = grammar(&[weather()], &ToolChoice::Required, false).unwrap() else { panic!() };
        assert_eq!(grammar(&[weather()], &ToolChoice::None, false).unwrap(), None);
        assert_eq!(ToolChoice::from_openai(&json!({"type": "function", "function": {"name": "weather"}})).unwrap(), ToolChoice::Named("weather".into()));
        assert!(ToolChoice::from_openai(&json!("sometimes")).is_err());
        assert!(g.starts_with("start: calls\n") && g.contains("\"<tool_call>\""), "{g}");
    }
}
