//! The Anthropic Messages API wire style: `POST {base}/messages`, whole or streamed over SSE.
//!
//! Mapping decisions, both ways:
//! - The API takes one top-level `system` string, so `req.system` and the text of every
//!   `Role::System` message are joined into it (blank line between).
//! - Messages must alternate user / assistant: `Role::Tool` messages become user messages of
//!   `tool_result` blocks, and neighbours that land on the same wire role are merged into one
//!   message. Inside a merged message the API's ordering rules are restored: `tool_result` blocks
//!   first in a user message, `thinking` / `redacted_thinking` blocks first in an assistant one.
//! - Thinking blocks are kept whole (signature included) as [`Opaque`] data on
//!   [`Part::Reasoning`] and sent back byte for byte; reasoning from another style is dropped.
//! - Stop reasons: see `stop_from_wire`. Usage: see `apply_usage`; the API does not count
//!   thinking tokens apart from output tokens, so `reasoning` stays 0.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use super::{Assembler, Codec, Endpoint, ProviderError, WireRequest, errors, merge_extra};
use crate::vocab::{
    FileRef, InferRequest, Inferred, Message, Opaque, Part, Role, Stop, Style, ToolCall,
    ToolChoice, ToolResult, ToolSpec, Usage,
};

/// The API version colony speaks; the request and response shapes below are this version's.
const API_VERSION: &str = "2023-06-01";

/// `max_tokens` is mandatory on this API; this is used when the request leaves it unset.
const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The models endpoint pages 20 ids at a time by default; one page of the maximum size covers
/// any real account, so no paging is needed.
const MODELS_PAGE: u32 = 1000;

pub struct Anthropic;

impl Codec for Anthropic {
    fn request(&self, req: &InferRequest, ep: &Endpoint, stream: bool) -> WireRequest {
        let mut body = request_body(req, stream);
        merge_extra(&mut body, req.extra.as_ref());
        WireRequest::with_json(format!("{}/messages", ep.base()), headers(ep), &body)
    }

    fn parse(&self, body: &[u8]) -> Result<Inferred, ProviderError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ProviderError::Parse(format!("the response is not JSON: {e}")))?;
        if value.get("type").and_then(Value::as_str) == Some("error") {
            // An error body that came with a 2xx status (seen behind proxies).
            return Err(errors::classify_stream_error(&value));
        }
        parse_message(&value)
    }

    fn assembler(&self) -> Box<dyn Assembler> {
        Box::new(StreamAssembler::default())
    }

    fn models_request(&self, ep: &Endpoint) -> WireRequest {
        WireRequest {
            url: format!("{}/models?limit={MODELS_PAGE}", ep.base()),
            headers: headers(ep),
            body: Vec::new(),
        }
    }

    fn parse_models(&self, body: &Value) -> Result<Vec<String>, String> {
        Ok(super::list_field(body, "data", "id")?
            .into_iter()
            .map(str::to_string)
            .collect())
    }
}

// ---------------------------------------------------------------------------------------------
// Outgoing

/// The same for every call. The key header only when a key is set: a keyless local proxy must
/// not receive an empty one.
fn headers(ep: &Endpoint) -> Vec<(String, String)> {
    let mut headers = Vec::new();
    if let Some(key) = ep.key.as_deref().filter(|k| !k.is_empty()) {
        headers.push(("x-api-key".to_string(), key.to_string()));
    }
    headers.push(("anthropic-version".to_string(), API_VERSION.to_string()));
    headers.push(("content-type".to_string(), "application/json".to_string()));
    headers
}

/// The body before `extra` is merged over it.
fn request_body(req: &InferRequest, stream: bool) -> Value {
    let mut body = json!({
        "model": req.model,
        "max_tokens": req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
    });
    if let Some(system) = system_prompt(req) {
        body["system"] = json!(system);
    }
    body["messages"] = Value::Array(wire_messages(&req.messages));
    if let Some(t) = req.temperature {
        body["temperature"] = json!(t);
    }
    if !req.stop_sequences.is_empty() {
        body["stop_sequences"] = json!(req.stop_sequences);
    }
    if !req.tools.is_empty() {
        body["tools"] = Value::Array(req.tools.iter().map(tool_spec).collect());
    }
    if let Some(choice) = tool_choice(req) {
        body["tool_choice"] = choice;
    }
    if stream {
        body["stream"] = json!(true);
    }
    body
}

/// A tool offered to the model. The API rejects an `input_schema` that is not an object, so a
/// tool declared without parameters (`null`) is offered as taking none.
fn tool_spec(tool: &ToolSpec) -> Value {
    let schema = if tool.parameters.is_object() {
        tool.parameters.clone()
    } else {
        json!({"type": "object", "properties": {}})
    };
    json!({"name": tool.name, "description": tool.description, "input_schema": schema})
}

/// `req.system` plus the text of any `Role::System` messages: the API accepts only one prompt.
fn system_prompt(req: &InferRequest) -> Option<String> {
    let pieces: Vec<String> = req
        .system
        .iter()
        .cloned()
        .chain(
            req.messages
                .iter()
                .filter(|m| m.role == Role::System)
                .map(Message::text),
        )
        .filter(|s| !s.is_empty())
        .collect();
    (!pieces.is_empty()).then(|| pieces.join("\n\n"))
}

/// `auto` is the API's default, so it is only spelled out when tools are offered; `none` without
/// tools says nothing either. A forced choice without tools is sent anyway: the API's refusal is
/// a clearer report of that mistake than silently ignoring it.
fn tool_choice(req: &InferRequest) -> Option<Value> {
    match &req.tool_choice {
        ToolChoice::Auto | ToolChoice::None if req.tools.is_empty() => None,
        ToolChoice::Auto => Some(json!({"type": "auto"})),
        ToolChoice::None => Some(json!({"type": "none"})),
        ToolChoice::Required => Some(json!({"type": "any"})),
        ToolChoice::Tool(name) => Some(json!({"type": "tool", "name": name})),
    }
}

/// One wire message being built; `role` is `user` or `assistant`.
struct WireMessage {
    role: &'static str,
    content: Vec<Value>,
}

/// The neutral conversation as alternating user / assistant messages.
fn wire_messages(messages: &[Message]) -> Vec<Value> {
    let mut out: Vec<WireMessage> = Vec::new();
    for message in messages {
        let role = match message.role {
            Role::System => continue,
            Role::User | Role::Tool => "user",
            Role::Assistant => "assistant",
        };
        let mut content: Vec<Value> = Vec::with_capacity(message.parts.len());
        for part in &message.parts {
            let Some(block) = block_for(part) else {
                continue;
            };
            // A file in a tool message belongs to the result before it: it rides inside that
            // tool_result's content, which takes image and document blocks.
            if matches!(part, Part::File(_))
                && let Some(result) = content.last_mut()
                && result["type"] == "tool_result"
            {
                nest_in_result(result, block);
                continue;
            }
            content.push(block);
        }
        // The API rejects a message with no content; a message of dropped parts simply vanishes.
        if content.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.role == role => last.content.extend(content),
            _ => out.push(WireMessage { role, content }),
        }
    }
    out.into_iter()
        .map(|mut m| {
            // Stable: the relative order of blocks of the same rank is kept.
            m.content.sort_by_key(|b| block_rank(m.role, b));
            json!({"role": m.role, "content": m.content})
        })
        .collect()
}

/// Where a block must sit in its message: tool results lead a user message (the API rejects
/// text before them), thinking leads an assistant message.
fn block_rank(role: &str, block: &Value) -> u8 {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
    match (role, kind) {
        ("user", "tool_result") => 0,
        ("assistant", "thinking" | "redacted_thinking") => 0,
        _ => 1,
    }
}

/// The wire block for one part, or `None` for what this style cannot or must not carry.
fn block_for(part: &Part) -> Option<Value> {
    match part {
        // The API rejects empty text blocks.
        Part::Text { text, .. } if text.is_empty() => None,
        Part::Text { text, .. } => Some(json!({"type": "text", "text": text})),
        Part::Reasoning { opaque, .. } => reasoning_block(opaque.as_ref()),
        Part::ToolCall(call) => Some(tool_use_block(call)),
        Part::ToolResult(result) => Some(tool_result_block(result)),
        Part::File(file) => file_block(file),
    }
}

/// An image block (jpeg, png, gif, webp) or a document block (pdf), base64, under the media
/// type the file renderer settled on. Anything else was turned into text before the codec.
fn file_block(file: &FileRef) -> Option<Value> {
    let data = STANDARD.encode(file.data.as_deref()?);
    let source = json!({"type": "base64", "media_type": file.content_type, "data": data});
    Some(if file.content_type == "application/pdf" {
        json!({"type": "document", "source": source, "title": file.name})
    } else {
        json!({"type": "image", "source": source})
    })
}

/// Adds `block` to a tool_result's content, turning text content into a text block first.
fn nest_in_result(result: &mut Value, block: Value) {
    let mut content = match result.get_mut("content").map(Value::take) {
        Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
        Some(Value::Array(blocks)) => blocks,
        _ => Vec::new(),
    };
    content.push(block);
    result["content"] = Value::Array(content);
}

/// A thinking block exactly as it came, when it came from this style. Reasoning without it (or
/// from another style) is dropped: the API verifies thinking by its signature.
fn reasoning_block(opaque: Option<&Opaque>) -> Option<Value> {
    let opaque = opaque.filter(|o| o.style == Style::Anthropic)?;
    opaque.data.is_object().then(|| opaque.data.clone())
}

/// `input` must be an object; arguments that do not decode to one are sent as `{}` so that the
/// conversation stays valid (the call's result already tells the model what went wrong).
fn tool_use_block(call: &ToolCall) -> Value {
    let input = call
        .decoded()
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input})
}

/// `content` is optional on the wire and an empty one is left out; `is_error` only when true.
fn tool_result_block(result: &ToolResult) -> Value {
    let mut block = json!({"type": "tool_result", "tool_use_id": result.call_id});
    if !result.content.is_empty() {
        block["content"] = json!(result.content);
    }
    if result.is_error {
        block["is_error"] = json!(true);
    }
    block
}

// ---------------------------------------------------------------------------------------------
// Incoming: shared pieces

/// The neutral stop for a wire `stop_reason`.
///
/// `pause_turn` (a server-tool loop paused) ends the turn: colony runs no server tools, and the
/// answer so far is complete as far as it is concerned. `model_context_window_exceeded` is a
/// truncation like `max_tokens`. An unknown or missing reason is read from the content: tool use
/// if the answer holds calls, otherwise an ordinary end of turn.
fn stop_from_wire(reason: Option<&str>, has_calls: bool) -> Stop {
    match reason {
        Some("end_turn" | "pause_turn") => Stop::EndTurn,
        Some("tool_use") => Stop::ToolUse,
        Some("max_tokens" | "model_context_window_exceeded") => Stop::MaxTokens,
        Some("stop_sequence") => Stop::StopSequence,
        Some("refusal") => Stop::Refusal,
        _ if has_calls => Stop::ToolUse,
        _ => Stop::EndTurn,
    }
}

/// Overwrites each usage field the wire object carries as a number: `input_tokens`,
/// `output_tokens`, `cache_read_input_tokens` and `cache_creation_input_tokens` (cache write).
/// Stream usage is cumulative, so the latest value of each field wins; absent and `null` fields
/// keep the value seen before.
/// `false` when a field holds something that is no count: the usage cannot be read
/// ([`super::token_counts`]).
fn apply_usage(wire: Option<&Value>, usage: &mut Usage) -> bool {
    let Some(wire) = wire else { return true };
    const FIELDS: [&str; 4] = [
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ];
    if super::token_counts::garbled(wire, &FIELDS) {
        return false;
    }
    for (name, field) in FIELDS.into_iter().zip([
        &mut usage.input,
        &mut usage.output,
        &mut usage.cache_read,
        &mut usage.cache_write,
    ]) {
        if let Some(n) = wire.get(name).and_then(super::token_counts::count) {
            *field = n;
        }
    }
    true
}

/// The wire counts as the neutral [`Usage`] reads them: Anthropic's `input_tokens` leaves out
/// the tokens read from or written to the cache, which every other style counts as input.
fn neutral_usage(wire: Usage) -> Usage {
    Usage {
        input: wire.input + wire.cache_read + wire.cache_write,
        ..wire
    }
}

/// A tool call from a block's `input` object, serialised compactly.
fn tool_call(id: &str, name: &str, input: Option<&Value>) -> ToolCall {
    let arguments = match input {
        None | Some(Value::Null) => "{}".to_string(),
        Some(v) => v.to_string(),
    };
    ToolCall {
        id: id.to_string(),
        name: name.to_string(),
        arguments,
        opaque: None,
    }
}

/// A thinking or redacted-thinking block as reasoning: the shown text, and the block itself to
/// send back.
fn reasoning_part(block: &Value) -> Part {
    let text = block
        .get("thinking")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    Part::Reasoning {
        text,
        opaque: Some(Opaque {
            style: Style::Anthropic,
            data: block.clone(),
        }),
    }
}

fn str_field<'a>(v: &'a Value, key: &str, what: &str) -> Result<&'a str, ProviderError> {
    v.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ProviderError::Parse(format!("{what} has no string `{key}`")))
}

// ---------------------------------------------------------------------------------------------
// Incoming: whole responses

fn parse_message(value: &Value) -> Result<Inferred, ProviderError> {
    let content = value
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| ProviderError::Parse("the message has no `content` array".into()))?;
    let mut parts = Vec::new();
    for block in content {
        if let Some(part) = part_from_block(block)? {
            parts.push(part);
        }
    }
    let has_calls = parts.iter().any(|p| matches!(p, Part::ToolCall(_)));
    let mut usage = Usage::default();
    let usage = match apply_usage(value.get("usage"), &mut usage) {
        true => neutral_usage(usage),
        false => Usage::default(),
    };
    Ok(Inferred {
        message: Message::new(Role::Assistant, parts),
        stop: stop_from_wire(value.get("stop_reason").and_then(Value::as_str), has_calls),
        usage,
        model: value
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// One content block of a whole message. Block types colony does not use (server tool use and
/// results, documents) are skipped.
fn part_from_block(block: &Value) -> Result<Option<Part>, ProviderError> {
    let kind = str_field(block, "type", "a content block")?;
    Ok(match kind {
        "text" => {
            let text = str_field(block, "text", "a text block")?;
            (!text.is_empty()).then(|| Part::text(text))
        }
        "tool_use" => Some(Part::ToolCall(tool_call(
            str_field(block, "id", "a tool_use block")?,
            str_field(block, "name", "a tool_use block")?,
            block.get("input"),
        ))),
        "thinking" | "redacted_thinking" => Some(reasoning_part(block)),
        _ => None,
    })
}

// ---------------------------------------------------------------------------------------------
// Incoming: streams

/// One content block of a stream, by the wire `index` it was opened with.
struct StreamBlock {
    index: u64,
    kind: BlockKind,
}

enum BlockKind {
    Text(String),
    Tool {
        id: String,
        name: String,
        /// The `input` of `content_block_start`: used when no fragment follows.
        start_input: Value,
        /// The concatenated `input_json_delta` fragments.
        json: String,
    },
    /// The whole `thinking` / `redacted_thinking` block, grown by its deltas.
    Thinking(Map<String, Value>),
    /// A block type colony does not use; its deltas are ignored.
    Other,
}

#[derive(Default)]
struct StreamAssembler {
    model: Option<String>,
    blocks: Vec<StreamBlock>,
    usage: Usage,
    /// A usage field held something that is no count: the usage is not counted.
    garbled_usage: bool,
    stop_reason: Option<String>,
    /// `message_stop` arrived.
    ended: bool,
}

impl Assembler for StreamAssembler {
    fn event(
        &mut self,
        event: &str,
        data: &str,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), ProviderError> {
        let payload: Value = serde_json::from_str(data).map_err(|e| {
            ProviderError::Parse(format!("the `{event}` event's data is not JSON: {e}"))
        })?;
        // The payload names its own type; the SSE event name is the same word when present.
        let kind = payload.get("type").and_then(Value::as_str).unwrap_or(event);
        match kind {
            "message_start" => self.message_start(&payload),
            "content_block_start" => self.block_start(&payload, on_text)?,
            "content_block_delta" => self.block_delta(&payload, on_text)?,
            "content_block_stop" => self.block_stop(&payload)?,
            "message_delta" => self.message_delta(&payload),
            "message_stop" => self.ended = true,
            "error" => return Err(errors::classify_stream_error(&payload)),
            // `ping`, and event types added after this was written, carry nothing colony uses.
            _ => {}
        }
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<Inferred, ProviderError> {
        if !self.ended {
            return Err(ProviderError::Fetch(
                "the stream ended before message_stop".into(),
            ));
        }
        let parts: Vec<Part> = self.blocks.into_iter().filter_map(into_part).collect();
        let has_calls = parts.iter().any(|p| matches!(p, Part::ToolCall(_)));
        Ok(Inferred {
            message: Message::new(Role::Assistant, parts),
            stop: stop_from_wire(self.stop_reason.as_deref(), has_calls),
            usage: match self.garbled_usage {
                false => neutral_usage(self.usage),
                true => Usage::default(),
            },
            model: self.model,
        })
    }
}

impl StreamAssembler {
    fn message_start(&mut self, payload: &Value) {
        let message = payload.get("message");
        if let Some(model) = message.and_then(|m| m.get("model")).and_then(Value::as_str) {
            self.model = Some(model.to_string());
        }
        if !apply_usage(message.and_then(|m| m.get("usage")), &mut self.usage) {
            self.garbled_usage = true;
        }
    }

    fn message_delta(&mut self, payload: &Value) {
        let reason = payload
            .get("delta")
            .and_then(|d| d.get("stop_reason"))
            .and_then(Value::as_str);
        if let Some(reason) = reason {
            self.stop_reason = Some(reason.to_string());
        }
        if !apply_usage(payload.get("usage"), &mut self.usage) {
            self.garbled_usage = true;
        }
    }

    fn block_start(
        &mut self,
        payload: &Value,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), ProviderError> {
        let index = block_index(payload)?;
        let block = payload.get("content_block").ok_or_else(|| {
            ProviderError::Parse("content_block_start has no content_block".into())
        })?;
        let kind = match block.get("type").and_then(Value::as_str).unwrap_or("") {
            "text" => {
                let text = block.get("text").and_then(Value::as_str).unwrap_or("");
                if !text.is_empty() {
                    on_text(text);
                }
                BlockKind::Text(text.to_string())
            }
            "tool_use" => BlockKind::Tool {
                id: str_field(block, "id", "a tool_use block")?.to_string(),
                name: str_field(block, "name", "a tool_use block")?.to_string(),
                start_input: block.get("input").cloned().unwrap_or(Value::Null),
                json: String::new(),
            },
            "thinking" | "redacted_thinking" => match block {
                Value::Object(map) => BlockKind::Thinking(map.clone()),
                _ => BlockKind::Other,
            },
            _ => BlockKind::Other,
        };
        self.blocks.push(StreamBlock { index, kind });
        Ok(())
    }

    fn block_delta(
        &mut self,
        payload: &Value,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), ProviderError> {
        let index = block_index(payload)?;
        let delta = payload.get("delta").ok_or_else(|| {
            ProviderError::Parse(format!("content_block_delta {index} has no delta"))
        })?;
        let delta_type = delta.get("type").and_then(Value::as_str).unwrap_or("");
        let block = self.block_mut(index, "content_block_delta")?;
        match (delta_type, &mut block.kind) {
            ("text_delta", BlockKind::Text(text)) => {
                let piece = str_field(delta, "text", "a text_delta")?;
                text.push_str(piece);
                on_text(piece);
            }
            ("input_json_delta", BlockKind::Tool { json, .. }) => {
                json.push_str(str_field(delta, "partial_json", "an input_json_delta")?);
            }
            ("thinking_delta", BlockKind::Thinking(map)) => {
                let piece = str_field(delta, "thinking", "a thinking_delta")?;
                append_field(map, "thinking", piece);
            }
            ("signature_delta", BlockKind::Thinking(map)) => {
                let piece = str_field(delta, "signature", "a signature_delta")?;
                append_field(map, "signature", piece);
            }
            // Citations and other annotations colony does not keep; deltas of skipped blocks.
            (_, BlockKind::Other) | ("citations_delta", _) => {}
            (other, _) => {
                return Err(ProviderError::Parse(format!(
                    "a `{other}` delta does not fit content block {index}"
                )));
            }
        }
        Ok(())
    }

    /// Nothing is finalised here: a tool block cut by `max_tokens` never gets its stop, so
    /// arguments are settled for every block alike in [`into_part`]. The stop only has to name a
    /// block that exists.
    fn block_stop(&mut self, payload: &Value) -> Result<(), ProviderError> {
        let index = block_index(payload)?;
        self.block_mut(index, "content_block_stop").map(|_| ())
    }

    fn block_mut(&mut self, index: u64, event: &str) -> Result<&mut StreamBlock, ProviderError> {
        self.blocks
            .iter_mut()
            .rev()
            .find(|b| b.index == index)
            .ok_or_else(|| {
                ProviderError::Parse(format!(
                    "{event} for content block {index}, which never started"
                ))
            })
    }
}

fn block_index(payload: &Value) -> Result<u64, ProviderError> {
    payload.get("index").and_then(Value::as_u64).ok_or_else(|| {
        let kind = payload
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("event");
        ProviderError::Parse(format!("{kind} has no numeric `index`"))
    })
}

fn append_field(map: &mut Map<String, Value>, key: &str, piece: &str) {
    let mut text = map
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    text.push_str(piece);
    map.insert(key.to_string(), Value::String(text));
}

/// The neutral part a finished stream block becomes.
///
/// Tool arguments are parsed only now, when every fragment is in: JSON that parses is
/// re-serialised compactly (the same text a whole response gives); JSON that does not (a block
/// cut by `max_tokens` before its stop) is kept as it is, since repairing it would invent
/// arguments. A block with no fragments at all falls back to its start `input` (`{}`).
fn into_part(block: StreamBlock) -> Option<Part> {
    match block.kind {
        BlockKind::Text(text) => (!text.is_empty()).then(|| Part::text(text)),
        BlockKind::Tool {
            id,
            name,
            start_input,
            json,
        } => {
            if json.trim().is_empty() {
                return Some(Part::ToolCall(tool_call(&id, &name, Some(&start_input))));
            }
            let arguments = match serde_json::from_str::<Value>(&json) {
                Ok(value) => value.to_string(),
                Err(_) => json,
            };
            Some(Part::ToolCall(ToolCall {
                id,
                name,
                arguments,
                opaque: None,
            }))
        }
        BlockKind::Thinking(map) => Some(reasoning_part(&Value::Object(map))),
        BlockKind::Other => None,
    }
}

#[cfg(test)]
mod tests;
