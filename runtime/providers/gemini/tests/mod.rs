//! The gemini wire style, through its codec: what goes out, and what an answer reads as.

use std::time::Duration;

use serde_json::json;

use super::opaque::{SIGNATURE, SKIP_SIGNATURE};
use super::request::{args_object, validates_signatures};
use super::streamed_call::{Step, json_path, slot};
use super::*;
use crate::providers::sse::assemble_bytes;
use crate::providers::{ToolsLevel, errors};
use crate::vocab::{
    Message, Opaque, Part, ResponseSchema, Role, Stop, Style, ToolCall, ToolChoice, ToolResult,
    ToolSpec, Usage,
};

const KEY: &str = "AIza-test-key-123";

fn endpoint() -> Endpoint {
    Endpoint {
        reads: Default::default(),
        provider: "gemini".into(),
        style: Style::Gemini,
        base_url: "https://generativelanguage.googleapis.com/v1beta".into(),
        key: Some(KEY.into()),
        tools_level: ToolsLevel::Native,
        timeout: Duration::from_secs(30),
        max_response_bytes: crate::providers::body::DEFAULT_MAX_RESPONSE_BYTES,
        max_concurrent_calls: crate::providers::DEFAULT_MAX_CONCURRENT_CALLS,
    }
}

fn request(req: &InferRequest) -> WireRequest {
    Gemini.request(req, &endpoint(), false)
}

fn wire_body(req: &InferRequest) -> Value {
    request(req).json()
}

fn simple() -> InferRequest {
    InferRequest {
        model: "gemini-2.5-flash".into(),
        messages: vec![Message::user("hello")],
        ..Default::default()
    }
}

fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "Weather for a city".into(),
        parameters: json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        }),
    }
}

fn gemini_call(id: &str, name: &str, args: &str, data: Value) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.into(),
        opaque: Some(Opaque {
            style: Style::Gemini,
            data,
        }),
    }
}

fn result(call_id: &str, name: &str, content: &str, is_error: bool) -> Part {
    Part::ToolResult(ToolResult {
        call_id: call_id.into(),
        name: name.into(),
        content: content.into(),
        is_error,
    })
}

fn parse(body: Value) -> Result<Inferred, ProviderError> {
    Gemini.parse(body.to_string().as_bytes())
}

fn stream(events: &[Value]) -> (Result<Inferred, ProviderError>, Vec<String>) {
    let bytes: String = events
        .iter()
        .map(|e| format!("data: {e}\r\n\r\n"))
        .collect();
    assemble_bytes(bytes.as_bytes(), Gemini.assembler())
}

fn answer(parts: Value, finish: &str) -> Value {
    json!({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}]})
}

mod requests;
mod responses;
mod schemas;
