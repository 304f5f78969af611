//! Every recorded Gemini exchange under `tests/data/providers/gemini/`, run through the gemini
//! codec and checked for content: text, tool calls, stop reason, usage, the opaque data kept, and
//! for error bodies the classified error.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use colony::providers::{Codec, Endpoint, ToolsLevel, codec, errors, sse};
use colony::vocab::{
    InferRequest, Inferred, Message, Opaque, Part, Role, Stop, Style, ToolCall, ToolResult, Usage,
};
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

/// Every file of the folder, each checked by the test of the same name below.
const COVERED: &[&str] = &[
    "genai__gemini__thinking_stream__response_000.txt",
    "genai__gemini__tool_stream__response_000.txt",
    "vercel__google-429-retry-info.json",
    "vercel__google-reasoning.chunks.txt",
    "vercel__google-stream-no-args-tool-call.chunks.txt",
    "vercel__google-stream-tool-call-arguments.chunks.txt",
    "vercel__google-text.chunks.txt",
    "vercel__google-tool-call.chunks.txt",
    "vercel__google-tool-call.json",
    "vercel__issue-16298-gemini3-parallel-tool-calls.json",
    "vercel__issue-8943-gemini-2.5-flash-error.json",
];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/providers/gemini")
}

fn gemini() -> &'static dyn Codec {
    codec(Style::Gemini).expect("gemini has a codec")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The JSON payloads of a fixture: one per line for `*.chunks.txt`, one per `data:` line for raw
/// SSE. Used to read what the server sent (signatures) independently of the codec.
fn payloads(name: &str) -> Vec<Value> {
    read(name)
        .lines()
        .map(|line| line.strip_prefix("data: ").unwrap_or(line))
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect()
}

/// Every `thoughtSignature` the server sent, in order.
fn sent_signatures(name: &str) -> Vec<String> {
    let mut found = Vec::new();
    for payload in payloads(name) {
        for part in payload["candidates"][0]["content"]["parts"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(sig) = part["thoughtSignature"].as_str() {
                found.push(sig.to_string());
            }
        }
    }
    found
}

/// A `*.chunks.txt` file (one data payload per line) wrapped into SSE the way Gemini frames it.
fn stream_chunks(name: &str) -> (Inferred, Vec<String>) {
    let sse: String = read(name)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| format!("data: {line}\r\n\r\n"))
        .collect();
    assemble(name, sse.as_bytes())
}

/// A raw SSE capture, fed as it is.
fn stream_raw(name: &str) -> (Inferred, Vec<String>) {
    assemble(name, read(name).as_bytes())
}

fn assemble(name: &str, bytes: &[u8]) -> (Inferred, Vec<String>) {
    let (result, deltas) = sse::assemble_bytes(bytes, gemini().assembler());
    let inferred = result.unwrap_or_else(|e| panic!("{name}: {e}"));
    // Deltas arrive in order and add up to the final visible text.
    assert_eq!(deltas.concat(), inferred.text(), "{name}: deltas vs text");
    assert!(deltas.iter().all(|d| !d.is_empty()), "{name}: empty delta");
    (inferred, deltas)
}

fn opaque_data(opaque: &Option<Opaque>) -> &Value {
    let opaque = opaque.as_ref().expect("opaque data kept");
    assert_eq!(opaque.style, Style::Gemini);
    &opaque.data
}

fn signature(opaque: &Option<Opaque>) -> Option<&str> {
    opaque_data(opaque)["thoughtSignature"].as_str()
}

fn synthetic(call: &ToolCall) -> bool {
    opaque_data(&call.opaque)["syntheticId"] == json!(true)
}

fn args(call: &ToolCall) -> Value {
    call.decoded().expect("arguments are JSON")
}

fn usage(input: u64, output: u64, reasoning: u64) -> Usage {
    Usage {
        input,
        output,
        cache_read: 0,
        cache_write: 0,
        reasoning,
    }
}

fn reasoning(inferred: &Inferred) -> Vec<(&str, &Value)> {
    inferred
        .message
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::Reasoning { text, opaque } => Some((text.as_str(), opaque_data(opaque))),
            _ => None,
        })
        .collect()
}

fn endpoint() -> Endpoint {
    Endpoint {
        reads: Default::default(),
        provider: "gemini".into(),
        style: Style::Gemini,
        base_url: "https://generativelanguage.googleapis.com/v1beta".into(),
        key: Some("test-key".into()),
        tools_level: ToolsLevel::Native,
        timeout: Duration::from_secs(10),
        max_response_bytes: colony::providers::body::DEFAULT_MAX_RESPONSE_BYTES,
        max_concurrent_calls: colony::providers::DEFAULT_MAX_CONCURRENT_CALLS,
    }
}

/// The next request after `answer`, with a result for each of its calls: what goes back.
fn next_request(model: &str, answer: &Inferred) -> Value {
    let results = answer
        .tool_calls()
        .into_iter()
        .map(|c| {
            Part::ToolResult(ToolResult {
                call_id: c.id,
                name: c.name,
                content: r#"{"ok":true}"#.into(),
                is_error: false,
            })
        })
        .collect();
    let req = InferRequest {
        model: model.into(),
        messages: vec![
            Message::user("question"),
            answer.message.clone(),
            Message::new(Role::Tool, results),
        ],
        ..Default::default()
    };
    gemini().request(&req, &endpoint(), true).json()
}

#[test]
fn every_fixture_is_covered() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(dir())
        .expect("the fixture folder")
        .map(|e| {
            e.expect("a folder entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let covered: BTreeSet<String> = COVERED.iter().map(|s| s.to_string()).collect();
    let missing: Vec<_> = on_disk.difference(&covered).collect();
    assert!(missing.is_empty(), "fixtures without a test: {missing:?}");
    let gone: Vec<_> = covered.difference(&on_disk).collect();
    assert!(gone.is_empty(), "tests for missing fixtures: {gone:?}");
}

#[test]
fn genai_thinking_stream() {
    let name = "genai__gemini__thinking_stream__response_000.txt";
    let (inferred, deltas) = stream_raw(name);
    assert_eq!(
        deltas,
        vec![
            "The sky is blue because the Earth's",
            " atmosphere, primarily nitrogen and oxygen molecules, scatters shorter, bluer \
             wavelengths of sunlight more efficiently than longer wavelengths, dispersing blue \
             light across the sky.",
        ]
    );
    // The four thought chunks are one reasoning part, kept as a thought part to send back.
    let thoughts = reasoning(&inferred);
    assert_eq!(thoughts.len(), 1);
    assert!(thoughts[0].0.starts_with("**Defining Atmospheric Color**"));
    assert!(thoughts[0].0.contains("**Refining Explanation Clarity**"));
    assert!(thoughts[0].0.contains("**Finalizing Sky Explanation**"));
    assert!(
        thoughts[0]
            .0
            .ends_with("dispersing blue light across the sky.\n\n\n")
    );
    assert_eq!(thoughts[0].1, &json!({"thought": true}));
    assert!(
        !inferred.text().contains("Defining"),
        "thoughts are not text"
    );
    assert!(inferred.tool_calls().is_empty());
    assert_eq!(inferred.stop, Stop::EndTurn);
    assert_eq!(inferred.usage, usage(12, 35 + 697, 697));
    assert_eq!(inferred.model.as_deref(), Some("gemini-2.5-flash"));
}

#[test]
fn genai_tool_stream() {
    let name = "genai__gemini__tool_stream__response_000.txt";
    let (inferred, deltas) = stream_raw(name);
    assert_eq!(deltas.len(), 5);
    assert_eq!(
        deltas[0],
        "To determine which of these three cities is in Africa"
    );
    assert!(inferred.text().starts_with(
        "To determine which of these three cities is in Africa, let's look at each one:\n\n1. **Berlin**"
    ));
    assert!(
        inferred
            .text()
            .ends_with("I will now fetch the current weather for Cairo in Celsius. \n\n")
    );
    let thoughts = reasoning(&inferred);
    assert_eq!(thoughts.len(), 1);
    assert!(thoughts[0].0.starts_with("**Defining the Problem**"));

    let calls = inferred.tool_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(calls[0].id, "u959pftr", "the API-issued id is kept");
    assert!(!synthetic(&calls[0]));
    assert_eq!(
        args(&calls[0]),
        json!({"country": "Egypt", "unit": "C", "city": "Cairo"})
    );
    let sent = sent_signatures(name);
    assert_eq!(sent.len(), 1);
    assert_eq!(signature(&calls[0].opaque), Some(sent[0].as_str()));
    // Parts in wire order: thought, text, call.
    assert!(matches!(inferred.message.parts[0], Part::Reasoning { .. }));
    assert!(matches!(inferred.message.parts[1], Part::Text { .. }));
    assert!(matches!(inferred.message.parts[2], Part::ToolCall(_)));
    assert_eq!(inferred.message.parts.len(), 3);
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(inferred.usage, usage(135, 136 + 226, 226));
    assert_eq!(inferred.model.as_deref(), Some("gemini-3.1-pro-preview"));

    // Sent back: the id and the signature exactly as received, the result under the same id.
    let body = next_request("gemini-3.1-pro-preview", &inferred);
    let model_parts = &body["contents"][1]["parts"];
    assert_eq!(model_parts[0]["thought"], json!(true));
    assert_eq!(model_parts[2]["functionCall"]["id"], "u959pftr");
    assert_eq!(model_parts[2]["thoughtSignature"], json!(sent[0]));
    assert_eq!(
        body["contents"][2]["parts"][0]["functionResponse"],
        json!({"name": "get_weather", "response": {"result": {"ok": true}}, "id": "u959pftr"})
    );
}

#[test]
fn vercel_google_429_retry_info() {
    let body = read("vercel__google-429-retry-info.json");
    let err = errors::classify(429, &HeaderMap::new(), &body);
    assert_eq!(err.kind(), "provider_error");
    assert_eq!(err.status(), Some(429));
    assert!(err.is_transient(), "a per-minute quota clears soon");
    assert_eq!(err.retry_after(), Some(Duration::from_millis(34_400)));
    let message = err.to_string();
    assert!(
        message.contains("You exceeded your current quota"),
        "{message}"
    );
    assert!(message.contains("RESOURCE_EXHAUSTED"), "{message}");
}

#[test]
fn vercel_google_reasoning() {
    let name = "vercel__google-reasoning.chunks.txt";
    let (inferred, deltas) = stream_chunks(name);
    assert_eq!(
        deltas,
        vec![
            "There are **3** \"r\"s in",
            " strawberry.\n\nHere is the breakdown: st**r**awbe**rr**y."
        ]
    );
    // The signature came in an empty last piece: it closes the text run it belongs to.
    let sent = sent_signatures(name);
    assert_eq!(sent.len(), 1);
    match inferred.message.parts.as_slice() {
        [Part::Text { text, opaque }] => {
            assert_eq!(text, &deltas.concat());
            assert_eq!(signature(opaque), Some(sent[0].as_str()));
        }
        other => panic!("one signed text part expected, got {other:?}"),
    }
    assert!(
        reasoning(&inferred).is_empty(),
        "no thought parts were sent"
    );
    assert_eq!(inferred.stop, Stop::EndTurn);
    assert_eq!(inferred.usage, usage(9, 29 + 256, 256));
    assert_eq!(inferred.model.as_deref(), Some("gemini-3-pro-preview"));

    let req = InferRequest {
        model: "gemini-3-pro-preview".into(),
        messages: vec![Message::user("q"), inferred.message.clone()],
        ..Default::default()
    };
    let body = gemini().request(&req, &endpoint(), false).json();
    assert_eq!(
        body["contents"][1]["parts"],
        json!([{"text": deltas.concat(), "thoughtSignature": sent[0]}])
    );
}

#[test]
fn vercel_google_stream_no_args_tool_call() {
    let name = "vercel__google-stream-no-args-tool-call.chunks.txt";
    let (inferred, deltas) = stream_chunks(name);
    assert!(deltas.is_empty());
    assert_eq!(inferred.text(), "");
    let thoughts = reasoning(&inferred);
    assert_eq!(thoughts.len(), 1);
    assert!(thoughts[0].0.starts_with("**Processing User Requests**"));

    let calls = inferred.tool_calls();
    let named: Vec<(&str, Value)> = calls.iter().map(|c| (c.name.as_str(), args(c))).collect();
    assert_eq!(
        named,
        vec![
            ("read_theme", json!({})),
            ("read_screen", json!({"id": "A"})),
            ("read_screen", json!({"id": "B"})),
            ("read_screen", json!({"id": "C"})),
        ]
    );
    assert_eq!(calls[0].arguments, "{}", "no args is an empty object");
    // Vertex sends no ids: each is made up, distinct, and marked so it is never sent.
    let ids: BTreeSet<&str> = calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids.len(), 4);
    assert!(calls.iter().all(synthetic));
    let sent = sent_signatures(name);
    assert_eq!(sent.len(), 1);
    assert_eq!(signature(&calls[0].opaque), Some(sent[0].as_str()));
    assert!(calls[1..].iter().all(|c| signature(&c.opaque).is_none()));
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(inferred.usage, usage(249, 58 + 183, 183));
    assert_eq!(inferred.model.as_deref(), Some("gemini-3-flash-preview"));

    let body = next_request("gemini-3-flash-preview", &inferred);
    let model_parts = body["contents"][1]["parts"].as_array().expect("parts");
    assert_eq!(model_parts.len(), 5);
    assert_eq!(
        model_parts[1],
        json!({"functionCall": {"name": "read_theme", "args": {}}, "thoughtSignature": sent[0]})
    );
    assert_eq!(
        model_parts[2],
        json!({"functionCall": {"name": "read_screen", "args": {"id": "A"}}})
    );
    let responses = body["contents"][2]["parts"].as_array().expect("parts");
    assert_eq!(responses.len(), 4);
    assert!(
        responses
            .iter()
            .all(|r| r["functionResponse"].get("id").is_none())
    );
}

#[test]
fn vercel_google_stream_tool_call_arguments() {
    let name = "vercel__google-stream-tool-call-arguments.chunks.txt";
    let (inferred, deltas) = stream_chunks(name);
    assert!(deltas.is_empty());
    assert_eq!(inferred.text(), "");
    let calls = inferred.tool_calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].name, "getWeather");
    assert_eq!(args(&calls[0]), json!({"location": "Boston"}));
    assert_eq!(calls[1].name, "getWeather");
    assert_eq!(args(&calls[1]), json!({"location": "San Francisco"}));
    assert_ne!(calls[0].id, calls[1].id);
    assert!(calls.iter().all(synthetic));
    let sent = sent_signatures(name);
    assert_eq!(sent.len(), 1);
    assert_eq!(signature(&calls[0].opaque), Some(sent[0].as_str()));
    assert_eq!(signature(&calls[1].opaque), None);
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(inferred.usage, usage(26, 23 + 132, 132));
    assert_eq!(inferred.model.as_deref(), Some("gemini-3.1-pro-preview"));
}

#[test]
fn vercel_google_text() {
    let name = "vercel__google-text.chunks.txt";
    let (inferred, deltas) = stream_chunks(name);
    assert_eq!(
        deltas,
        vec![
            "There are **3**",
            " \"r\"s in strawberry.\n\nst**r**awbe**rr**y"
        ]
    );
    let sent = sent_signatures(name);
    match inferred.message.parts.as_slice() {
        [Part::Text { text, opaque }] => {
            assert_eq!(
                text,
                "There are **3** \"r\"s in strawberry.\n\nst**r**awbe**rr**y"
            );
            assert_eq!(signature(opaque), Some(sent[0].as_str()));
        }
        other => panic!("one signed text part expected, got {other:?}"),
    }
    assert!(inferred.tool_calls().is_empty());
    assert_eq!(inferred.stop, Stop::EndTurn);
    assert_eq!(inferred.usage, usage(9, 23 + 185, 185));
    assert_eq!(inferred.model.as_deref(), Some("gemini-3-pro-preview"));
}

#[test]
fn vercel_google_tool_call_stream() {
    let name = "vercel__google-tool-call.chunks.txt";
    let (inferred, deltas) = stream_chunks(name);
    assert!(deltas.is_empty());
    assert_eq!(inferred.text(), "");
    let calls = inferred.tool_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "weather");
    assert_eq!(args(&calls[0]), json!({"location": "San Francisco"}));
    assert!(synthetic(&calls[0]));
    let sent = sent_signatures(name);
    assert_eq!(signature(&calls[0].opaque), Some(sent[0].as_str()));
    assert_eq!(
        inferred.message.parts.len(),
        1,
        "the empty text piece adds nothing"
    );
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(inferred.usage, usage(29, 15 + 45, 45));
}

#[test]
fn vercel_google_tool_call_json() {
    let name = "vercel__google-tool-call.json";
    let inferred = gemini()
        .parse(read(name).as_bytes())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(inferred.text(), "", "finishMessage of a STOP is not text");
    let calls = inferred.tool_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "weather");
    assert_eq!(calls[0].arguments, r#"{"location":"San Francisco"}"#);
    assert!(synthetic(&calls[0]));
    assert_eq!(
        signature(&calls[0].opaque),
        Some(
            "EskgCsYgAb4+9vtF7/499YQS2bjZs3xcQI+iAl+ILn29nK1j0Kg6su7QsUUUk3nrAAfnS2w5WiVvlcCqu9fAebJ2cvfaEyBahEt5"
        )
    );
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(inferred.usage, usage(29, 15 + 893, 893));
    assert_eq!(inferred.model.as_deref(), Some("gemini-3-pro-preview"));

    // The array form (streamGenerateContent without alt=sse) gives the same answer.
    let array = format!("[{}]", read(name));
    let from_array = gemini().parse(array.as_bytes()).expect("array body");
    assert_eq!(from_array.tool_calls()[0].arguments, calls[0].arguments);
    assert_eq!(from_array.stop, Stop::ToolUse);
    assert_eq!(from_array.usage, inferred.usage);
}

/// Not a wire response: Vercel's summary of a live Gemini 3 parallel-call capture, where only the
/// first call of the batch is signed. It is rebuilt into the response it summarises, parsed, and
/// sent back: the signature goes back on the first call, and the unsigned sibling stays unsigned
/// (the placeholder Vercel wrongly injected there, issue 16298, must not appear).
#[test]
fn vercel_issue_16298_gemini3_parallel_tool_calls() {
    let summary: Value = serde_json::from_str(&read(
        "vercel__issue-16298-gemini3-parallel-tool-calls.json",
    ))
    .expect("JSON");
    let captured = summary["toolCalls"].as_array().expect("toolCalls");
    assert_eq!(captured.len(), 2);
    let parts: Vec<Value> = captured
        .iter()
        .map(|c| {
            let mut part = json!({"functionCall": {
                "name": c["toolName"], "args": c["input"], "id": c["toolCallId"],
            }});
            if let Some(sig) = c["providerMetadata"]["googleVertex"]["thoughtSignature"].as_str() {
                part["thoughtSignature"] = json!(sig);
            }
            part
        })
        .collect();
    let response = json!({"candidates": [{
        "content": {"role": "model", "parts": parts},
        "finishReason": "STOP",
    }]});
    let inferred = gemini()
        .parse(response.to_string().as_bytes())
        .expect("an answer");
    let calls = inferred.tool_calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].id, "lpndqlku");
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(args(&calls[0]), json!({"city": "Paris"}));
    assert_eq!(calls[1].id, "m6rogicj");
    assert_eq!(args(&calls[1]), json!({"city": "Tokyo"}));
    let first_sig = captured[0]["providerMetadata"]["googleVertex"]["thoughtSignature"]
        .as_str()
        .expect("the first call is signed");
    assert_eq!(signature(&calls[0].opaque), Some(first_sig));
    assert_eq!(signature(&calls[1].opaque), None);
    assert_eq!(inferred.stop, Stop::ToolUse);

    let model = summary["model"].as_str().expect("model");
    let model = model.rsplit('/').next().unwrap_or(model);
    assert_eq!(model, "gemini-3.1-flash-lite");
    let body = next_request(model, &inferred);
    let model_parts = &body["contents"][1]["parts"];
    assert_eq!(model_parts[0]["thoughtSignature"], json!(first_sig));
    assert_eq!(model_parts[0]["functionCall"]["id"], "lpndqlku");
    assert_eq!(model_parts[1].get("thoughtSignature"), None);
    assert_eq!(model_parts[1]["functionCall"]["id"], "m6rogicj");
    assert!(
        !body
            .to_string()
            .contains("skip_thought_signature_validator")
    );
    let responses = body["contents"][2]["parts"].as_array().expect("parts");
    let ids: Vec<&Value> = responses
        .iter()
        .map(|r| &r["functionResponse"]["id"])
        .collect();
    assert_eq!(ids, vec!["lpndqlku", "m6rogicj"]);
}

#[test]
fn vercel_issue_8943_gemini_2_5_flash_error() {
    let body = read("vercel__issue-8943-gemini-2.5-flash-error.json");
    let err = errors::classify(400, &HeaderMap::new(), &body);
    assert_eq!(err.kind(), "api_error");
    assert_eq!(err.status(), Some(400));
    assert!(!err.is_transient());
    assert_eq!(err.retry_after(), None);
    assert_eq!(
        err.to_string(),
        "API error 400: Penalty is not enabled for models/gemini-2.5-flash (INVALID_ARGUMENT)"
    );
}
