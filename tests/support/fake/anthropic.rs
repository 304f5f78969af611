//! Anthropic Messages API (`POST /v1/messages`), shaped like the recorded traffic in
//! `tests/data/providers/anthropic/`: `event:` + `data:` SSE, one content block per thinking /
//! text / tool call, `ping` after `message_start`, usage split between `message_start` (input)
//! and `message_delta` (cumulative output).

use axum::http::HeaderMap;
use serde_json::{Value, json};

use super::reply::{Reply, arg_fragments};
use super::wire::{Ctx, Frame, Stream, Wire, is_overload, is_rate_limit};

pub(crate) struct Anthropic;

pub const MODELS: [&str; 2] = ["claude-fake-1", "claude-fake-2"];

fn stop_reason(r: &Reply) -> String {
    match r.stop_reason() {
        "content_filter" => "refusal".into(),
        other => other.into(),
    }
}

/// The matched stop sequence: the request's first one, when the reply stops on a sequence.
fn stop_sequence(r: &Reply, cx: &Ctx) -> Value {
    if r.stop_reason() == "stop_sequence" {
        json!(cx.req_str("/stop_sequences/0").unwrap_or("\n\nHuman:"))
    } else {
        Value::Null
    }
}

/// `r`'s usage as Anthropic reports it: the tokens read from the cache apart from the input's.
fn usage(r: &Reply, output: u64) -> Value {
    json!({
        "input_tokens": r.usage.0.saturating_sub(r.cache_read),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": r.cache_read,
        "output_tokens": output,
    })
}

fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

impl Wire for Anthropic {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn has_key(&self, headers: &HeaderMap, _query: &str) -> bool {
        headers.contains_key("x-api-key")
    }

    fn key_header(&self) -> &'static str {
        "x-api-key"
    }

    fn headers(&self, seq: u64) -> Vec<(&'static str, String)> {
        vec![("request-id", format!("req_01Fake{seq:018}"))]
    }

    fn models(&self) -> Value {
        let data: Vec<Value> = MODELS
            .iter()
            .map(|id| {
                json!({
                    "type": "model",
                    "id": id,
                    "display_name": id.replace('-', " "),
                    "created_at": "2025-01-01T00:00:00Z",
                })
            })
            .collect();
        json!({"data": data, "has_more": false, "first_id": MODELS[0], "last_id": MODELS[1]})
    }

    fn error(&self, status: u16, kind: Option<&str>, message: &str, _: Option<&str>) -> Value {
        json!({
            "type": "error",
            "error": {"type": kind.unwrap_or(error_type(status)), "message": message},
            "request_id": "req_01Fake000000000000000000",
        })
    }

    fn error_status(&self, kind: &str) -> u16 {
        if is_overload(kind) {
            529
        } else if is_rate_limit(kind) {
            429
        } else {
            500
        }
    }

    fn message(&self, r: &Reply, cx: &Ctx) -> Value {
        let mut content = Vec::new();
        if let Some((thinking, signature)) = &r.reasoning {
            content.push(json!({"type": "thinking", "thinking": thinking, "signature": signature}));
        }
        if !r.text.is_empty() {
            content.push(json!({"type": "text", "text": r.text}));
        }
        for (i, c) in r.calls.iter().enumerate() {
            content.push(json!({
                "type": "tool_use",
                "id": cx.call_id(c, i, "toolu_"),
                "name": c.name,
                "input": c.args,
            }));
        }
        json!({
            "id": cx.id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": cx.model,
            "content": content,
            "stop_reason": stop_reason(r),
            "stop_sequence": stop_sequence(r, cx),
            "usage": usage(r, r.usage.1),
        })
    }

    fn stream(&self, r: &Reply, cx: &Ctx) -> Stream {
        let mut head = vec![
            Frame::Event(
                "message_start",
                json!({"type": "message_start", "message": {
                    "id": cx.id("msg_"),
                    "type": "message",
                    "role": "assistant",
                    "model": cx.model,
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": usage(r, 1),
                }}),
            ),
            Frame::Event("ping", json!({"type": "ping"})),
        ];
        let mut index = 0;
        let mut block = |start: Value, deltas: Vec<Value>, head: &mut Vec<Frame>| {
            head.push(Frame::Event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": start}),
            ));
            for delta in deltas {
                head.push(Frame::Event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index, "delta": delta}),
                ));
            }
            head.push(Frame::Event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
            index += 1;
        };
        if let Some((thinking, signature)) = &r.reasoning {
            let mut deltas: Vec<Value> = super::reply::words(thinking)
                .into_iter()
                .map(|w| json!({"type": "thinking_delta", "thinking": w}))
                .collect();
            deltas.push(json!({"type": "signature_delta", "signature": signature}));
            let start = json!({"type": "thinking", "thinking": "", "signature": ""});
            block(start, deltas, &mut head);
        }
        if !r.text.is_empty() {
            let deltas = r
                .text_deltas()
                .into_iter()
                .map(|w| json!({"type": "text_delta", "text": w}))
                .collect();
            block(json!({"type": "text", "text": ""}), deltas, &mut head);
        }
        for (i, c) in r.calls.iter().enumerate() {
            // Like the real API: an empty fragment first, then pieces cut anywhere.
            let deltas = std::iter::once(String::new())
                .chain(arg_fragments(c))
                .map(|f| json!({"type": "input_json_delta", "partial_json": f}))
                .collect();
            let start = json!({
                "type": "tool_use",
                "id": cx.call_id(c, i, "toolu_"),
                "name": c.name,
                "input": {},
            });
            block(start, deltas, &mut head);
        }
        let tail = vec![
            Frame::Event(
                "message_delta",
                json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason(r), "stop_sequence": stop_sequence(r, cx)},
                    "usage": {"output_tokens": r.usage.1},
                }),
            ),
            Frame::Event("message_stop", json!({"type": "message_stop"})),
        ];
        Stream { head, tail }
    }

    fn stream_error(&self, kind: &str, message: &str) -> Frame {
        Frame::Event(
            "error",
            json!({"type": "error", "error": {"type": kind, "message": message}}),
        )
    }

    fn malformed(&self) -> Frame {
        Frame::Raw(
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\
             \"delta\":{\"type\":\"text_delta\",\"text\":\"cut here\n\n"
                .into(),
        )
    }
}
