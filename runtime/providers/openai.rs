//! The OpenAI chat-completions wire style, spoken by OpenAI itself and by the compatible servers
//! (Groq, Ollama, Kimi / Moonshot, DeepSeek, Azure, OpenRouter, vLLM, ...).
//!
//! # Mapping
//!
//! Out: `req.system` becomes a leading `{"role":"system"}` message and `Role::System` messages stay
//! system messages in place; tools go out as `{"type":"function","function":{..}}`; an assistant
//! message carries its calls in `tool_calls` with the arguments as JSON text; each
//! [`ToolResult`] becomes its own `{"role":"tool"}` message. The wire has no error flag on a tool
//! result, so a failed result is sent as its content prefixed with `Error: `. Token limits go out
//! as `max_tokens`, the only name Groq, Ollama and Kimi know (`max_completion_tokens`, which
//! OpenAI's reasoning models require, can be set through `extra`).
//!
//! In: `finish_reason` `stop` is [`Stop::EndTurn`] (or [`Stop::ToolUse`] when calls came anyway, as
//! Kimi-style servers do; [`Stop::Refusal`] when the model refused), `tool_calls` /
//! `function_call` is [`Stop::ToolUse`], `length` is [`Stop::MaxTokens`], `content_filter` is
//! [`Stop::ContentFilter`], and DeepSeek's `insufficient_system_resource` and OpenRouter's `error`
//! are [`Stop::Error`]. Usage: `prompt_tokens` is input, `completion_tokens` output,
//! `prompt_tokens_details.cached_tokens` (DeepSeek: `prompt_cache_hit_tokens`, Kimi:
//! `cached_tokens`) cache read, `prompt_tokens_details.cache_write_tokens` (OpenRouter) cache write,
//! `completion_tokens_details.reasoning_tokens` reasoning. A refusal (`refusal`) is visible text.
//!
//! Opaque data (always tagged [`Style::Openai`], sent back only to this style):
//! - the assistant message's reasoning trace, `reasoning_content` (DeepSeek, Kimi) or `reasoning`
//!   (OpenRouter, Groq), kept as a [`Part::Reasoning`] whose data is `{field: text}` and merged
//!   back into the assistant message. DeepSeek and Kimi answer 400 when it is missing from a turn
//!   that called tools, so it is kept even when empty;
//! - fields of a tool call beyond `index` / `id` / `type` / `function` (Gemini's compatibility
//!   layer puts its thought signature in `extra_content`), kept on the [`ToolCall`] and merged back
//!   into the wire call.
//!
//! Structured output ([`InferRequest::response_schema`]) goes out as `response_format`
//! `{"type":"json_schema","json_schema":{name, schema, "strict": false}}`; see
//! `response_format` for why strict mode stays off.
//!
//! Only the first choice is read: colony never asks for `n > 1`, and if `extra` does, the other
//! choices are dropped.

use reqwest::header::HeaderMap;
use serde_json::{Map, Value, json};

use super::token_counts::{self, count};
use super::{Assembler, Codec, Endpoint, ProviderError, WireRequest, errors};
use crate::vocab::{
    InferRequest, Inferred, Message, Opaque, Part, ResponseSchema, Role, Stop, Style, ToolCall,
    Usage,
};

pub struct OpenAi;

/// The reasoning fields of an assistant message, in order of preference: some servers (vLLM)
/// send both with the same text, and only one may be kept.
const REASONING_FIELDS: [&str; 2] = ["reasoning_content", "reasoning"];

/// The fields of a wire tool call colony reads; any other field is opaque data.
const TOOL_CALL_FIELDS: [&str; 4] = ["index", "id", "type", "function"];

/// A failed tool result has no wire flag: the model learns of the failure from this prefix.
pub(super) const ERROR_PREFIX: &str = "Error: ";

impl Codec for OpenAi {
    fn request(&self, req: &InferRequest, ep: &Endpoint, stream: bool) -> WireRequest {
        WireRequest {
            url: format!("{}/chat/completions", ep.base()),
            headers: auth_headers(ep),
            body: outgoing::body(req, stream),
        }
    }

    fn parse(&self, body: &[u8]) -> Result<Inferred, ProviderError> {
        match whole::read(body) {
            Some(draft) => draft.into_inferred(),
            None => parse_value(body),
        }
    }

    fn assembler(&self) -> Box<dyn Assembler> {
        Box::new(StreamAssembler::default())
    }

    fn models_request(&self, ep: &Endpoint) -> WireRequest {
        WireRequest {
            url: format!("{}/models", ep.base()),
            headers: auth_headers(ep),
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

/// `authorization: Bearer KEY`, only when a key is set: local servers (Ollama) need none.
fn auth_headers(ep: &Endpoint) -> Vec<(String, String)> {
    ep.key
        .iter()
        .filter(|k| !k.is_empty())
        .map(|k| ("authorization".to_string(), format!("Bearer {k}")))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Outgoing

/// Structured output: `{"type":"json_schema","json_schema":{name, schema, strict: false}}`.
///
/// `strict` stays false: strict mode demands that every property be listed in `required` and
/// every object say `additionalProperties: false`, which ordinary user schemas (optional fields,
/// open objects) break, and the server then refuses the whole request. Without it the schema
/// still guides the model, and colony validates the answer itself.
pub(super) fn response_format(schema: &ResponseSchema) -> Value {
    json!({
        "type": "json_schema",
        "json_schema": {
            "name": schema_name(&schema.name),
            "schema": schema.schema,
            "strict": false,
        },
    })
}

/// The name in the alphabet OpenAI accepts (`a-z A-Z 0-9 _ -`, at most 64 characters): any
/// other character becomes `_`, and an empty name is `response`. The name only labels the
/// schema for the model, so the reshaping loses nothing.
fn schema_name(name: &str) -> String {
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() {
        "response".into()
    } else {
        name
    }
}

// ---------------------------------------------------------------------------------------------
// Incoming

/// A whole answer through a JSON value: any shape a server may send, each fault named. Answers of
/// the usual shape take [`whole::read`] instead, which gives the same answer without the tree.
fn parse_value(body: &[u8]) -> Result<Inferred, ProviderError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ProviderError::Parse(format!("chat completion is not JSON: {e}")))?;
    if carries_error(&value) {
        // Some compatible servers answer 200 with an error body.
        let text = String::from_utf8_lossy(body);
        return Err(errors::classify(200, &HeaderMap::new(), &text));
    }
    let mut draft = Draft::default();
    draft.read_model(&value);
    if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
        draft.usage = read_usage(usage);
    }
    let choice = choices(&value)?
        .iter()
        .find(|c| choice_index(c) == 0)
        .ok_or_else(|| ProviderError::Parse("chat completion has no choices".into()))?;
    let message = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| ProviderError::Parse("chat completion choice has no message".into()))?;
    draft.read_message(message)?;
    draft.finish_reason = text_field(choice, "finish_reason").map(str::to_string);
    draft.into_inferred()
}

/// An error object in place of an answer (a 200 error body, a mid-stream error chunk).
fn carries_error(value: &Value) -> bool {
    value.get("error").is_some_and(|e| !e.is_null())
}

/// The `choices` array; absent or `null` reads as empty (Azure's filter chunk, usage chunks).
fn choices(value: &Value) -> Result<&[Value], ProviderError> {
    match value.get("choices") {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(ProviderError::Parse(format!(
            "`choices` is not an array: {}",
            short(other)
        ))),
    }
}

fn choice_index(choice: &Value) -> u64 {
    choice.get("index").and_then(Value::as_u64).unwrap_or(0)
}

fn text_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

fn short(value: &Value) -> String {
    let mut text = value.to_string();
    if text.len() > 200 {
        let mut end = 200;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

fn read_usage(usage: &Value) -> Usage {
    let number = |path: &[&str]| {
        path.iter()
            .try_fold(usage, |v, key| v.get(key))
            .and_then(count)
    };
    if token_counts::garbled(usage, &["prompt_tokens", "completion_tokens"]) {
        return Usage::default();
    }
    Usage {
        input: number(&["prompt_tokens"]).unwrap_or(0),
        output: number(&["completion_tokens"]).unwrap_or(0),
        cache_read: number(&["prompt_tokens_details", "cached_tokens"])
            .or_else(|| number(&["prompt_cache_hit_tokens"]))
            .or_else(|| number(&["cached_tokens"]))
            .unwrap_or(0),
        cache_write: number(&["prompt_tokens_details", "cache_write_tokens"]).unwrap_or(0),
        reasoning: number(&["completion_tokens_details", "reasoning_tokens"]).unwrap_or(0),
    }
}

/// The first reasoning field present as text on a message or delta: its name and its text.
fn reasoning_in(value: &Value) -> Option<(&'static str, &str)> {
    REASONING_FIELDS
        .iter()
        .find_map(|field| text_field(value, field).map(|text| (*field, text)))
}

/// What a response said so far; a whole response fills it at once, a stream piece by piece.
#[derive(Default)]
struct Draft {
    /// The reasoning field the server used and the text gathered in it.
    reasoning: Option<(&'static str, String)>,
    /// Visible text, including refusal text.
    text: String,
    refused: bool,
    /// Calls in the order of their wire `index`.
    calls: Vec<DraftCall>,
    finish_reason: Option<String>,
    usage: Usage,
    model: Option<String>,
}

#[derive(Default)]
struct DraftCall {
    index: u64,
    id: String,
    name: String,
    arguments: String,
    extra: Map<String, Value>,
}

impl DraftCall {
    /// Reads one wire call or call delta. The id and name are taken once: Kimi-style servers
    /// repeat them in every delta, which must not start a new call or lengthen the name.
    fn absorb(&mut self, wire: &Value) -> Result<(), ProviderError> {
        if let Some(id) = text_field(wire, "id").filter(|id| !id.is_empty())
            && self.id.is_empty()
        {
            self.id = id.to_string();
        }
        if let Some(function) = wire.get("function").filter(|f| !f.is_null()) {
            if let Some(name) = text_field(function, "name").filter(|n| !n.is_empty())
                && self.name.is_empty()
            {
                self.name = name.to_string();
            }
            match function.get("arguments") {
                None | Some(Value::Null) => {}
                Some(Value::String(fragment)) => self.arguments.push_str(fragment),
                // A few servers send the arguments as an object rather than JSON text.
                Some(object @ Value::Object(_)) => self.arguments.push_str(&object.to_string()),
                Some(other) => {
                    return Err(ProviderError::Parse(format!(
                        "tool call arguments are neither text nor an object: {}",
                        short(other)
                    )));
                }
            }
        }
        if let Some(fields) = wire.as_object() {
            for (key, value) in fields {
                if !TOOL_CALL_FIELDS.contains(&key.as_str()) && !value.is_null() {
                    self.extra.insert(key.clone(), value.clone());
                }
            }
        }
        Ok(())
    }

    fn into_tool_call(self) -> Result<ToolCall, ProviderError> {
        if self.name.is_empty() {
            return Err(ProviderError::Parse(format!(
                "tool call {} came without a name",
                self.index
            )));
        }
        let id = if self.id.is_empty() {
            // Some local servers send no id; results still need one to be matched by.
            format!("call_{}", self.index)
        } else {
            self.id
        };
        let opaque = (!self.extra.is_empty()).then_some(Opaque {
            style: Style::Openai,
            data: Value::Object(self.extra),
        });
        Ok(ToolCall {
            id,
            name: self.name,
            arguments: self.arguments,
            opaque,
        })
    }
}

impl Draft {
    fn read_model(&mut self, value: &Value) {
        if let Some(model) = text_field(value, "model").filter(|m| !m.is_empty()) {
            self.model = Some(model.to_string());
        }
    }

    fn add_reasoning(&mut self, field: &'static str, text: &str) {
        self.reasoning
            .get_or_insert_with(|| (field, String::new()))
            .1
            .push_str(text);
    }

    /// A whole `message` of a non-streamed answer.
    fn read_message(&mut self, message: &Value) -> Result<(), ProviderError> {
        if let Some((field, text)) = reasoning_in(message) {
            self.add_reasoning(field, text);
        }
        match message.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(text)) => self.text.push_str(text),
            Some(other) => {
                return Err(ProviderError::Parse(format!(
                    "message content is neither text nor null: {}",
                    short(other)
                )));
            }
        }
        if let Some(refusal) = text_field(message, "refusal").filter(|r| !r.is_empty()) {
            self.text.push_str(refusal);
            self.refused = true;
        }
        let calls = match message.get("tool_calls") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(calls)) => calls,
            Some(other) => {
                return Err(ProviderError::Parse(format!(
                    "`tool_calls` is not an array: {}",
                    short(other)
                )));
            }
        };
        for (position, wire) in calls.iter().enumerate() {
            let mut call = DraftCall {
                index: position as u64,
                ..DraftCall::default()
            };
            call.absorb(wire)?;
            self.calls.push(call);
        }
        Ok(())
    }

    /// One `delta` of a streamed answer; visible text goes to `on_text` as it comes.
    fn read_delta(
        &mut self,
        delta: &Value,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), ProviderError> {
        if let Some((field, text)) = reasoning_in(delta) {
            self.add_reasoning(field, text);
        }
        for key in ["content", "refusal"] {
            if let Some(text) = text_field(delta, key).filter(|t| !t.is_empty()) {
                self.text.push_str(text);
                self.refused |= key == "refusal";
                on_text(text);
            }
        }
        match delta.get("tool_calls") {
            None | Some(Value::Null) => Ok(()),
            Some(Value::Array(calls)) => calls.iter().try_for_each(|c| self.read_call_delta(c)),
            Some(other) => Err(ProviderError::Parse(format!(
                "`tool_calls` delta is not an array: {}",
                short(other)
            ))),
        }
    }

    /// Call deltas are keyed by `index`. Without one (rare), a new id opens a new call and
    /// anything else continues the last call.
    fn read_call_delta(&mut self, wire: &Value) -> Result<(), ProviderError> {
        let index = match wire.get("index").and_then(Value::as_u64) {
            Some(index) => index,
            None => {
                let id = text_field(wire, "id").filter(|id| !id.is_empty());
                let known = id.and_then(|id| self.calls.iter().find(|c| c.id == id));
                match (known, self.calls.last()) {
                    (Some(call), _) => call.index,
                    (None, Some(last)) if id.is_none() => last.index,
                    _ => self.calls.iter().map(|c| c.index + 1).max().unwrap_or(0),
                }
            }
        };
        // `calls` stays sorted by index, so the calls come out in wire order.
        let position = match self.calls.binary_search_by_key(&index, |c| c.index) {
            Ok(position) => position,
            Err(position) => {
                let call = DraftCall {
                    index,
                    ..DraftCall::default()
                };
                self.calls.insert(position, call);
                position
            }
        };
        self.calls[position].absorb(wire)
    }

    fn stop(&self) -> Stop {
        match self.finish_reason.as_deref() {
            Some("length") => Stop::MaxTokens,
            Some("content_filter") => Stop::ContentFilter,
            Some("tool_calls" | "function_call") => Stop::ToolUse,
            Some("insufficient_system_resource" | "error") => Stop::Error,
            _ if self.refused => Stop::Refusal,
            _ if !self.calls.is_empty() => Stop::ToolUse,
            _ => Stop::EndTurn,
        }
    }

    fn into_inferred(self) -> Result<Inferred, ProviderError> {
        let stop = self.stop();
        let mut parts = Vec::new();
        if let Some((field, text)) = self.reasoning {
            parts.push(Part::Reasoning {
                opaque: Some(Opaque {
                    style: Style::Openai,
                    data: json!({ field: text }),
                }),
                text,
            });
        }
        if !self.text.is_empty() {
            parts.push(Part::text(self.text));
        }
        for call in self.calls {
            parts.push(Part::ToolCall(call.into_tool_call()?));
        }
        Ok(Inferred {
            message: Message::new(Role::Assistant, parts),
            stop,
            usage: self.usage,
            model: self.model,
        })
    }
}

/// Assembles a chat-completions stream: data-only SSE of `chat.completion.chunk` objects ending
/// with `data: [DONE]`.
#[derive(Default)]
struct StreamAssembler {
    draft: Draft,
    done: bool,
    /// A chunk carried a choice: a stream of none is an answer of none, as a whole answer
    /// without choices is (it read as an empty reply).
    saw_choice: bool,
}

impl Assembler for StreamAssembler {
    fn event(
        &mut self,
        event: &str,
        data: &str,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), ProviderError> {
        if self.done {
            return Ok(());
        }
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: Value = match serde_json::from_str(data) {
            Ok(chunk) => chunk,
            // Some servers name an error event and may put plain text in it.
            Err(_) if event == "error" => {
                return Err(errors::classify_stream_error(&json!({"error": data})));
            }
            Err(e) => {
                return Err(ProviderError::Parse(format!(
                    "stream chunk is not JSON ({e}): {}",
                    short(&json!(data))
                )));
            }
        };
        if event == "error" || carries_error(&chunk) {
            return Err(errors::classify_stream_error(&chunk));
        }
        self.draft.read_model(&chunk);
        // Usage is cumulative: the last report wins. Groq streams it in `x_groq.usage`, Kimi in
        // the choice.
        let usage = chunk
            .get("usage")
            .filter(|u| u.is_object())
            .or_else(|| chunk.pointer("/x_groq/usage").filter(|u| u.is_object()));
        if let Some(usage) = usage {
            self.draft.usage = read_usage(usage);
        }
        for choice in choices(&chunk)?.iter().filter(|c| choice_index(c) == 0) {
            self.saw_choice = true;
            if let Some(usage) = choice.get("usage").filter(|u| u.is_object()) {
                self.draft.usage = read_usage(usage);
            }
            if let Some(delta) = choice.get("delta").filter(|d| !d.is_null()) {
                self.draft.read_delta(delta, on_text)?;
            }
            if let Some(reason) = text_field(choice, "finish_reason") {
                self.draft.finish_reason = Some(reason.to_string());
            }
        }
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<Inferred, ProviderError> {
        // Some compatible servers close after the finishing chunk without `[DONE]`; a stream
        // that ends before any finish reason was cut off.
        if !self.done && self.draft.finish_reason.is_none() {
            return Err(ProviderError::Fetch(
                "the stream ended before [DONE]".to_string(),
            ));
        }
        if !self.saw_choice {
            return Err(ProviderError::Parse(
                "the chat completion stream carried no choices".into(),
            ));
        }
        self.draft.into_inferred()
    }
}

mod outgoing;
#[cfg(test)]
mod tests;
mod whole;
