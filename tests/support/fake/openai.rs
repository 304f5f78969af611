//! OpenAI chat completions (`POST /v1/chat/completions`), shaped like the recorded traffic in
//! `tests/data/providers/openai/`: data-only SSE ending in `data: [DONE]`; a tool call opens with
//! `{index, id, type, function: {name, arguments: ""}}` and continues with argument fragments;
//! usage only in a last `choices: []` chunk, and only when `stream_options.include_usage` is set
//! (every other chunk then carries `"usage": null`).

use axum::http::HeaderMap;
use serde_json::{Value, json};

use super::reply::{Reply, arg_fragments, words};
use super::wire::{Ctx, Frame, Stream, Wire};

pub(crate) struct OpenAi;

pub const MODELS: [&str; 2] = ["gpt-fake-1", "gpt-fake-2"];

const CREATED: u64 = 1_700_000_000;

fn finish_reason(r: &Reply) -> String {
    match r.stop_reason() {
        "end_turn" | "stop_sequence" => "stop".into(),
        "tool_use" => "tool_calls".into(),
        "max_tokens" => "length".into(),
        "refusal" | "content_filter" => "content_filter".into(),
        other => other.into(),
    }
}

fn usage(r: &Reply) -> Value {
    json!({
        "prompt_tokens": r.usage.0,
        "completion_tokens": r.usage.1,
        "total_tokens": r.usage.0.saturating_add(r.usage.1),
        "prompt_tokens_details": {"cached_tokens": r.cache_read},
    })
}

fn include_usage(cx: &Ctx) -> bool {
    cx.req.pointer("/stream_options/include_usage") == Some(&Value::Bool(true))
}

impl Wire for OpenAi {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn has_key(&self, headers: &HeaderMap, _query: &str) -> bool {
        headers.contains_key("authorization")
    }

    fn key_header(&self) -> &'static str {
        "authorization"
    }

    fn headers(&self, seq: u64) -> Vec<(&'static str, String)> {
        vec![("x-request-id", format!("req_fake{seq:024}"))]
    }

    fn models(&self) -> Value {
        let data: Vec<Value> = MODELS
            .iter()
            .map(|id| json!({"id": id, "object": "model", "created": CREATED, "owned_by": "fake"}))
            .collect();
        json!({"object": "list", "data": data})
    }

    fn error(&self, status: u16, kind: Option<&str>, message: &str, _: Option<&str>) -> Value {
        let (typ, code) = match status {
            401 => ("invalid_request_error", json!("invalid_api_key")),
            404 => ("invalid_request_error", json!("model_not_found")),
            429 => ("requests", json!("rate_limit_exceeded")),
            s if s >= 500 => ("server_error", Value::Null),
            _ => ("invalid_request_error", Value::Null),
        };
        json!({"error": {
            "message": message,
            "type": kind.unwrap_or(typ),
            "param": null,
            "code": code,
        }})
    }

    fn message(&self, r: &Reply, cx: &Ctx) -> Value {
        let mut message = json!({
            "role": "assistant",
            "content": if r.text.is_empty() { Value::Null } else { json!(r.text) },
            "refusal": null,
            "annotations": [],
        });
        if let Some((thinking, _)) = &r.reasoning {
            message["reasoning_content"] = json!(thinking);
        }
        if !r.calls.is_empty() {
            let calls: Vec<Value> = r
                .calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    json!({
                        "id": cx.call_id(c, i, "call_"),
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.args_text()},
                    })
                })
                .collect();
            message["tool_calls"] = json!(calls);
        }
        json!({
            "id": cx.id("chatcmpl-"),
            "object": "chat.completion",
            "created": CREATED,
            "model": cx.model,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": finish_reason(r),
            }],
            "usage": usage(r),
            "system_fingerprint": "fp_fake",
        })
    }

    fn stream(&self, r: &Reply, cx: &Ctx) -> Stream {
        let with_usage = include_usage(cx);
        let chunk = |delta: Value, finish: Value| {
            let mut c = json!({
                "id": cx.id("chatcmpl-"),
                "object": "chat.completion.chunk",
                "created": CREATED,
                "model": cx.model,
                "system_fingerprint": "fp_fake",
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            });
            if with_usage {
                c["usage"] = Value::Null;
            }
            Frame::Data(c)
        };
        let first_content = if r.calls.is_empty() {
            json!("")
        } else {
            Value::Null
        };
        let mut head = vec![chunk(
            json!({"role": "assistant", "content": first_content, "refusal": null}),
            Value::Null,
        )];
        if let Some((thinking, _)) = &r.reasoning {
            for w in words(thinking) {
                head.push(chunk(
                    json!({"content": null, "reasoning_content": w}),
                    Value::Null,
                ));
            }
        }
        for w in r.text_deltas() {
            head.push(chunk(json!({"content": w}), Value::Null));
        }
        for (i, c) in r.calls.iter().enumerate() {
            let open = json!({"tool_calls": [{
                "index": i,
                "id": cx.call_id(c, i, "call_"),
                "type": "function",
                "function": {"name": c.name, "arguments": ""},
            }]});
            head.push(chunk(open, Value::Null));
            for f in arg_fragments(c) {
                let more = json!({"tool_calls": [{"index": i, "function": {"arguments": f}}]});
                head.push(chunk(more, Value::Null));
            }
        }
        let mut tail = vec![chunk(json!({}), json!(finish_reason(r)))];
        if with_usage {
            tail.push(Frame::Data(json!({
                "id": cx.id("chatcmpl-"),
                "object": "chat.completion.chunk",
                "created": CREATED,
                "model": cx.model,
                "system_fingerprint": "fp_fake",
                "choices": [],
                "usage": usage(r),
            })));
        }
        tail.push(Frame::Raw("data: [DONE]\n\n".into()));
        Stream { head, tail }
    }

    fn stream_error(&self, kind: &str, message: &str) -> Frame {
        Frame::Data(
            json!({"error": {"message": message, "type": kind, "param": null, "code": null}}),
        )
    }

    fn malformed(&self) -> Frame {
        Frame::Raw(
            "data: {\"id\":\"chatcmpl-fake\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"cut here\n\n"
                .into(),
        )
    }
}
