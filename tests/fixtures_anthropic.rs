//! Every recorded Anthropic response under `tests/data/providers/anthropic/` through the
//! anthropic codec, with its content checked: text, tool calls, stop, usage, opaque data, errors.
//! What each file shows and where it came from is in `tests/data/providers/SOURCES.tsv`.

use std::path::{Path, PathBuf};

use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use colony::providers::errors::classify;
use colony::providers::sse::assemble_bytes;
use colony::providers::{Codec, codec};
use colony::vocab::{Inferred, Part, Stop, Style, Usage};

/// Every file of the folder, each checked by the test of the same name below.
const FILES: &[&str] = &[
    "antpy__basic_response.txt",
    "antpy__incomplete_partial_json_response.txt",
    "antpy__refusal_response.txt",
    "antpy__tool_use_response.txt",
    "genai__anthropic__usage_stream__response_000.txt",
    "vercel__anthropic-issue-11719-quoted-tool-input.chunks.txt",
    "vercel__anthropic-issue-11719-quoted-tool-input.json",
    "vercel__anthropic-issue-15652-false.chunks.txt",
    "vercel__anthropic-issue-17366-error.json",
    "vercel__anthropic-issue-5942-cache-write.chunks.txt",
    "vercel__anthropic-json-tool.2.chunks.txt",
    "vercel__anthropic-message-delta-input-tokens.chunks.txt",
    "vercel__anthropic-parallel-provider-client-tools.error.json",
    "vercel__anthropic-refusal.chunks.txt",
    "vercel__anthropic-refusal.json",
    "vercel__anthropic-text.chunks.txt",
    "vercel__anthropic-text.json",
    "vercel__anthropic-tool-no-args.chunks.txt",
    "vercel__anthropic-tool-no-args.json",
];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/providers/anthropic")
}

fn anthropic() -> &'static dyn Codec {
    codec(Style::Anthropic).expect("the anthropic style has a codec")
}

fn load(name: &str) -> Vec<u8> {
    assert!(FILES.contains(&name), "{name} is not in FILES");
    std::fs::read(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A whole (non-streaming) response body through `Codec::parse`.
fn whole(name: &str) -> Inferred {
    anthropic()
        .parse(&load(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `*.chunks.txt` holds one data payload per line: wrapped as Anthropic SSE with the event
/// named after the payload's `type`. Other stream files are raw SSE bytes, fed as they are, except
/// for one repair: the `antpy__` files were stored without the blank line that ends their last
/// event (`message_stop`). By the SSE rules an event is dispatched only at that blank line, so
/// without it the stream would look cut before `message_stop`; the SDK they come from does not
/// notice because it never requires `message_stop`. The server sends the blank line.
fn sse_bytes(name: &str) -> Vec<u8> {
    let mut bytes = load(name);
    if !name.ends_with(".chunks.txt") {
        if !(bytes.ends_with(b"\n\n") || bytes.ends_with(b"\r\n\r\n")) {
            let text = String::from_utf8_lossy(&bytes);
            let last = text.trim_end().lines().last().unwrap_or_default();
            assert!(last.contains("message_stop"), "{name}: ends with {last:?}");
            while bytes.last() == Some(&b'\n') {
                bytes.pop();
            }
            bytes.extend_from_slice(b"\n\n");
        }
        return bytes;
    }
    let text = String::from_utf8(bytes).expect("chunk files are UTF-8");
    let mut out = String::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let payload: Value = serde_json::from_str(line).expect("each chunk line is JSON");
        let kind = payload["type"].as_str().expect("each chunk has a type");
        out.push_str(&format!("event: {kind}\ndata: {line}\n\n"));
    }
    out.into_bytes()
}

/// A stream through the assembler, also returning the text deltas in arrival order. The deltas
/// must add up to the final text.
fn streamed(name: &str) -> (Inferred, Vec<String>) {
    let (result, deltas) = assemble_bytes(&sse_bytes(name), anthropic().assembler());
    let inferred = result.unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        deltas.concat(),
        inferred.text(),
        "{name}: deltas vs final text"
    );
    assert!(deltas.iter().all(|d| !d.is_empty()), "{name}: empty delta");
    (inferred, deltas)
}

fn usage(input: u64, output: u64, cache_read: u64, cache_write: u64) -> Usage {
    Usage {
        input,
        output,
        cache_read,
        cache_write,
        reasoning: 0,
    }
}

/// Each call as (id, name, arguments parsed as JSON).
fn calls(inferred: &Inferred) -> Vec<(String, String, Value)> {
    inferred
        .tool_calls()
        .into_iter()
        .map(|c| {
            let args = c
                .decoded()
                .unwrap_or_else(|e| panic!("arguments of {}: {e}: {}", c.id, c.arguments));
            (c.id, c.name, args)
        })
        .collect()
}

fn call(id: &str, name: &str, args: Value) -> (String, String, Value) {
    (id.to_string(), name.to_string(), args)
}

/// None of these recordings has thinking blocks, so nothing opaque may be kept.
fn assert_no_opaque(inferred: &Inferred) {
    for part in &inferred.message.parts {
        let opaque = match part {
            Part::Text { opaque, .. } | Part::Reasoning { opaque, .. } => opaque.as_ref(),
            Part::ToolCall(c) => c.opaque.as_ref(),
            Part::ToolResult(_) | Part::File(_) => None,
        };
        assert!(opaque.is_none(), "unexpected opaque data in {part:?}");
        assert!(
            !matches!(part, Part::Reasoning { .. }),
            "unexpected reasoning {part:?}"
        );
    }
}

#[test]
fn every_file_in_the_folder_is_covered() {
    let mut on_disk: Vec<String> = std::fs::read_dir(dir())
        .expect("the fixture folder exists")
        .map(|e| {
            e.expect("readable entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = FILES.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "add a test for each new fixture file");
}

// ---- raw SSE recordings (anthropic-sdk-python, rust-genai) ----

#[test]
fn antpy_basic_response() {
    let (r, deltas) = streamed("antpy__basic_response.txt");
    assert_eq!(deltas, vec!["Hello", " there", "!"]);
    assert_eq!(r.text(), "Hello there!");
    assert!(r.tool_calls().is_empty());
    assert_eq!(r.stop, Stop::EndTurn);
    assert_eq!(r.usage, usage(11, 6, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-3-opus-latest"));
    assert_no_opaque(&r);
}

#[test]
fn antpy_incomplete_partial_json_response() {
    let (r, deltas) = streamed("antpy__incomplete_partial_json_response.txt");
    assert_eq!(deltas.len(), 5);
    assert_eq!(deltas[0], "I");
    assert_eq!(
        r.text(),
        "I'll create a comprehensive tax guide for someone with multiple W2s and save it in a \
         file called taxes.txt. Let me do that for you now."
    );
    // The tool block never got its stop: the partial JSON is kept as it came, cut mid-string.
    let calls = r.tool_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].id, "toolu_01EKqbqmZrGRXy18eN7m9kvY");
    assert_eq!(calls[0].name, "make_file");
    assert_eq!(
        calls[0].arguments,
        "{\"filename\": \"taxes.txt\", \"lines_of_text\": [\n\"# COMPREHENSIVE TAX GUIDE FOR \
         INDIVIDUALS WITH MULTIPLE W-2s\",\n\"\",\n\"## INTRODUCTION\",\n\"\",\n\"Filing taxes"
    );
    assert!(calls[0].decoded().is_err());
    assert_eq!(r.stop, Stop::MaxTokens);
    assert_eq!(r.usage, usage(450, 124, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-3-7-sonnet-20250219"));
    assert_no_opaque(&r);
}

#[test]
fn antpy_refusal_response() {
    let (r, deltas) = streamed("antpy__refusal_response.txt");
    assert!(deltas.is_empty());
    // The one text block is empty, so the message keeps no parts at all.
    assert!(r.message.parts.is_empty(), "{:?}", r.message.parts);
    assert_eq!(r.stop, Stop::Refusal);
    assert_eq!(r.usage, usage(20, 0, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-opus-4-7"));
}

#[test]
fn antpy_tool_use_response() {
    let (r, deltas) = streamed("antpy__tool_use_response.txt");
    assert_eq!(
        deltas,
        vec!["I", "'ll check the current weather in Paris for you."]
    );
    assert_eq!(r.text(), "I'll check the current weather in Paris for you.");
    assert_eq!(
        calls(&r),
        vec![call(
            "toolu_01NRLabsLyVHZPKxbKvkfSMn",
            "get_weather",
            json!({"location": "Paris"})
        )]
    );
    // Fragments split mid-token, reassembled and serialised compactly.
    assert_eq!(r.tool_calls()[0].arguments, r#"{"location":"Paris"}"#);
    assert_eq!(r.stop, Stop::ToolUse);
    assert_eq!(r.usage, usage(377, 65, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-sonnet-4-20250514"));
    assert_no_opaque(&r);
}

#[test]
fn genai_usage_stream() {
    let (r, deltas) = streamed("genai__anthropic__usage_stream__response_000.txt");
    assert_eq!(deltas.len(), 3);
    assert_eq!(deltas[0], "The sky is");
    assert_eq!(
        r.text(),
        "The sky is blue because sunlight scatters off nitrogen and oxygen molecules in the \
         atmosphere, and blue light scatters more efficiently than other colors."
    );
    assert!(r.tool_calls().is_empty());
    assert_eq!(r.stop, Stop::EndTurn);
    // message_start said 3 output tokens; message_delta's cumulative 34 wins.
    assert_eq!(r.usage, usage(19, 34, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-haiku-4-5-20251001"));
    assert_no_opaque(&r);
}

// ---- vercel/ai recordings ----

fn strava_args() -> Value {
    json!({
        "website_path": "/home/user/pace-landing",
        "tasks": [{
            "description": "Today you post every run to Strava, but Strava does not answer the \
                            question: \"What should I do next after this run?\". It is a great log, \
                            but it is not adaptive.",
            "type": "feature",
            "passes": false,
        }],
    })
}

#[test]
fn vercel_quoted_tool_input_stream() {
    let (r, deltas) = streamed("vercel__anthropic-issue-11719-quoted-tool-input.chunks.txt");
    assert!(deltas.is_empty());
    assert_eq!(r.text(), "");
    // Fragments split inside the escaped quotes (`\\\"`) still make the right string.
    assert_eq!(
        calls(&r),
        vec![call(
            "toolu_01Cr31vcGoeeRgi3Eo5Ds8qN",
            "website_update",
            strava_args()
        )]
    );
    assert_eq!(r.stop, Stop::ToolUse);
    assert_eq!(r.usage, usage(912, 118, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-sonnet-4-5-20250929"));
    assert_no_opaque(&r);
}

#[test]
fn vercel_quoted_tool_input_whole() {
    let r = whole("vercel__anthropic-issue-11719-quoted-tool-input.json");
    assert_eq!(r.text(), "");
    assert_eq!(
        calls(&r),
        vec![call(
            "toolu_01JKBd25gEfr9ZpVvn8quK2v",
            "website_update",
            strava_args()
        )]
    );
    assert_eq!(r.stop, Stop::ToolUse);
    assert_eq!(r.usage, usage(912, 118, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-sonnet-4-5-20250929"));
    assert_no_opaque(&r);
}

#[test]
fn vercel_three_parallel_tool_calls() {
    let (r, deltas) = streamed("vercel__anthropic-issue-15652-false.chunks.txt");
    assert!(deltas.is_empty());
    assert_eq!(
        calls(&r),
        vec![
            call(
                "toolu_01LtEf4h1QW7KCKLsYMuhTNB",
                "searchDocs",
                json!({"query": "alpha"})
            ),
            call(
                "toolu_016tfZE7otAFSBjhc67wu189",
                "searchDocs",
                json!({"query": "beta"})
            ),
            call(
                "toolu_01XkU35z8BVWqqc9tijDuLrA",
                "searchDocs",
                json!({"query": "gamma"})
            ),
        ]
    );
    assert_eq!(r.stop, Stop::ToolUse);
    assert_eq!(r.usage, usage(798, 110, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-sonnet-4-5-20250929"));
    assert_no_opaque(&r);
}

#[test]
fn vercel_cache_write_max_tokens() {
    let (r, deltas) = streamed("vercel__anthropic-issue-5942-cache-write.chunks.txt");
    assert_eq!(deltas, vec!["OK"]);
    assert_eq!(r.text(), "OK");
    assert_eq!(r.stop, Stop::MaxTokens);
    // input_tokens 3 on the wire, plus the 18639 written to the cache
    assert_eq!(r.usage, usage(3 + 18639, 1, 0, 18639));
    assert_eq!(r.model.as_deref(), Some("claude-sonnet-4-6"));
    assert_no_opaque(&r);
}

#[test]
fn vercel_json_tool() {
    let (r, deltas) = streamed("vercel__anthropic-json-tool.2.chunks.txt");
    assert_eq!(deltas, vec!["I'll invoke", " the JSON response tool."]);
    assert_eq!(r.text(), "I'll invoke the JSON response tool.");
    assert_eq!(
        calls(&r),
        vec![call(
            "toolu_01KFbKqPYSuAKujiL6mTfzYA",
            "json",
            json!({"elements": [{"location": "San Francisco", "temperature": 58, "condition": "sunny"}]})
        )]
    );
    assert_eq!(r.stop, Stop::ToolUse);
    assert_eq!(r.usage, usage(849, 47, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-haiku-4-5-20251001"));
    assert_no_opaque(&r);
}

#[test]
fn vercel_message_delta_input_tokens() {
    let (r, deltas) = streamed("vercel__anthropic-message-delta-input-tokens.chunks.txt");
    assert_eq!(deltas, vec!["p", "ong"]);
    assert_eq!(r.text(), "pong");
    assert_eq!(r.stop, Stop::EndTurn);
    // message_delta's input_tokens (61) replaces message_start's (43).
    assert_eq!(r.usage, usage(61, 2, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-opus-4-5-20251101"));
    assert_no_opaque(&r);
}

#[test]
fn vercel_refusal_stream() {
    let (r, deltas) = streamed("vercel__anthropic-refusal.chunks.txt");
    assert!(deltas.is_empty());
    assert!(r.message.parts.is_empty());
    assert_eq!(r.stop, Stop::Refusal);
    assert_eq!(r.usage, usage(18, 5, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-fable-5"));
}

#[test]
fn vercel_refusal_whole() {
    let r = whole("vercel__anthropic-refusal.json");
    assert!(r.message.parts.is_empty());
    assert_eq!(r.stop, Stop::Refusal);
    assert_eq!(r.usage, usage(18, 5, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-fable-5"));
}

#[test]
fn vercel_text_stream() {
    let (r, deltas) = streamed("vercel__anthropic-text.chunks.txt");
    assert_eq!(deltas.len(), 6);
    assert_eq!(deltas[..2], ["Hello", "! I"]);
    assert_eq!(
        r.text(),
        "Hello! I'm doing well, thank you for asking. How are you doing today? Is there \
         anything I can help you with?"
    );
    assert!(r.tool_calls().is_empty());
    assert_eq!(r.stop, Stop::EndTurn);
    assert_eq!(r.usage, usage(12, 30, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-sonnet-4-5-20250929"));
    assert_no_opaque(&r);
}

#[test]
fn vercel_text_whole() {
    let r = whole("vercel__anthropic-text.json");
    assert_eq!(
        r.text(),
        "Hello! I'm doing well, thanks for asking. How are you doing today? Is there anything \
         I can help you with?"
    );
    assert!(r.tool_calls().is_empty());
    assert_eq!(r.stop, Stop::EndTurn);
    assert_eq!(r.usage, usage(12, 29, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-sonnet-4-5-20250929"));
    assert_no_opaque(&r);
}

#[test]
fn vercel_tool_no_args_stream() {
    let (r, deltas) = streamed("vercel__anthropic-tool-no-args.chunks.txt");
    assert_eq!(deltas, vec!["I'll update the issue list for", " you."]);
    assert_eq!(r.text(), "I'll update the issue list for you.");
    assert_eq!(
        calls(&r),
        vec![call(
            "toolu_01QE1WLsSVp5hy5Q3GmGTmjP",
            "updateIssueList",
            json!({})
        )]
    );
    // One empty input_json_delta: the arguments are the no-argument object, not "".
    assert_eq!(r.tool_calls()[0].arguments, "{}");
    assert_eq!(r.stop, Stop::ToolUse);
    assert_eq!(r.usage, usage(565, 48, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-sonnet-4-5-20250929"));
    assert_no_opaque(&r);
}

#[test]
fn vercel_tool_no_args_whole() {
    let r = whole("vercel__anthropic-tool-no-args.json");
    // Claude 3 Opus wrote its chain of thought as plain text in `<thinking>` tags: that is text,
    // not a thinking block, so it stays visible text and nothing opaque is kept.
    assert_eq!(
        r.text(),
        "<thinking>\nThe updateIssueList tool was provided in the list of available functions. \
         The tool has no required parameters, so it can be called without any additional \
         information needed from the user.\n</thinking>\n\nOkay, I will update the current \
         issue list:"
    );
    assert_eq!(
        calls(&r),
        vec![call(
            "toolu_01LRmxn9vGM1d2DZSDBowdZ1",
            "updateIssueList",
            json!({})
        )]
    );
    assert_eq!(r.tool_calls()[0].arguments, "{}");
    assert_eq!(r.stop, Stop::ToolUse);
    assert_eq!(r.usage, usage(602, 93, 0, 0));
    assert_eq!(r.model.as_deref(), Some("claude-3-opus-20240229"));
    assert_no_opaque(&r);
}

// ---- error bodies (both were answers with HTTP 400) ----

fn assert_bad_request(name: &str, says: &str) {
    let body = String::from_utf8(load(name)).expect("UTF-8");
    let e = classify(400, &HeaderMap::new(), &body);
    assert_eq!(e.kind(), "api_error");
    assert_eq!(e.status(), Some(400));
    assert!(!e.is_transient());
    assert_eq!(e.retry_after(), None);
    let message = e.to_string();
    assert!(message.contains(says), "{message}");
    assert!(message.contains("(invalid_request_error)"), "{message}");
    // The same body arriving with a 2xx status is still an error, never an empty answer.
    let e = anthropic()
        .parse(body.as_bytes())
        .expect_err("an error body");
    assert_eq!(e.kind(), "api_error");
    assert!(!e.is_transient());
}

#[test]
fn vercel_error_unexpected_tool_use_id() {
    assert_bad_request(
        "vercel__anthropic-issue-17366-error.json",
        "unexpected `tool_use_id` found in `tool_result` blocks: srvtoolu_issue_17366_invalid",
    );
}

#[test]
fn vercel_error_tool_use_without_result() {
    assert_bad_request(
        "vercel__anthropic-parallel-provider-client-tools.error.json",
        "`tool_use` ids were found without `tool_result` blocks immediately after: \
         toolu_issue8112_custom",
    );
}
