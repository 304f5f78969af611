//! Every recorded OpenAI-style response under `tests/data/providers/openai/` (OpenAI, Azure, Groq,
//! DeepSeek, Kimi), run through the openai codec, with its content checked: text, tool calls,
//! stop reason, usage, the opaque data kept, and for error bodies the classified error.
//!
//! Formats (see `tests/data/providers/README.md` and `SOURCES.tsv`):
//! - `*.json`: a whole response body, read with `Codec::parse` (or an error body, classified);
//! - `*.chunks.txt`: one SSE data payload per line (vercel/ai strips the `data:` prefix and the
//!   `[DONE]` line), wrapped back into SSE here;
//! - `*.bin`: raw SSE bytes recorded by the OpenAI Python SDK tests. All nine are chat-completions
//!   streams (`chat.completion.chunk` objects ending in `data: [DONE]`); none is a Responses API
//!   stream.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use colony::providers::errors::classify;
use colony::providers::sse::assemble_bytes;
use colony::providers::{Codec, ProviderError, codec};
use colony::vocab::{Inferred, Opaque, Part, Role, Stop, Style, Usage};
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

/// Every file of the folder, each checked by the test of the same name below.
const FILES: &[&str] = &[
    "oaipy__173417d55340.bin",
    "oaipy__2018feb66ae1.bin",
    "oaipy__4cc50a6135d2.bin",
    "oaipy__569c877e6942.bin",
    "oaipy__a247c49c5fcd.bin",
    "oaipy__a491adda08c3.bin",
    "oaipy__c6aa7e397b71.bin",
    "oaipy__e2aad469b71d.bin",
    "oaipy__f82268f2fefd.bin",
    "vercel__azure-model-router.1.chunks.txt",
    "vercel__deepseek-tool-call.chunks.txt",
    "vercel__groq-tool-call.chunks.txt",
    "vercel__groq-tool-call.json",
    "vercel__moonshotai-tool-call.json",
    "vercel__openai-text.chunks.txt",
    "vercel__openai-text.json",
    "vercel__reasoning-model-legacy-parameter-error.json",
];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/providers/openai")
}

fn openai() -> &'static dyn Codec {
    codec(Style::Openai).expect("the openai style has a codec")
}

fn read(name: &str) -> Vec<u8> {
    assert!(FILES.contains(&name), "{name} is missing from FILES");
    std::fs::read(dir().join(name)).unwrap_or_else(|e| panic!("reading {name}: {e}"))
}

/// A whole response body through `Codec::parse`.
fn parsed(name: &str) -> Inferred {
    openai()
        .parse(&read(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// SSE bytes through the stream assembler; also checks that the text deltas, in order, make up
/// the final text.
fn assembled(name: &str, sse: &[u8]) -> (Inferred, Vec<String>) {
    let (result, deltas) = assemble_bytes(sse, openai().assembler());
    let inferred = result.unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        deltas.iter().all(|d| !d.is_empty()),
        "{name}: empty text delta"
    );
    assert_eq!(deltas.concat(), inferred.text(), "{name}: deltas vs text");
    (inferred, deltas)
}

/// A raw SSE capture (`*.bin`), as recorded.
fn raw_stream(name: &str) -> (Inferred, Vec<String>) {
    assembled(name, &read(name))
}

/// A `*.chunks.txt` file: each line wrapped as `data: LINE\n\n`. The captures carry no `[DONE]`;
/// they are accepted because a finish reason was seen, and appending `[DONE]` changes nothing.
fn chunk_stream(name: &str) -> (Inferred, Vec<String>) {
    let text = String::from_utf8(read(name)).expect("chunk files are UTF-8");
    let sse: String = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| format!("data: {line}\n\n"))
        .collect();
    let bare = assembled(name, sse.as_bytes());
    let done = assembled(name, format!("{sse}data: [DONE]\n\n").as_bytes());
    assert_eq!(bare, done, "{name}: [DONE] changes the result");
    bare
}

/// The first choice's streamed `delta.content`, read independently of the codec.
fn streamed_content(name: &str) -> String {
    let text = String::from_utf8(read(name)).expect("chunk files are UTF-8");
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|chunk| {
            chunk
                .pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect()
}

fn usage(input: u64, output: u64, cache_read: u64, reasoning: u64) -> Usage {
    Usage {
        input,
        output,
        cache_read,
        cache_write: 0,
        reasoning,
    }
}

/// The tool calls as (id, name, parsed arguments); also checks no call carries opaque data.
fn calls(inferred: &Inferred) -> Vec<(String, String, Value)> {
    inferred
        .tool_calls()
        .into_iter()
        .map(|c| {
            assert_eq!(c.opaque, None, "{}: unexpected opaque data", c.id);
            let args = c
                .decoded()
                .unwrap_or_else(|e| panic!("{}: bad arguments: {e}", c.id));
            (c.id, c.name, args)
        })
        .collect()
}

fn call(id: &str, name: &str, args: Value) -> (String, String, Value) {
    (id.to_string(), name.to_string(), args)
}

/// No reasoning and no opaque data anywhere in the message.
fn assert_no_opaque(inferred: &Inferred) {
    assert_eq!(inferred.message.role, Role::Assistant);
    for part in &inferred.message.parts {
        match part {
            Part::Reasoning { .. } => panic!("unexpected reasoning part: {part:?}"),
            Part::Text { opaque, .. } => assert_eq!(opaque, &None),
            Part::ToolCall(c) => assert_eq!(c.opaque, None),
            Part::ToolResult(_) => panic!("a response holds no tool result"),
            Part::File(_) => panic!("a response holds no file"),
        }
    }
}

#[test]
fn every_file_is_covered() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(dir())
        .expect("the fixture folder exists")
        .map(|entry| entry.expect("a readable entry").file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .collect();
    let covered: BTreeSet<String> = FILES.iter().map(|s| s.to_string()).collect();
    assert_eq!(FILES.len(), covered.len(), "FILES lists a file twice");
    let missing: Vec<_> = on_disk.difference(&covered).collect();
    let gone: Vec<_> = covered.difference(&on_disk).collect();
    assert!(missing.is_empty(), "fixtures without a test: {missing:?}");
    assert!(gone.is_empty(), "tests for missing fixtures: {gone:?}");
}

// --- whole responses ---------------------------------------------------------------------------

#[test]
fn vercel_openai_text_json() {
    let name = "vercel__openai-text.json";
    let inferred = parsed(name);
    let body: Value = serde_json::from_slice(&read(name)).unwrap();
    let text = inferred.text();
    assert_eq!(
        Some(text.as_str()),
        body.pointer("/choices/0/message/content")
            .and_then(Value::as_str)
    );
    assert!(text.starts_with("**Holiday Name:** Galaxy Day  \n\n**Date:** October 31st"));
    assert!(text.ends_with("inspiring individuals to look up and dream beyond our world."));
    assert!(
        text.contains("vast darkness\u{2014}mirroring"),
        "escaped em dash decoded"
    );
    assert_eq!(text.chars().count(), 1842);
    assert_eq!(inferred.message.parts, vec![Part::text(text.clone())]);
    assert!(calls(&inferred).is_empty());
    assert_eq!(inferred.stop, Stop::EndTurn);
    assert_eq!(inferred.usage, usage(16, 363, 0, 0));
    assert_eq!(inferred.model.as_deref(), Some("gpt-4.1-nano-2025-04-14"));
}

#[test]
fn vercel_groq_tool_call_json() {
    let inferred = parsed("vercel__groq-tool-call.json");
    // No `content` key at all: no text part.
    assert_eq!(inferred.message.parts.len(), 1);
    assert_eq!(inferred.text(), "");
    assert_eq!(
        calls(&inferred),
        vec![call("ax9fskhev", "weather", json!({}))]
    );
    assert_eq!(inferred.tool_calls()[0].arguments, "{}");
    assert_eq!(inferred.stop, Stop::ToolUse);
    // queue_time / prompt_time and friends are ignored.
    assert_eq!(inferred.usage, usage(218, 15, 0, 0));
    assert_eq!(inferred.model.as_deref(), Some("llama-3.3-70b-versatile"));
    assert_no_opaque(&inferred);
}

#[test]
fn vercel_moonshotai_tool_call_json() {
    // Hand-written by vercel in Kimi's shape (`content: null` beside the calls).
    let inferred = parsed("vercel__moonshotai-tool-call.json");
    assert_eq!(inferred.text(), "");
    assert_eq!(
        calls(&inferred),
        vec![call("call_abc123", "get_weather", json!({"city": "Paris"}))]
    );
    assert_eq!(inferred.tool_calls()[0].arguments, r#"{"city":"Paris"}"#);
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(inferred.usage, usage(30, 12, 0, 0));
    assert_eq!(inferred.model.as_deref(), Some("kimi-k3"));
    assert_no_opaque(&inferred);
}

#[test]
fn vercel_reasoning_model_legacy_parameter_error_json() {
    // OpenAI's 400 for `max_tokens` on a reasoning model (the fix is `extra`:
    // `{"max_completion_tokens": N}`).
    let name = "vercel__reasoning-model-legacy-parameter-error.json";
    let body = String::from_utf8(read(name)).unwrap();
    let err = classify(400, &HeaderMap::new(), &body);
    assert_eq!(err.kind(), "api_error");
    assert_eq!(err.status(), Some(400));
    assert!(!err.is_transient());
    assert_eq!(err.retry_after(), None);
    let ProviderError::Api { message, .. } = &err else {
        panic!("not an API error: {err:?}");
    };
    assert_eq!(
        message,
        "Unsupported parameter: 'max_tokens' is not supported with this model. \
         Use 'max_completion_tokens' instead. (unsupported_parameter)"
    );
    // Handed to the parser as if it came with a 200, it is still an error, not an empty answer.
    let err = openai().parse(body.as_bytes()).unwrap_err();
    assert_eq!(err.kind(), "api_error");
    assert!(err.to_string().contains("max_completion_tokens"));
}

// --- chunk files -------------------------------------------------------------------------------

#[test]
fn vercel_openai_text_chunks() {
    let name = "vercel__openai-text.chunks.txt";
    let (inferred, deltas) = chunk_stream(name);
    let text = inferred.text();
    assert_eq!(text, streamed_content(name));
    assert!(text.starts_with("**Holiday Name:** Harmony Day\n\n**Date:** Celebrated annually"));
    assert!(text.ends_with("connected through shared human experiences and mutual respect."));
    assert_eq!(text.chars().count(), 1724);
    assert_eq!(deltas.len(), 300, "one delta per content chunk");
    assert_eq!(deltas[..3], ["**", "Holiday", " Name"]);
    assert_eq!(inferred.message.parts, vec![Part::text(text.clone())]);
    assert_eq!(inferred.stop, Stop::EndTurn);
    // From the last chunk (`choices: []`).
    assert_eq!(inferred.usage, usage(16, 300, 0, 0));
    assert_eq!(inferred.model.as_deref(), Some("gpt-4.1-nano-2025-04-14"));
}

#[test]
fn vercel_azure_model_router_chunks() {
    // First chunk: empty id/model and `choices: []` with prompt_filter_results.
    let (inferred, deltas) = chunk_stream("vercel__azure-model-router.1.chunks.txt");
    assert_eq!(deltas, ["Capital", " of", " Denmark", "."]);
    assert_eq!(inferred.text(), "Capital of Denmark.");
    assert!(calls(&inferred).is_empty());
    assert_eq!(inferred.stop, Stop::EndTurn);
    assert_eq!(inferred.usage, usage(15, 78, 0, 64));
    assert_eq!(inferred.model.as_deref(), Some("gpt-5-nano-2025-08-07"));
    assert_no_opaque(&inferred);
}

#[test]
fn vercel_groq_tool_call_chunks() {
    // The whole call in one chunk; usage both in `x_groq.usage` and top-level `usage`.
    let (inferred, deltas) = chunk_stream("vercel__groq-tool-call.chunks.txt");
    assert!(deltas.is_empty());
    assert_eq!(inferred.text(), "");
    assert_eq!(
        calls(&inferred),
        vec![call("tk85n1k4m", "weather", json!({}))]
    );
    assert_eq!(inferred.tool_calls()[0].arguments, "{}");
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(inferred.usage, usage(210, 15, 0, 0));
    assert_eq!(inferred.model.as_deref(), Some("llama-3.3-70b-versatile"));
    assert_no_opaque(&inferred);
}

#[test]
fn vercel_deepseek_tool_call_chunks() {
    let (inferred, deltas) = chunk_stream("vercel__deepseek-tool-call.chunks.txt");
    let reasoning = "The user is asking for the weather in San Francisco. I need to use the \
                     weather tool to get this information. Let me invoke the weather tool with \
                     the location parameter set to \"San Francisco\".";
    // Reasoning is not visible text: no deltas, and it is kept to be sent back.
    assert!(deltas.is_empty());
    assert_eq!(inferred.text(), "");
    assert_eq!(
        inferred.message.parts[0],
        Part::Reasoning {
            text: reasoning.to_string(),
            opaque: Some(Opaque {
                style: Style::Openai,
                data: json!({"reasoning_content": reasoning}),
            }),
        }
    );
    assert_eq!(inferred.message.parts.len(), 2);
    assert_eq!(
        calls(&inferred),
        vec![call(
            "call_00_ioIn7yN9p1ZOMNpDLwd4MgAF",
            "weather",
            json!({"location": "San Francisco"})
        )]
    );
    assert_eq!(
        inferred.tool_calls()[0].arguments,
        r#"{"location": "San Francisco"}"#
    );
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(inferred.usage, usage(339, 83, 320, 39));
    assert_eq!(inferred.model.as_deref(), Some("deepseek-reasoner"));
}

// --- raw SSE captures from the OpenAI Python SDK -----------------------------------------------

const GPT4O: Option<&str> = Some("gpt-4o-2024-08-06");

#[test]
fn oaipy_173417d55340_refusal() {
    let (inferred, deltas) = raw_stream("oaipy__173417d55340.bin");
    // `delta.refusal` is visible text; `finish_reason` is a plain "stop".
    assert_eq!(deltas[..3], ["I'm", " sorry", ","]);
    assert_eq!(
        inferred.text(),
        "I'm sorry, I can't assist with that request."
    );
    assert!(calls(&inferred).is_empty());
    assert_eq!(inferred.stop, Stop::Refusal);
    assert_eq!(inferred.usage, usage(79, 11, 0, 0));
    assert_eq!(inferred.model.as_deref(), GPT4O);
    assert_no_opaque(&inferred);
}

#[test]
fn oaipy_2018feb66ae1_non_strict_tool() {
    let (inferred, deltas) = raw_stream("oaipy__2018feb66ae1.bin");
    assert!(deltas.is_empty());
    assert_eq!(
        calls(&inferred),
        vec![call(
            "call_4XzlGBLtUe9dy3GVNV4jhq7h",
            "get_weather",
            json!({"city": "New York City"})
        )]
    );
    assert_eq!(
        inferred.tool_calls()[0].arguments,
        r#"{"city":"New York City"}"#
    );
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(inferred.usage, usage(44, 16, 0, 0));
    assert_eq!(inferred.model.as_deref(), GPT4O);
    assert_no_opaque(&inferred);
}

#[test]
fn oaipy_4cc50a6135d2_max_tokens() {
    // max_tokens=1 during a structured-output answer: the text is cut mid-JSON.
    let (inferred, deltas) = raw_stream("oaipy__4cc50a6135d2.bin");
    assert_eq!(deltas, ["{\""]);
    assert_eq!(inferred.text(), "{\"");
    assert_eq!(inferred.stop, Stop::MaxTokens);
    assert_eq!(inferred.usage, usage(79, 1, 0, 0));
    assert_eq!(inferred.model.as_deref(), GPT4O);
    assert_no_opaque(&inferred);
}

#[test]
fn oaipy_569c877e6942_refusal_with_logprobs() {
    // Same as the other refusal, with `logprobs.refusal` arrays beside each delta (ignored).
    let (inferred, deltas) = raw_stream("oaipy__569c877e6942.bin");
    assert_eq!(deltas[..3], ["I'm", " very", " sorry"]);
    assert_eq!(
        inferred.text(),
        "I'm very sorry, but I can't assist with that."
    );
    assert_eq!(inferred.stop, Stop::Refusal);
    assert_eq!(inferred.usage, usage(79, 12, 0, 0));
    assert_eq!(inferred.model.as_deref(), GPT4O);
    assert_no_opaque(&inferred);
}

#[test]
fn oaipy_a247c49c5fcd_strict_tool() {
    let (inferred, deltas) = raw_stream("oaipy__a247c49c5fcd.bin");
    assert!(deltas.is_empty());
    assert_eq!(
        calls(&inferred),
        vec![call(
            "call_CTf1nWJLqSeRgDqaCG27xZ74",
            "get_weather",
            json!({"city": "San Francisco", "state": "CA"})
        )]
    );
    assert_eq!(
        inferred.tool_calls()[0].arguments,
        r#"{"city":"San Francisco","state":"CA"}"#
    );
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(inferred.usage, usage(48, 19, 0, 0));
    assert_eq!(inferred.model.as_deref(), GPT4O);
    assert_no_opaque(&inferred);
}

#[test]
fn oaipy_a491adda08c3_three_choices() {
    // n=3: three interleaved choices. colony never asks for n>1; only choice 0 is kept (the
    // others said temperature 61 and 59). Usage counts all three.
    let (inferred, deltas) = raw_stream("oaipy__a491adda08c3.bin");
    let first = r#"{"city":"San Francisco","temperature":65,"units":"f"}"#;
    assert_eq!(inferred.text(), first);
    assert_eq!(deltas.concat(), first, "no delta from choices 1 and 2");
    assert_eq!(inferred.message.parts, vec![Part::text(first)]);
    assert_eq!(inferred.stop, Stop::EndTurn);
    assert_eq!(inferred.usage, usage(79, 42, 0, 0));
    assert_eq!(inferred.model.as_deref(), GPT4O);
}

#[test]
fn oaipy_c6aa7e397b71_pydantic_tool() {
    let (inferred, deltas) = raw_stream("oaipy__c6aa7e397b71.bin");
    assert!(deltas.is_empty());
    assert_eq!(
        calls(&inferred),
        vec![call(
            "call_c91SqDXlYFuETYv8mUHzz6pp",
            "GetWeatherArgs",
            json!({"city": "Edinburgh", "country": "UK", "units": "c"})
        )]
    );
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(inferred.usage, usage(76, 24, 0, 0));
    assert_eq!(inferred.model.as_deref(), GPT4O);
    assert_no_opaque(&inferred);
}

#[test]
fn oaipy_e2aad469b71d_plain_text() {
    let (inferred, deltas) = raw_stream("oaipy__e2aad469b71d.bin");
    assert_eq!(deltas[..4], ["I'm", " unable", " to", " provide"]);
    assert_eq!(
        inferred.text(),
        "I'm unable to provide real-time weather updates. To get the current weather in San \
         Francisco, I recommend checking a reliable weather website or a weather app."
    );
    assert!(calls(&inferred).is_empty());
    assert_eq!(inferred.stop, Stop::EndTurn);
    assert_eq!(inferred.usage, usage(14, 30, 0, 0));
    assert_eq!(inferred.model.as_deref(), GPT4O);
    assert_no_opaque(&inferred);
}

#[test]
fn oaipy_f82268f2fefd_parallel_tools() {
    let (inferred, deltas) = raw_stream("oaipy__f82268f2fefd.bin");
    assert!(deltas.is_empty());
    assert_eq!(
        calls(&inferred),
        vec![
            call(
                "call_JMW1whyEaYG438VE1OIflxA2",
                "GetWeatherArgs",
                json!({"city": "Edinburgh", "country": "GB", "units": "c"})
            ),
            call(
                "call_DNYTawLBoN8fj3KN6qU9N1Ou",
                "get_stock_price",
                json!({"ticker": "AAPL", "exchange": "NASDAQ"})
            ),
        ]
    );
    // The argument text is kept exactly as the model wrote it, spaces included.
    let arguments: Vec<String> = inferred
        .tool_calls()
        .into_iter()
        .map(|c| c.arguments)
        .collect();
    assert_eq!(
        arguments,
        [
            r#"{"city": "Edinburgh", "country": "GB", "units": "c"}"#,
            r#"{"ticker": "AAPL", "exchange": "NASDAQ"}"#,
        ]
    );
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(inferred.usage, usage(149, 60, 0, 0));
    assert_eq!(inferred.model.as_deref(), GPT4O);
    assert_no_opaque(&inferred);
}

/// The captures are whole; cut one before its finishing chunk and it must fail as a cut stream,
/// not pass as a short answer.
#[test]
fn a_cut_capture_is_an_error() {
    let bytes = read("oaipy__e2aad469b71d.bin");
    let text = String::from_utf8(bytes).unwrap();
    let cut = text
        .find("\"finish_reason\":\"stop\"")
        .and_then(|at| text[..at].rfind("data: "))
        .expect("the capture has a finishing chunk");
    let (result, deltas) = assemble_bytes(&text.as_bytes()[..cut], openai().assembler());
    assert!(!deltas.is_empty());
    let err = result.unwrap_err();
    assert_eq!(err.kind(), "fetch_error");
    assert!(err.is_transient());
    assert!(err.to_string().contains("the stream ended before [DONE]"));
    assert_eq!(err.retry_after(), None::<Duration>);
}
