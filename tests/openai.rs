//! `saguaro serve`'s OpenAI endpoints: several clients in one batch get what each gets alone,
//! streamed or whole, with `n`, `stop` and usage; a full queue answers 503, a bad request 400
//! beside good ones, and a client that hangs up frees its sequence.

mod util;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};

use util::serve::Serve;

/// POST `body` to `path`: (status, JSON answer).
fn post(url: &str, path: &str, body: &Value) -> (u16, Value) {
    let agent = ureq::Agent::new_with_config(ureq::Agent::config_builder().http_status_as_error(false).build());
    let mut resp = agent.post(format!("{url}{path}")).header("Content-Type", "application/json").send(body.to_string().as_bytes()).expect("the server answers");
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().expect("a body");
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
}

fn completion(prompt: &str, max_tokens: usize) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

const PROMPTS: [&str; 4] = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "1, 2, 3, 4,"];

/// The events of a streamed answer, `[DONE]` excluded.
fn events(url: &str, path: &str, body: &Value) -> Vec<Value> {
    let mut s = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    let body = body.to_string();
    write!(s, "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    assert!(all.starts_with("HTTP/1.1 200"), "{all}");
    assert!(all.contains("data: [DONE]"), "{all}");
    all.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn clients_in_one_batch_get_what_each_gets_alone() {
    let server = Serve::start(&["--parallel", "3"]);
    let url = &server.url;
    let alone: Vec<Value> = PROMPTS.iter().map(|p| post(url, "/v1/completions", &completion(p, 24)).1).collect();
    for a in &alone {
        assert_eq!(a["choices"][0]["finish_reason"], "length", "{a}");
        assert_eq!(a["usage"]["completion_tokens"], 24, "{a}");
    }
    // Four at once on three sequences: one waits for a sequence to free up.
    let together: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = PROMPTS.iter().map(|p| s.spawn(move || post(url, "/v1/completions", &completion(p, 24)))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).map(|(status, v)| {
            assert_eq!(status, 200, "{v}");
            v
        }).collect()
    });
    for (a, t) in alone.iter().zip(&together) {
        assert_eq!(a["choices"][0]["text"], t["choices"][0]["text"]);
        assert_eq!(a["usage"], t["usage"]);
    }
    // Streamed, the pieces make the same text; the usage comes last where asked for.
    let mut body = completion(PROMPTS[1], 24);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = events(url, "/v1/completions", &body);
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, alone[1]["choices"][0]["text"].as_str().unwrap());
    assert_eq!(chunks.last().unwrap()["usage"], alone[1]["usage"]);
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], "length");

    // A stop string cuts the text before it and ends that choice with `stop`.
    let full = alone[3]["choices"][0]["text"].as_str().unwrap();
    let cut = &full[..full.len() / 2];
    let stop = &full[cut.len()..cut.len() + 3];
    let mut body = completion(PROMPTS[3], 24);
    body["stop"] = json!([stop]);
    let (_, v) = post(url, "/v1/completions", &body);
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), &full[..full.find(stop).unwrap()]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // response_format holds the output to a schema, here beside another request.
    let schema = json!({"type": "object", "properties": {"color": {"enum": ["red", "green"]}}, "required": ["color"], "additionalProperties": false});
    let held = json!({"messages": [{"role": "user", "content": "Pick a color."}], "max_tokens": 30, "temperature": 0,
                      "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}});
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| post(url, "/v1/chat/completions", &held));
        let b = s.spawn(|| post(url, "/v1/completions", &completion(PROMPTS[0], 24)));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a.0, 200, "{}", a.1);
    let object: Value = serde_json::from_str(a.1["choices"][0]["message"]["content"].as_str().unwrap()).expect("a JSON answer");
    assert!(object["color"] == "red" || object["color"] == "green", "{object}");
    assert_eq!(b.1["choices"][0]["text"], alone[0]["choices"][0]["text"]);

    // Chat, n samples seeded: two choices, the same for the same seed.
    let chat = json!({"messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 12, "n": 2, "seed": 3, "temperature": 0.9});
    let (status, a) = post(url, "/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["object"], "chat.completion");
    assert_eq!(a["choices"].as_array().unwrap().len(), 2);
    assert_eq!(a["choices"][1]["message"]["role"], "assistant");
    assert_eq!(post(url, "/v1/chat/completions", &chat).1["choices"], a["choices"], "a seed gives the same samples");
}

#[test]
fn bad_requests_full_queues_and_clients_that_leave_fail_alone() {
    // A request that waits past 6 s fails: a sequence left running after its client hung up
    // would hold the one sequence for longer than that.
    let server = Serve::start(&["--parallel", "1", "--queue", "1", "--timeout", "6"]);
    let url = &server.url;
    let long = "word ".repeat(5000);
    let bad = [
        (json!({"prompt": "x", "temperature": -1}), "temperature"),
        (json!({"prompt": "x", "n": 2}), "n must be"),
        (json!({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"prompt": "x", "response_format": {"type": "yaml"}}), "response_format"),
        (json!({"prompt": long, "max_tokens": 4}), "context"),
        (json!({"messages": "hi"}), "malformed"),
    ];
    for (body, says) in &bad {
        let path = if body.get("messages").is_some() { "/v1/chat/completions" } else { "/v1/completions" };
        let (status, v) = post(url, path, body);
        assert_eq!(status, 400, "{body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(says), "{body}: {v}");
    }
    // One running, one waiting for its sequence, one queued: the rest are turned away.
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|i| {
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(50 * i));
                    post(url, "/v1/completions", &completion(PROMPTS[0], 40))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let busy = answers.iter().filter(|(s, _)| *s == 503).count();
    assert!(busy >= 1, "{answers:?}");
    assert!(answers.iter().filter(|(s, _)| *s == 200).count() >= 2, "{answers:?}");
    for (status, v) in &answers {
        if *status == 503 {
            assert!(v["error"]["message"].as_str().unwrap().contains("busy"), "{v}");
        }
    }
    // A client that hangs up mid-stream frees the one sequence for the next request, long
    // before the 3,000 tokens it asked for.
    let mut body = completion(PROMPTS[3], 3000);
    body["stream"] = json!(true);
    let body = body.to_string();
    let mut s = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    write!(s, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut line = String::new();
    let mut r = BufReader::new(s);
    while !line.starts_with("data: ") {
        line.clear();
        r.read_line(&mut line).unwrap();
    }
    drop(r);
    let (status, v) = post(url, "/v1/completions", &completion(PROMPTS[1], 8));
    assert_eq!(status, 200, "{v}");
}
