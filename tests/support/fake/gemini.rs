//! Google Gemini (`models/{model}:generateContent` and `:streamGenerateContent?alt=sse`), shaped
//! like the recorded traffic in `tests/data/providers/gemini/`: every event a whole
//! `GenerateContentResponse`, `\r\n\r\n` between events, no end marker; a `functionCall` arrives
//! whole (parallel calls as several parts of one event); `finishReason` is `STOP` even after
//! calls; full `usageMetadata` on the last event (an empty text part), partial before.

use axum::http::HeaderMap;
use serde_json::{Value, json};

use super::reply::Reply;
use super::wire::{Ctx, Frame, Stream, Wire, is_rate_limit};

pub(crate) struct Gemini;

pub const MODELS: [&str; 2] = ["gemini-fake-1", "gemini-fake-2"];

fn finish_reason(r: &Reply) -> String {
    match r.stop_reason() {
        "end_turn" | "tool_use" | "stop_sequence" => "STOP".into(),
        "max_tokens" => "MAX_TOKENS".into(),
        "refusal" | "content_filter" => "SAFETY".into(),
        other => other.into(),
    }
}

fn status_name(code: u16) -> &'static str {
    match code {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

/// The Gemini code of a fault kind: rate limits 429, `api_error` 500, anything else (overload) 503.
fn kind_code(kind: &str) -> u16 {
    if is_rate_limit(kind) {
        429
    } else if kind.contains("api_error") || kind == "INTERNAL" {
        500
    } else {
        503
    }
}

/// The reply's content parts: thought, then text and calls. The signature rides on the first
/// functionCall part, else on the text part (an empty one if there is no text).
fn parts(r: &Reply) -> (Option<Value>, Vec<Value>) {
    let thought = r
        .reasoning
        .as_ref()
        .map(|(t, _)| json!({"text": t, "thought": true}));
    let mut rest = Vec::new();
    if !r.text.is_empty() {
        rest.push(json!({"text": r.text}));
    }
    rest.extend(r.calls.iter().map(call_part));
    if let Some((_, sig)) = &r.reasoning {
        if rest.is_empty() {
            rest.push(json!({"text": ""}));
        }
        // With calls, the documented place is the first functionCall part.
        let at = usize::from(!r.text.is_empty() && !r.calls.is_empty());
        rest[at]["thoughtSignature"] = json!(sig);
    }
    (thought, rest)
}

fn call_part(c: &super::reply::Call) -> Value {
    let mut call = json!({"name": c.name, "args": c.args});
    if !c.id.is_empty() {
        call["id"] = json!(c.id);
    }
    json!({"functionCall": call})
}

fn response(parts: Vec<Value>, finish: Option<String>, usage: Value, cx: &Ctx) -> Value {
    let mut candidate = json!({"content": {"parts": parts, "role": "model"}, "index": 0});
    if let Some(f) = finish {
        candidate["finishReason"] = json!(f);
    }
    json!({
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": cx.model,
        "responseId": cx.id(""),
    })
}

fn usage(r: &Reply) -> Value {
    json!({
        "promptTokenCount": r.usage.0,
        "candidatesTokenCount": r.usage.1,
        "totalTokenCount": r.usage.0.saturating_add(r.usage.1),
    })
}

impl Wire for Gemini {
    fn name(&self) -> &'static str {
        "gemini"
    }

    fn sep(&self) -> &'static str {
        "\r\n\r\n"
    }

    fn has_key(&self, headers: &HeaderMap, query: &str) -> bool {
        headers.contains_key("x-goog-api-key") || query.split('&').any(|p| p.starts_with("key="))
    }

    fn key_header(&self) -> &'static str {
        "x-goog-api-key"
    }

    fn headers(&self, _seq: u64) -> Vec<(&'static str, String)> {
        vec![("server", "scaffolding on HTTPServer2".into())]
    }

    fn models(&self) -> Value {
        let models: Vec<Value> = MODELS
            .iter()
            .map(|id| {
                json!({
                    "name": format!("models/{id}"),
                    "version": "001",
                    "displayName": id.replace('-', " "),
                    "inputTokenLimit": 1_048_576,
                    "outputTokenLimit": 65_536,
                    "supportedGenerationMethods": ["generateContent", "countTokens"],
                })
            })
            .collect();
        json!({"models": models})
    }

    fn error(&self, status: u16, kind: Option<&str>, message: &str, retry: Option<&str>) -> Value {
        let mut error = json!({
            "code": status,
            "message": message,
            "status": kind.filter(|k| k.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
                .unwrap_or(status_name(status)),
        });
        // Gemini puts the wait in the body, not in a header.
        if let Some(secs) = retry {
            error["details"] = json!([{
                "@type": "type.googleapis.com/google.rpc.RetryInfo",
                "retryDelay": format!("{secs}s"),
            }]);
        }
        json!({ "error": error })
    }

    fn error_status(&self, kind: &str) -> u16 {
        kind_code(kind)
    }

    fn message(&self, r: &Reply, cx: &Ctx) -> Value {
        let (thought, rest) = parts(r);
        let all: Vec<Value> = thought.into_iter().chain(rest).collect();
        response(all, Some(finish_reason(r)), usage(r), cx)
    }

    fn stream(&self, r: &Reply, cx: &Ctx) -> Stream {
        let (thought, rest) = parts(r);
        let partial = json!({"promptTokenCount": r.usage.0, "totalTokenCount": r.usage.0});
        // One event per thought, per text word, and one for all the calls.
        let mut events: Vec<Vec<Value>> = thought.into_iter().map(|t| vec![t]).collect();
        let mut rest = rest.into_iter();
        if !r.text.is_empty() {
            let first = rest.next().unwrap();
            for (i, w) in r.text_deltas().into_iter().enumerate() {
                let mut part = json!({"text": w});
                if i == 0
                    && let Some(sig) = first.get("thoughtSignature")
                {
                    part["thoughtSignature"] = sig.clone();
                }
                events.push(vec![part]);
            }
        }
        let calls: Vec<Value> = rest.collect();
        if !calls.is_empty() {
            events.push(calls);
        }
        let head = events
            .into_iter()
            .map(|p| Frame::Data(response(p, None, partial.clone(), cx)))
            .collect();
        // As recorded after calls: a last event with an empty text part, the finish reason and
        // the full usage.
        let last = response(
            vec![json!({"text": ""})],
            Some(finish_reason(r)),
            usage(r),
            cx,
        );
        let tail = vec![Frame::Data(last)];
        Stream { head, tail }
    }

    fn stream_error(&self, kind: &str, message: &str) -> Frame {
        let code = kind_code(kind);
        Frame::Data(
            json!({"error": {"code": code, "message": message, "status": status_name(code)}}),
        )
    }

    fn malformed(&self) -> Frame {
        Frame::Raw(
            "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"cut here\r\n\r\n"
                .into(),
        )
    }
}
