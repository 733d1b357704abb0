//! The npm package's generated files: pkg-config/contract.generated.d.ts (the TypeScript types of
//! the options, results, info, defaults, limits and error codes, which index.d.ts re-exports) and
//! pkg-config/contract.generated.js (`DEFAULTS` and `LIMITS` as plain constants, which the page's
//! main thread reads before any wasm loads). The tests here fail when either differs from what
//! the Rust types say now, or when the TypeScript says other keys than serde reads and writes;
//! [`REGENERATE`] rewrites both files.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;
use ts_rs::{Config, TS};

use super::{camel, defaults, limits, Backend, Defaults, EngineInfo, GenerateOpts, Limits, LoadOpts, ServerTarget};
use crate::backend::KvCache;
use crate::decode::{Backup, Choice, Costs, FinishReason, Mode, Observed, RemoteStats, RoundTimes, Stats};
use crate::engine::Completion;
use crate::grammar::tools::{Function, Tool, ToolCall};
use crate::grammar::GrammarStats;
use crate::error::ErrorCode;

const REGENERATE: &str = "scripts/gen-contract.sh";
const DTS: &str = "pkg-config/contract.generated.d.ts";
const JS: &str = "pkg-config/contract.generated.js";

fn config() -> Config {
    // JS numbers: every integer the engine reports (bytes, a seed) is below 2^53.
    Config::new().with_large_int("number")
}

/// A declaration as it goes in the file, and the names of the types it refers to.
struct Decl {
    name: String,
    text: String,
    refers_to: Vec<String>,
}

fn decl<T: TS + 'static>(cfg: &Config) -> Decl {
    Decl {
        name: T::ident(cfg),
        text: format!("{}export {}\n", T::docs().unwrap_or_default(), T::decl(cfg)),
        refers_to: T::dependencies(cfg).into_iter().map(|d| d.ts_name).collect(),
    }
}

/// Every type of the JS API that Rust knows, in the file's order.
fn declarations() -> Vec<Decl> {
    let cfg = config();
    vec![
        decl::<ErrorCode>(&cfg),
        decl::<Mode>(&cfg),
        decl::<Backend>(&cfg),
        decl::<Backup>(&cfg),
        decl::<KvCache>(&cfg),
        decl::<LoadOpts>(&cfg),
        decl::<ServerTarget>(&cfg),
        decl::<GenerateOpts>(&cfg),
        decl::<EngineInfo>(&cfg),
        decl::<Completion>(&cfg),
        decl::<FinishReason>(&cfg),
        decl::<Stats>(&cfg),
        decl::<RoundTimes>(&cfg),
        decl::<Choice>(&cfg),
        decl::<Costs>(&cfg),
        decl::<Observed>(&cfg),
        decl::<RemoteStats>(&cfg),
        decl::<GrammarStats>(&cfg),
        decl::<Tool>(&cfg),
        decl::<Function>(&cfg),
        decl::<ToolCall>(&cfg),
        decl::<Defaults>(&cfg),
        decl::<Limits>(&cfg),
    ]
}

fn header(comment: &str) -> String {
    format!("{comment} Generated from the Rust types (src/contract) by `{REGENERATE}`: do not edit.\n\n")
}

fn dts() -> String {
    let mut out = header("//");
    for d in declarations() {
        out.push_str(&d.text);
        out.push('\n');
    }
    out.push_str("/** What an option left out means. */\nexport declare const DEFAULTS: Readonly<Defaults>;\n\n");
    out.push_str("/** The bounds of what the package takes. */\nexport declare const LIMITS: Readonly<Limits>;\n");
    out
}

fn js() -> String {
    format!("{}export const DEFAULTS = Object.freeze({});\n\nexport const LIMITS = Object.freeze({});\n", header("//"), pretty(&defaults()), pretty(&limits()))
}

fn pretty(v: &impl Serialize) -> String {
    serde_json::to_string_pretty(v).expect("plain data serializes")
}

#[test]
fn generated_files_match_the_rust_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (file, now) in [(DTS, dts()), (JS, js())] {
        let path = root.join(file);
        if std::env::var_os("SAGUARO_BLESS").is_some() {
            std::fs::write(&path, &now).unwrap_or_else(|e| panic!("cannot write {file}: {e}"));
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != now {
            let line = committed.lines().zip(now.lines()).position(|(a, b)| a != b).unwrap_or(committed.lines().count().min(now.lines().count()));
            panic!(
                "{file} is not what the Rust types say (first difference at line {}): rewrite it with `{REGENERATE}` and commit it",
                line + 1
            );
        }
    }
}

#[test]
fn every_type_a_declaration_refers_to_is_declared() {
    let decls = declarations();
    let names: BTreeSet<&str> = decls.iter().map(|d| d.name.as_str()).collect();
    for d in &decls {
        for r in &d.refers_to {
            assert!(names.contains(r.as_str()), "{} refers to {r}, which the generated file does not declare: add it to `declarations`", d.name);
        }
    }
}

/// The members of a string union, e.g. `"ar" | "sd"`.
fn union<T: TS>() -> Vec<String> {
    T::inline(&config()).split('|').map(|m| m.trim().trim_matches('"').to_string()).collect()
}

/// Each name the TypeScript offers is one the Rust side reads, each for another variant (ts-rs
/// writes one member per variant, so this is every variant).
fn parses_to_distinct<T: TS + std::str::FromStr + PartialEq + std::fmt::Debug>() {
    let members = union::<T>();
    let parsed: Vec<T> = members.iter().map(|m| m.parse().unwrap_or_else(|_| panic!("{} offers '{m}', which Rust does not read", T::ident(&config())))).collect();
    for (i, a) in parsed.iter().enumerate() {
        assert!(!parsed[..i].contains(a), "{}: two names for {a:?}", T::ident(&config()));
    }
}

#[test]
fn union_members_are_the_names_rust_reads() {
    parses_to_distinct::<Mode>();
    parses_to_distinct::<Backend>();
    parses_to_distinct::<Backup>();
    parses_to_distinct::<KvCache>();
    for m in union::<Mode>() {
        assert_eq!(m.parse::<Mode>().unwrap().to_string(), m, "Mode's TypeScript names are its Display names");
    }
    for code in union::<ErrorCode>() {
        let parsed: ErrorCode = serde_json::from_value(Value::String(code.clone())).unwrap_or_else(|e| panic!("error code '{code}': {e}"));
        assert_eq!(parsed.to_string(), code);
    }
    assert_eq!(ErrorCode::NoWebGpu.to_string(), "no_webgpu");
}

/// The keys of an object type as ts-rs writes it inline (`{ key: T, other?: U, }`), each with
/// whether it is optional.
fn ts_fields<T: TS>() -> Vec<(String, bool)> {
    let inline = T::inline(&config());
    // Doc comments can hold any character: drop them first.
    let mut text = String::new();
    let mut rest = inline.as_str();
    while let Some(start) = rest.find("/**") {
        text.push_str(&rest[..start]);
        rest = &rest[start + rest[start..].find("*/").expect("a closed doc comment") + 2..];
    }
    text.push_str(rest);
    let body = text.trim().strip_prefix('{').and_then(|t| t.strip_suffix('}')).unwrap_or_else(|| panic!("not an object type: {text}"));
    let mut fields = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    let mut push = |part: &str| {
        let part = part.trim();
        if let Some((key, _)) = part.split_once(':') {
            let key = key.trim();
            let optional = key.ends_with('?');
            fields.push((key.trim_end_matches('?').trim_matches('"').to_string(), optional));
        }
    };
    for (i, c) in body.char_indices() {
        match c {
            '{' | '[' | '<' | '(' => depth += 1,
            '}' | ']' | '>' | ')' => depth -= 1,
            ',' if depth == 0 => {
                push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    push(&body[start..]);
    fields
}

fn names(fields: &[(String, bool)], only_required: bool) -> BTreeSet<String> {
    fields.iter().filter(|(_, optional)| !only_required || !optional).map(|(k, _)| k.clone()).collect()
}

/// The field names serde reads for an option struct: those its `deny_unknown_fields` error lists.
fn serde_fields<T: serde::de::DeserializeOwned>() -> BTreeSet<String> {
    let err = match serde_json::from_str::<T>(r#"{"\u0000": 0}"#) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("an unknown key was accepted"),
    };
    let list = err.split("expected one of ").nth(1).or_else(|| err.split("expected ").nth(1)).unwrap_or_else(|| panic!("{err}"));
    list.split(" at line").next().unwrap().split(", ").map(|f| f.trim_matches('`').to_string()).collect()
}

#[test]
fn option_types_name_the_keys_serde_reads() {
    fn check<T: TS + serde::de::DeserializeOwned>(required: &[&str]) {
        let fields = ts_fields::<T>();
        let name = T::ident(&config());
        assert_eq!(names(&fields, false), serde_fields::<T>(), "{name}: the TypeScript keys are not serde's");
        let want: BTreeSet<String> = required.iter().map(|s| s.to_string()).collect();
        assert_eq!(names(&fields, true), want, "{name}: the keys JS must give");
    }
    check::<LoadOpts>(&[]);
    check::<GenerateOpts>(&[]);
    check::<ServerTarget>(&["server"]);
}

/// The keys of a JSON object, as JS receives it.
fn js_keys(v: &impl Serialize) -> BTreeSet<String> {
    match camel(serde_json::to_value(v).unwrap()) {
        Value::Object(map) => map.keys().cloned().collect(),
        other => panic!("not an object: {other}"),
    }
}

/// `full` (every optional field set) has all the keys the TypeScript names, `sparse` (none set)
/// exactly the required ones.
fn check_result<T: TS + Serialize>(full: &T, sparse: &T) {
    let fields = ts_fields::<T>();
    let name = T::ident(&config());
    assert_eq!(names(&fields, false), js_keys(full), "{name}: the TypeScript keys are not those JS receives (with every optional field set)");
    assert_eq!(names(&fields, true), js_keys(sparse), "{name}: the required TypeScript keys are not those JS always receives");
}

#[test]
fn result_types_name_the_keys_js_receives() {
    let costs = Costs { decode_ms: 1.0, verify_ms: vec![(1, 1.0)], draft_step_ms: 0.5, tree_step: Some((4, 0.6)), observed: vec![Observed { mode: "sd".into(), k: 4, round_ms: 2.0 }], parallel: true };
    let choice = Choice { mode: "sd".into(), k: 4, expected_speedup: 1.5, acceptance: 0.8, costs: costs.clone() };
    let round = RoundTimes { verify: [0.0, 1.0], draft: Some([0.0, 0.5]), proposed: 4, accepted: 3, hit: Some(true) };
    let full = Stats {
        acceptance_rate: Some(0.8),
        mean_accepted: Some(3.0),
        cache_hit_rate: Some(0.9),
        multi_token_hits: Some(2),
        draft_busy_ms: Some(1.0),
        overlap_ms: Some(1.0),
        verify_ms_mean: Some(1.0),
        tree_step_ms_mean: Some(1.0),
        glue_ms_mean: Some(1.0),
        timeline: Some(vec![round.clone()]),
        auto: Some(choice.clone()),
        remote: Some(RemoteStats::default()),
        grammar: Some(GrammarStats::default()),
        ..Stats::default()
    };
    check_result(&full, &Stats::default());
    check_result(&round, &RoundTimes { draft: None, hit: None, ..round.clone() });
    check_result(&choice, &choice);
    check_result(&costs, &Costs { tree_step: None, ..costs.clone() });
    check_result(&costs.observed[0], &costs.observed[0]);
    check_result(&RemoteStats::default(), &RemoteStats::default());
    let call = ToolCall { name: "f".into(), arguments: "{}".into() };
    let completion = Completion { text: "x".into(), tokens: vec![1], prompt_tokens: 1, finish: FinishReason::Eos, stats: full, tool_calls: vec![call] };
    check_result(&completion, &Completion { tool_calls: vec![], ..completion.clone() });
    check_result(&GrammarStats::default(), &GrammarStats::default());
    let info = |draft_device| EngineInfo {
        target_backend: "cpu".into(),
        draft_device,
        threads: 1,
        has_draft: false,
        default_mode: "ar".into(),
        vocab_size: 2,
        context_length: 8,
        stop_texts: vec![],
        wasm_memory_bytes: 0.0,
        parallel: 1,
    };
    check_result(&info(Some("cpu".into())), &info(None));
    check_result(&defaults(), &defaults());
    check_result(&limits(), &limits());
}
