//! Structured output: a grammar holds every mode's output to it, greedy SD and SSD under a
//! grammar equal greedy AR under it token for token, sampling under it keeps AR's distribution,
//! and a bad grammar is refused before anything is generated.

mod util;

use futures::executor::block_on;

use saguaro::decode::{FinishReason, Mode};
use saguaro::engine::{Completion, Engine, EngineOptions, GenerateOptions, Prompt, ToolUse};
use saguaro::grammar::tools::{Tool, ToolChoice};
use saguaro::grammar::GrammarSpec;
use saguaro::model::tokenizer::ChatMessage;
use saguaro::sampling::SamplingParams;
use saguaro::error::ErrorCode;
use saguaro::Error;

/// SmolLM2 verified by itself cut to two layers: a poor draft, so that proposals are rejected
/// often and the grammar is rolled back often.
fn engine() -> Engine {
    let mut draft = util::model(util::SMOLLM2);
    draft.weights = util::truncated(&draft.weights);
    let opts = EngineOptions { context: 512, draft_quant: None, draft_head: None, ..EngineOptions::default() };
    block_on(Engine::new(util::model(util::SMOLLM2), Some(draft), &opts)).unwrap()
}

fn run(engine: &mut Engine, prompt: &Prompt, mode: Mode, grammar: &GrammarSpec, max_tokens: usize, sampling: SamplingParams) -> saguaro::Result<Completion> {
    let opts = GenerateOptions { mode: Some(mode), max_tokens, sampling, grammar: Some(grammar.clone()), ..GenerateOptions::default() };
    block_on(engine.generate(prompt, &opts, &mut |_, _| true))
}

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::new("user", text)])
}

fn pet_schema() -> GrammarSpec {
    GrammarSpec::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {
            "name": { "type": "string", "maxLength": 12 },
            "age": { "type": "integer", "minimum": 0, "maximum": 30 },
            "kind": { "enum": ["cat", "dog", "hamster"] }
        },
        "required": ["name", "age", "kind"],
        "additionalProperties": false
    }))
}

#[test]
fn greedy_output_under_a_schema_is_the_same_in_every_mode_and_follows_it() {
    let mut e = engine();
    let prompt = chat("Describe a pet as a JSON object with its name, age and kind.");
    let ar = run(&mut e, &prompt, Mode::Ar, &pet_schema(), 64, SamplingParams::default()).unwrap();
    assert_eq!(ar.finish, FinishReason::Eos, "the object closes within 64 tokens: {}", ar.text);
    let v: serde_json::Value = serde_json::from_str(ar.text.trim()).unwrap_or_else(|e| panic!("{e}: {}", ar.text));
    assert!(v["name"].is_string() && v["age"].is_u64() && ["cat", "dog", "hamster"].contains(&v["kind"].as_str().unwrap()), "{v}");
    let g = ar.stats.grammar.as_ref().expect("grammar statistics");
    assert!(g.forced_tokens >= 3, "the keys are forced: {g:?}");
    assert!(ar.stats.rounds + g.forced_tokens < ar.tokens.len() + 1, "forced tokens take no forward of their own");
    for mode in [Mode::Sd, Mode::Ssd] {
        let got = run(&mut e, &prompt, mode, &pet_schema(), 64, SamplingParams::default()).unwrap();
        assert_eq!(got.tokens, ar.tokens, "{mode} under the schema: {} vs AR's {}", got.text, ar.text);
        assert!(got.stats.acceptance_rate.unwrap() < 1.0, "{mode}: the two-layer draft is rejected somewhere");
    }
}

#[test]
fn a_regex_and_a_lark_grammar_hold_every_mode_and_a_cut_object_ends_by_length() {
    let mut e = engine();
    let prompt = chat("What is the phone number of the pizza place?");
    let phone = GrammarSpec::Regex("\\([0-9]{3}\\) [0-9]{3}-[0-9]{4}".into());
    let lark = GrammarSpec::Lark("start: \"The answer is \" ANSWER \".\"\nANSWER: \"yes\" | \"no\" | \"maybe\"\n".into());
    let shape = |s: &str| s.len() == 14 && s.chars().enumerate().all(|(i, c)| match i { 0 => c == '(', 4 => c == ')', 5 => c == ' ', 9 => c == '-', _ => c.is_ascii_digit() });
    for mode in Mode::ALL {
        let sampled = SamplingParams { temperature: 1.0, seed: 3, ..SamplingParams::default() };
        for sampling in [SamplingParams::default(), sampled] {
            let c = run(&mut e, &prompt, mode, &phone, 32, sampling).unwrap();
            assert!(shape(&c.text), "{mode} {sampling:?}: {:?}", c.text);
            let c = run(&mut e, &prompt, mode, &lark, 32, sampling).unwrap();
            assert!(["The answer is yes.", "The answer is no.", "The answer is maybe."].contains(&c.text.as_str()), "{mode}: {:?}", c.text);
        }
        let cut = run(&mut e, &chat("A pet as JSON."), mode, &pet_schema(), 5, SamplingParams::default()).unwrap();
        assert_eq!((cut.finish, cut.tokens.len()), (FinishReason::MaxTokens, 5), "{mode}: {}", cut.text);
        assert!(cut.text.starts_with('{'), "{mode}: a valid prefix {:?}", cut.text);
    }
}

#[test]
fn a_bad_grammar_is_refused_before_generating_and_the_engine_goes_on() {
    let mut e = engine();
    let prompt = Prompt::Text("Hello".into());
    let bad = [
        GrammarSpec::JsonSchema(serde_json::json!({ "type": "nonsense" })),
        GrammarSpec::Regex("(unclosed".into()),
        GrammarSpec::Lark("start: missing_rule\n".into()),
    ];
    for g in &bad {
        let err = run(&mut e, &prompt, Mode::Ar, g, 8, SamplingParams::default()).unwrap_err();
        assert!(matches!(err, Error::InvalidGrammar(_)), "{g:?}: {err}");
        assert_eq!(err.code(), ErrorCode::InvalidGrammar);
    }
    let ok = run(&mut e, &prompt, Mode::Sd, &GrammarSpec::JsonObject, 8, SamplingParams::default()).unwrap();
    assert!(ok.text.starts_with('{'), "{}", ok.text);
}

/// Sampling under a grammar keeps the constrained target's distribution: SD's and SSD's
/// colours against AR's, a two-sample chi-square test over 5 outcomes.
#[test]
fn sampling_under_a_grammar_keeps_ars_distribution() {
    let mut e = engine();
    let prompt = Prompt::Text("My favourite colour is".into());
    let colours = ["red", "blue", "green", "black", "white"];
    let g = GrammarSpec::Regex(format!(" ({})", colours.join("|")));
    const N: u64 = 300;
    let counts = |e: &mut Engine, mode: Mode| {
        let mut c = [0u64; 5];
        for seed in 0..N {
            let s = SamplingParams { temperature: 1.0, seed, ..SamplingParams::default() };
            let out = run(e, &prompt, mode, &g, 8, s).unwrap();
            // The colour, then the end of the grammar or a stop token.
            let at = colours.iter().position(|w| out.text.starts_with(&format!(" {w}"))).unwrap_or_else(|| panic!("{mode}: {:?}", out.text));
            c[at] += 1;
        }
        c
    };
    let ar = counts(&mut e, Mode::Ar);
    assert!(ar.iter().filter(|&&n| n > 0).count() >= 2, "the colours vary: {ar:?}");
    for mode in [Mode::Sd, Mode::Ssd] {
        let got = counts(&mut e, mode);
        // Two samples of equal size: sum over outcomes of (a - b)^2 / (a + b) is chi-square
        // with (outcomes - 1) degrees of freedom; 18.47 is its 0.999 quantile at 4.
        let chi: f64 = ar.iter().zip(&got).filter(|(a, b)| *a + *b > 0).map(|(&a, &b)| (a as f64 - b as f64).powi(2) / (a + b) as f64).sum();
        assert!(chi < 18.47, "{mode}: {got:?} against AR's {ar:?} (chi-square {chi:.1})");
    }
}

/// Tools in Qwen2.5's format: the template lists them, a required call names a tool and its
/// arguments follow that tool's schema, in AR and SD alike; a chat without tools in its template,
/// or tools with a grammar, are refused.
#[test]
fn a_required_tool_call_follows_its_schema_in_every_mode() {
    let qwen = || util::model(util::QWEN_05B);
    let mut draft = qwen();
    draft.weights = util::truncated(&draft.weights);
    let opts = EngineOptions { context: 1024, modes: vec![Mode::Ar, Mode::Sd], draft_quant: None, draft_head: None, ..EngineOptions::default() };
    let mut e = block_on(Engine::new(qwen(), Some(draft), &opts)).unwrap();
    let tools: Vec<Tool> = serde_json::from_value(serde_json::json!([
        { "type": "function", "function": { "name": "weather", "description": "The weather in a city",
          "parameters": { "type": "object", "properties": { "city": { "type": "string", "maxLength": 20 } }, "required": ["city"], "additionalProperties": false } } },
        { "type": "function", "function": { "name": "time", "description": "The time in a time zone",
          "parameters": { "type": "object", "properties": { "zone": { "type": "string", "maxLength": 20 } }, "required": ["zone"], "additionalProperties": false } } }
    ]))
    .unwrap();
    let prompt = chat("What is the weather like in Oslo?");
    let call = |e: &mut Engine, mode: Mode, choice: ToolChoice| {
        let opts = GenerateOptions { mode: Some(mode), max_tokens: 48, tools: Some(ToolUse { tools: tools.clone(), choice }), ..GenerateOptions::default() };
        block_on(e.generate(&prompt, &opts, &mut |_, _| true))
    };
    let ar = call(&mut e, Mode::Ar, ToolChoice::Required).unwrap();
    assert_eq!(ar.tool_calls.len(), 1, "{}", ar.text);
    assert_eq!(ar.tool_calls[0].name, "weather", "{}", ar.text);
    let args: serde_json::Value = serde_json::from_str(&ar.tool_calls[0].arguments).unwrap();
    assert!(args["city"].is_string(), "{}", ar.text);
    let sd = call(&mut e, Mode::Sd, ToolChoice::Required).unwrap();
    assert_eq!(sd.tokens, ar.tokens, "SD: {}", sd.text);
    let named = call(&mut e, Mode::Ar, ToolChoice::Named("time".into())).unwrap();
    assert_eq!(named.tool_calls.first().map(|c| c.name.as_str()), Some("time"), "{}", named.text);
    let with_grammar = GenerateOptions {
        tools: Some(ToolUse { tools: tools.clone(), choice: ToolChoice::Auto }),
        grammar: Some(GrammarSpec::JsonObject),
        ..GenerateOptions::default()
    };
    assert!(block_on(e.generate(&prompt, &with_grammar, &mut |_, _| true)).is_err());
    let mut smol = engine();
    let on_smol = GenerateOptions { tools: Some(ToolUse { tools, choice: ToolChoice::Auto }), ..GenerateOptions::default() };
    let err = block_on(smol.generate(&prompt, &on_smol, &mut |_, _| true)).unwrap_err();
    assert!(err.to_string().contains("does not list tools"), "{err}");
}
