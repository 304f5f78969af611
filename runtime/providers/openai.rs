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

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use reqwest::header::HeaderMap;
use serde_json::{Map, Value, json};

use super::{Assembler, Codec, Endpoint, ProviderError, WireRequest, errors, merge_extra};
use crate::vocab::{
    FileRef, InferRequest, Inferred, Message, Opaque, Part, ResponseSchema, Role, Stop, Style,
    ToolCall, ToolChoice, ToolResult, ToolSpec, Usage,
};

pub struct OpenAi;

/// The reasoning fields of an assistant message, in order of preference: some servers (vLLM)
/// send both with the same text, and only one may be kept.
const REASONING_FIELDS: [&str; 2] = ["reasoning_content", "reasoning"];

/// The fields of a wire tool call colony reads; any other field is opaque data.
const TOOL_CALL_FIELDS: [&str; 4] = ["index", "id", "type", "function"];

/// A failed tool result has no wire flag: the model learns of the failure from this prefix.
const ERROR_PREFIX: &str = "Error: ";

impl Codec for OpenAi {
    fn request(&self, req: &InferRequest, ep: &Endpoint, stream: bool) -> WireRequest {
        let mut body = Map::new();
        body.insert("model".into(), json!(req.model));
        body.insert("messages".into(), Value::Array(messages(req)));
        if let Some(temperature) = req.temperature {
            body.insert("temperature".into(), json!(temperature));
        }
        if let Some(max_tokens) = req.max_tokens {
            body.insert("max_tokens".into(), json!(max_tokens));
        }
        if !req.stop_sequences.is_empty() {
            body.insert("stop".into(), json!(req.stop_sequences));
        }
        if !req.tools.is_empty() {
            let tools = req.tools.iter().map(tool_out).collect();
            body.insert("tools".into(), Value::Array(tools));
            body.insert("tool_choice".into(), tool_choice_out(&req.tool_choice));
        }
        if let Some(schema) = &req.response_schema {
            body.insert("response_format".into(), response_format(schema));
        }
        if stream {
            body.insert("stream".into(), json!(true));
            // Without it the usage never arrives in a stream.
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
        let mut body = Value::Object(body);
        merge_extra(&mut body, req.extra.as_ref());
        WireRequest {
            url: format!("{}/chat/completions", ep.base()),
            headers: auth_headers(ep),
            body,
        }
    }

    fn parse(&self, body: &[u8]) -> Result<Inferred, ProviderError> {
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

    fn assembler(&self) -> Box<dyn Assembler> {
        Box::new(StreamAssembler::default())
    }

    fn models_request(&self, ep: &Endpoint) -> WireRequest {
        WireRequest {
            url: format!("{}/models", ep.base()),
            headers: auth_headers(ep),
            body: Value::Null,
        }
    }

    fn parse_models(&self, body: &Value) -> Vec<String> {
        super::list_field(body, "data", "id")
            .into_iter()
            .map(str::to_string)
            .collect()
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

fn messages(req: &InferRequest) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        out.push(json!({"role": "system", "content": system}));
    }
    for message in &req.messages {
        match message.role {
            Role::System => out.push(json!({"role": "system", "content": message.text()})),
            Role::Assistant => {
                out.push(assistant_message(message));
                out.extend(message.tool_results().map(tool_result_out));
            }
            Role::User | Role::Tool => {
                // Results answer the previous assistant message, so they come before any text.
                let results: Vec<Value> = message.tool_results().map(tool_result_out).collect();
                let text = message.text();
                let user_text =
                    !text.is_empty() || (message.role == Role::User && results.is_empty());
                out.extend(results);
                let images: Vec<Value> = message.files().filter_map(image_part).collect();
                if !images.is_empty() {
                    // Content parts: the text, then each image as a data URL.
                    let mut content = Vec::with_capacity(images.len() + 1);
                    if !text.is_empty() {
                        content.push(json!({"type": "text", "text": text}));
                    }
                    content.extend(images);
                    out.push(json!({"role": "user", "content": content}));
                } else if user_text {
                    out.push(json!({"role": "user", "content": text}));
                }
            }
        }
    }
    out
}

/// `content` is the text, or `null` when the message only calls tools (a text-less assistant
/// message without calls still needs a string). Opaque fields of this style are added beside.
fn assistant_message(message: &Message) -> Value {
    let text = message.text();
    let calls: Vec<Value> = message.tool_calls().map(tool_call_out).collect();
    let content = match (text.is_empty(), calls.is_empty()) {
        (true, false) => Value::Null,
        _ => json!(text),
    };
    let mut wire = Map::new();
    wire.insert("role".into(), json!("assistant"));
    wire.insert("content".into(), content);
    if !calls.is_empty() {
        wire.insert("tool_calls".into(), Value::Array(calls));
    }
    for part in &message.parts {
        if let Part::Reasoning { opaque, .. } | Part::Text { opaque, .. } = part {
            add_opaque(&mut wire, opaque.as_ref());
        }
    }
    Value::Object(wire)
}

fn tool_call_out(call: &ToolCall) -> Value {
    // An empty argument text is what no-argument calls sometimes stream; servers want an object.
    let arguments = if call.arguments.trim().is_empty() {
        "{}"
    } else {
        call.arguments.as_str()
    };
    let mut wire = Map::new();
    wire.insert("id".into(), json!(call.id));
    wire.insert("type".into(), json!("function"));
    wire.insert(
        "function".into(),
        json!({"name": call.name, "arguments": arguments}),
    );
    add_opaque(&mut wire, call.opaque.as_ref());
    Value::Object(wire)
}

/// Adds the fields of an opaque value made by this style; others' data is dropped. Fields colony
/// already set win, so opaque data can never change the role, text or calls.
fn add_opaque(wire: &mut Map<String, Value>, opaque: Option<&Opaque>) {
    let Some(fields) = opaque
        .filter(|o| o.style == Style::Openai)
        .and_then(|o| o.data.as_object())
    else {
        return;
    };
    for (key, value) in fields {
        wire.entry(key.clone()).or_insert_with(|| value.clone());
    }
}

/// An image the file renderer left as a file (only for an endpoint that reads images) as an
/// `image_url` content part with a base64 data URL.
fn image_part(file: &FileRef) -> Option<Value> {
    let data = STANDARD.encode(file.data.as_deref()?);
    let url = format!("data:{};base64,{data}", file.content_type);
    Some(json!({"type": "image_url", "image_url": {"url": url}}))
}

fn tool_result_out(result: &ToolResult) -> Value {
    let content = if result.is_error {
        format!("{ERROR_PREFIX}{}", result.content)
    } else {
        result.content.clone()
    };
    json!({"role": "tool", "tool_call_id": result.call_id, "content": content})
}

fn tool_out(tool: &ToolSpec) -> Value {
    // A tool without parameters still needs a schema on the wire.
    let parameters = match &tool.parameters {
        Value::Null => json!({"type": "object", "properties": {}}),
        schema => schema.clone(),
    };
    let mut function = Map::new();
    function.insert("name".into(), json!(tool.name));
    if !tool.description.is_empty() {
        function.insert("description".into(), json!(tool.description));
    }
    function.insert("parameters".into(), parameters);
    json!({"type": "function", "function": function})
}

fn tool_choice_out(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
    }
}

/// Structured output: `{"type":"json_schema","json_schema":{name, schema, strict: false}}`.
///
/// `strict` stays false: strict mode demands that every property be listed in `required` and
/// every object say `additionalProperties: false`, which ordinary user schemas (optional fields,
/// open objects) break, and the server then refuses the whole request. Without it the schema
/// still guides the model, and colony validates the answer itself.
fn response_format(schema: &ResponseSchema) -> Value {
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
            .and_then(Value::as_u64)
    };
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
        self.draft.into_inferred()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::*;
    use crate::providers::ToolsLevel;
    use crate::providers::sse::assemble_bytes;

    const KEY: &str = "sk-test-0123456789abcdef";

    fn endpoint(key: Option<&str>) -> Endpoint {
        Endpoint {
            reads: Default::default(),
            provider: "openai".into(),
            style: Style::Openai,
            base_url: "https://api.example.com/v1/".into(),
            key: key.map(str::to_string),
            tools_level: ToolsLevel::Native,
            timeout: Duration::from_secs(30),
            max_response_bytes: crate::providers::body::DEFAULT_MAX_RESPONSE_BYTES,
            max_concurrent_calls: crate::providers::DEFAULT_MAX_CONCURRENT_CALLS,
        }
    }

    fn request(req: &InferRequest) -> WireRequest {
        OpenAi.request(req, &endpoint(Some(KEY)), false)
    }

    fn base() -> InferRequest {
        InferRequest {
            model: "gpt-4o".into(),
            messages: vec![Message::user("Hi")],
            ..InferRequest::default()
        }
    }

    fn weather_tool() -> ToolSpec {
        ToolSpec {
            name: "get_weather".into(),
            description: "Weather for a city".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        }
    }

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
            opaque: None,
        }
    }

    fn result(call_id: &str, content: &str, is_error: bool) -> Part {
        Part::ToolResult(ToolResult {
            call_id: call_id.into(),
            name: "get_weather".into(),
            content: content.into(),
            is_error,
        })
    }

    /// Runs data payloads through the assembler as an SSE stream.
    fn stream(payloads: &[&str]) -> (Result<Inferred, ProviderError>, Vec<String>) {
        let sse: String = payloads.iter().map(|p| format!("data: {p}\n\n")).collect();
        assemble_bytes(sse.as_bytes(), OpenAi.assembler())
    }

    // --- outgoing ------------------------------------------------------------------------------

    #[test]
    fn url_and_key_header() {
        let wire = request(&base());
        assert_eq!(wire.url, "https://api.example.com/v1/chat/completions");
        assert_eq!(
            wire.headers,
            vec![("authorization".to_string(), format!("Bearer {KEY}"))]
        );
        assert!(
            !wire.body.to_string().contains(KEY),
            "the key is only a header"
        );
    }

    #[test]
    fn no_key_no_header() {
        for key in [None, Some("")] {
            let wire = OpenAi.request(&base(), &endpoint(key), false);
            assert!(wire.headers.is_empty());
        }
    }

    #[test]
    fn minimal_body_has_only_model_and_messages() {
        let wire = request(&base());
        assert_eq!(
            wire.body,
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]})
        );
    }

    #[test]
    fn response_schema_is_a_json_schema_response_format() {
        let schema = json!({"type": "object", "properties": {"age": {"type": "integer"}}});
        let req = InferRequest {
            response_schema: Some(ResponseSchema {
                name: "person".into(),
                schema: schema.clone(),
            }),
            ..base()
        };
        let body = request(&req).body;
        assert_eq!(
            body["response_format"],
            json!({"type": "json_schema",
                   "json_schema": {"name": "person", "schema": schema, "strict": false}})
        );
        // Nothing else moves: the body without the field is the plain request's body.
        let mut rest = body.clone();
        rest.as_object_mut().unwrap().remove("response_format");
        assert_eq!(rest, request(&base()).body);
    }

    #[test]
    fn response_schema_name_is_reshaped_to_the_wire_alphabet() {
        assert_eq!(schema_name("person"), "person");
        assert_eq!(schema_name("my schema.v2"), "my_schema_v2");
        assert_eq!(schema_name(""), "response");
        assert_eq!(schema_name(&"x".repeat(80)).len(), 64);
    }

    #[test]
    fn no_response_schema_leaves_the_body_unchanged() {
        // A full request: every field that goes on the wire, and no structured output.
        let req = InferRequest {
            system: Some("Be brief.".into()),
            tools: vec![weather_tool()],
            temperature: Some(0.5),
            max_tokens: Some(100),
            stop_sequences: vec!["END".into()],
            ..base()
        };
        let body = request(&req).body;
        assert_eq!(
            body,
            json!({
                "model": "gpt-4o",
                "messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Hi"}],
                "temperature": 0.5,
                "max_tokens": 100,
                "stop": ["END"],
                "tools": [{"type": "function", "function": {"name": "get_weather",
                    "description": "Weather for a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
                "tool_choice": "auto",
            })
        );
    }

    #[test]
    fn system_temperature_max_tokens_stop() {
        let req = InferRequest {
            system: Some("Be brief.".into()),
            temperature: Some(0.25),
            max_tokens: Some(512),
            stop_sequences: vec!["END".into(), "\n\n".into()],
            ..base()
        };
        let body = request(&req).body;
        assert_eq!(
            body["messages"][0],
            json!({"role": "system", "content": "Be brief."})
        );
        assert_eq!(
            body["messages"][1],
            json!({"role": "user", "content": "Hi"})
        );
        assert_eq!(body["temperature"], json!(0.25));
        assert_eq!(body["max_tokens"], json!(512));
        assert_eq!(body["stop"], json!(["END", "\n\n"]));
        assert!(body.get("max_completion_tokens").is_none());
        assert!(body.get("tools").is_none() && body.get("tool_choice").is_none());
        assert!(body.get("stream").is_none() && body.get("stream_options").is_none());
    }

    #[test]
    fn system_messages_stay_in_place() {
        let req = InferRequest {
            system: Some("First.".into()),
            messages: vec![
                Message::user("a"),
                Message::new(Role::System, vec![Part::text("Now in French.")]),
                Message::user("b"),
            ],
            ..base()
        };
        let roles: Vec<Value> = request(&req).body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| json!([m["role"], m["content"]]))
            .collect();
        assert_eq!(
            roles,
            vec![
                json!(["system", "First."]),
                json!(["user", "a"]),
                json!(["system", "Now in French."]),
                json!(["user", "b"]),
            ]
        );
    }

    #[test]
    fn streaming_asks_for_usage() {
        let body = OpenAi.request(&base(), &endpoint(None), true).body;
        assert_eq!(body["stream"], json!(true));
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn extra_is_merged_last() {
        let req = InferRequest {
            temperature: Some(0.5),
            max_tokens: Some(100),
            extra: Some(json!({
                "temperature": 1.0,
                "max_completion_tokens": 2000,
                "stream_options": {"continuous_usage_stats": true},
                "reasoning_effort": "low",
            })),
            ..base()
        };
        let body = OpenAi.request(&req, &endpoint(None), true).body;
        let mut expected = OpenAi
            .request(
                &InferRequest {
                    extra: None,
                    ..req.clone()
                },
                &endpoint(None),
                true,
            )
            .body;
        super::merge_extra(&mut expected, req.extra.as_ref());
        assert_eq!(body, expected);
        assert_eq!(body["temperature"], json!(1.0));
        assert_eq!(body["max_tokens"], json!(100));
        assert_eq!(body["max_completion_tokens"], json!(2000));
        assert_eq!(body["reasoning_effort"], json!("low"));
        assert_eq!(
            body["stream_options"],
            json!({"include_usage": true, "continuous_usage_stats": true})
        );
    }

    #[test]
    fn tools_out() {
        let bare = ToolSpec {
            name: "now".into(),
            description: String::new(),
            parameters: Value::Null,
        };
        let req = InferRequest {
            tools: vec![weather_tool(), bare],
            ..base()
        };
        let body = request(&req).body;
        assert_eq!(
            body["tools"],
            json!([
                {"type": "function", "function": {
                    "name": "get_weather",
                    "description": "Weather for a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                }},
                {"type": "function", "function": {
                    "name": "now",
                    "parameters": {"type": "object", "properties": {}},
                }},
            ])
        );
        assert_eq!(body["tool_choice"], json!("auto"));
    }

    #[test]
    fn tool_choices() {
        let cases = [
            (ToolChoice::Auto, json!("auto")),
            (ToolChoice::None, json!("none")),
            (ToolChoice::Required, json!("required")),
            (
                ToolChoice::Tool("get_weather".into()),
                json!({"type": "function", "function": {"name": "get_weather"}}),
            ),
        ];
        for (choice, wire) in cases {
            let req = InferRequest {
                tools: vec![weather_tool()],
                tool_choice: choice.clone(),
                ..base()
            };
            assert_eq!(request(&req).body["tool_choice"], wire, "{choice:?}");
        }
        // Without tools neither field goes out, whatever the choice.
        let req = InferRequest {
            tool_choice: ToolChoice::Required,
            ..base()
        };
        let body = request(&req).body;
        assert!(body.get("tools").is_none() && body.get("tool_choice").is_none());
    }

    #[test]
    fn assistant_tool_calls_and_results() {
        let req = InferRequest {
            messages: vec![
                Message::user("Weather in Paris and the time?"),
                Message::new(
                    Role::Assistant,
                    vec![
                        Part::ToolCall(call("call_1", "get_weather", r#"{"city":"Paris"}"#)),
                        Part::ToolCall(call("call_2", "now", "")),
                    ],
                ),
                Message::new(
                    Role::Tool,
                    vec![
                        result("call_1", "18C, cloudy", false),
                        result("call_2", "clock unavailable", true),
                    ],
                ),
                Message::new(
                    Role::Assistant,
                    vec![
                        Part::text("Let me check again."),
                        Part::ToolCall(call("call_3", "now", "{}")),
                    ],
                ),
                Message::new(
                    Role::User,
                    vec![result("call_3", "12:00", false), Part::text("Thanks")],
                ),
            ],
            ..base()
        };
        let messages = request(&req).body["messages"].clone();
        assert_eq!(
            messages,
            json!([
                {"role": "user", "content": "Weather in Paris and the time?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_2", "type": "function",
                     "function": {"name": "now", "arguments": "{}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C, cloudy"},
                {"role": "tool", "tool_call_id": "call_2", "content": "Error: clock unavailable"},
                {"role": "assistant", "content": "Let me check again.", "tool_calls": [
                    {"id": "call_3", "type": "function",
                     "function": {"name": "now", "arguments": "{}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_3", "content": "12:00"},
                {"role": "user", "content": "Thanks"},
            ])
        );
    }

    #[test]
    fn opaque_data_goes_back_only_to_this_style() {
        let ours = |data: Value| {
            Some(Opaque {
                style: Style::Openai,
                data,
            })
        };
        let theirs = Some(Opaque {
            style: Style::Anthropic,
            data: json!({"type": "thinking", "thinking": "...", "signature": "sig"}),
        });
        let mut signed = call("call_1", "get_weather", r#"{"city":"Paris"}"#);
        signed.opaque = ours(json!({"extra_content": {"google": {"thought_signature": "c2ln"}}}));
        let mut foreign = call("call_2", "get_weather", r#"{"city":"Rome"}"#);
        foreign.opaque = theirs.clone();
        let req = InferRequest {
            messages: vec![
                Message::user("Weather?"),
                Message::new(
                    Role::Assistant,
                    vec![
                        Part::Reasoning {
                            text: "The user wants weather.".into(),
                            opaque: ours(json!({"reasoning_content": "The user wants weather."})),
                        },
                        Part::Reasoning {
                            text: "hidden".into(),
                            opaque: theirs.clone(),
                        },
                        // Opaque data never overrides what colony itself sets.
                        Part::Text {
                            text: "Checking.".into(),
                            opaque: ours(json!({"content": "forged", "role": "user"})),
                        },
                        Part::ToolCall(signed),
                        Part::ToolCall(foreign),
                    ],
                ),
            ],
            ..base()
        };
        let assistant = request(&req).body["messages"][1].clone();
        assert_eq!(
            assistant,
            json!({
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                     "extra_content": {"google": {"thought_signature": "c2ln"}}},
                    {"id": "call_2", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}},
                ],
                "reasoning_content": "The user wants weather.",
            })
        );
    }

    #[test]
    fn reasoning_round_trips_unchanged() {
        let body =
            br#"{"model":"deepseek-reasoner","choices":[{"index":0,"finish_reason":"tool_calls",
            "message":{"role":"assistant","content":"","reasoning_content":"Need the tool.",
            "tool_calls":[{"index":0,"id":"call_0","type":"function",
            "function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]}}]}"#;
        let inferred = OpenAi.parse(body).unwrap();
        let req = InferRequest {
            messages: vec![Message::user("Weather in Oslo?"), inferred.message],
            ..base()
        };
        assert_eq!(
            request(&req).body["messages"][1],
            json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [{"id": "call_0", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}],
                "reasoning_content": "Need the tool.",
            })
        );
    }

    #[test]
    fn models_endpoint() {
        let wire = OpenAi.models_request(&endpoint(Some(KEY)));
        assert_eq!(wire.url, "https://api.example.com/v1/models");
        assert_eq!(
            wire.headers,
            vec![("authorization".to_string(), format!("Bearer {KEY}"))]
        );
        let listing = json!({"object": "list", "data": [
            {"id": "gpt-4o", "object": "model", "owned_by": "system"},
            {"id": "llama3.2:latest", "object": "model"},
            {"object": "model"},
        ]});
        assert_eq!(
            OpenAi.parse_models(&listing),
            vec!["gpt-4o", "llama3.2:latest"]
        );
        assert!(OpenAi.parse_models(&json!({"error": "nope"})).is_empty());
    }

    // --- incoming ------------------------------------------------------------------------------

    #[test]
    fn stop_reasons() {
        let cases = [
            ("\"stop\"", "", Stop::EndTurn),
            ("null", "", Stop::EndTurn),
            ("\"length\"", "", Stop::MaxTokens),
            ("\"content_filter\"", "", Stop::ContentFilter),
            ("\"tool_calls\"", TOOL, Stop::ToolUse),
            ("\"function_call\"", TOOL, Stop::ToolUse),
            // Kimi-style: calls with a plain stop, or no finish reason at all.
            ("\"stop\"", TOOL, Stop::ToolUse),
            ("null", TOOL, Stop::ToolUse),
            ("\"insufficient_system_resource\"", "", Stop::Error),
        ];
        const TOOL: &str = r#","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]"#;
        for (reason, calls, stop) in cases {
            let body = format!(
                r#"{{"choices":[{{"index":0,"finish_reason":{reason},"message":{{"role":"assistant","content":"x"{calls}}}}}]}}"#
            );
            assert_eq!(
                OpenAi.parse(body.as_bytes()).unwrap().stop,
                stop,
                "{reason} {calls}"
            );
        }
    }

    #[test]
    fn refusal_is_text_and_stop() {
        let body = br#"{"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":null,"refusal":"I can't help with that."}}]}"#;
        let inferred = OpenAi.parse(body).unwrap();
        assert_eq!(inferred.text(), "I can't help with that.");
        assert_eq!(inferred.stop, Stop::Refusal);
    }

    #[test]
    fn usage_mapping() {
        let body = br#"{"choices":[{"index":0,"finish_reason":"stop","message":{"content":"x"}}],
            "usage":{"prompt_tokens":100,"completion_tokens":50,"total_tokens":150,
            "prompt_tokens_details":{"cached_tokens":40,"cache_write_tokens":7},
            "completion_tokens_details":{"reasoning_tokens":30}}}"#;
        assert_eq!(
            OpenAi.parse(body).unwrap().usage,
            Usage {
                input: 100,
                output: 50,
                cache_read: 40,
                cache_write: 7,
                reasoning: 30,
            }
        );
        // DeepSeek and Kimi name their cache hits differently.
        let deepseek = json!({"prompt_tokens": 9, "prompt_cache_hit_tokens": 8});
        assert_eq!(read_usage(&deepseek).cache_read, 8);
        let kimi = json!({"prompt_tokens": 9, "cached_tokens": 6});
        assert_eq!(read_usage(&kimi).cache_read, 6);
    }

    #[test]
    fn error_bodies_and_garbage_are_errors() {
        let body = br#"{"error":{"message":"Invalid model","type":"invalid_request_error","code":"model_not_found"}}"#;
        let err = OpenAi.parse(body).unwrap_err();
        assert_eq!(err.kind(), "api_error");
        assert!(err.to_string().contains("Invalid model"));
        for bad in [
            &b"<html>502</html>"[..],
            br#"{"choices":[]}"#,
            br#"{"choices":{"0":{}}}"#,
            br#"{"choices":[{"index":0,"finish_reason":"stop"}]}"#,
            br#"{"choices":[{"index":0,"message":{"content":42}}]}"#,
            br#"{"choices":[{"index":0,"message":{"tool_calls":[{"id":"c","function":{"arguments":"{}"}}]}}]}"#,
        ] {
            let err = OpenAi.parse(bad).unwrap_err();
            assert_eq!(err.kind(), "parse_error", "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn arguments_split_anywhere_are_joined() {
        let open = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_9","type":"function","function":{"name":"note","arguments":""}}]},"finish_reason":null}]}"#;
        let fragments = [
            r#"{\"te"#,
            r#"xt\": \"a \\"#,
            r#"\"quoted\\\" w"#,
            r#"ord\"}"#,
        ];
        let mut payloads = vec![open.to_string()];
        for f in fragments {
            payloads.push(format!(
                r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":"{f}"}}}}]}},"finish_reason":null}}]}}"#
            ));
        }
        payloads
            .push(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#.into());
        payloads.push("[DONE]".into());
        let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
        let inferred = stream(&refs).0.unwrap();
        let calls = inferred.tool_calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arguments, r#"{"text": "a \"quoted\" word"}"#);
        assert_eq!(
            calls[0].decoded().unwrap(),
            json!({"text": "a \"quoted\" word"})
        );
        assert_eq!(inferred.stop, Stop::ToolUse);
    }

    #[test]
    fn repeated_id_and_name_do_not_duplicate() {
        // Kimi-style: every delta repeats id and name; no tool_calls finish reason.
        let (result, deltas) = stream(&[
            r#"{"choices":[{"index":0,"delta":{"content":"Looking."}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"get_weather:0","type":"function","function":{"name":"get_weather","arguments":"{\"city\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"get_weather:0","type":"function","function":{"name":"get_weather","arguments":"\"Paris\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop","usage":{"prompt_tokens":30,"completion_tokens":12,"cached_tokens":10}}]}"#,
            "[DONE]",
        ]);
        let inferred = result.unwrap();
        assert_eq!(deltas, vec!["Looking."]);
        assert_eq!(
            inferred.tool_calls(),
            vec![call("get_weather:0", "get_weather", r#"{"city":"Paris"}"#)]
        );
        assert_eq!(inferred.stop, Stop::ToolUse);
        assert_eq!(
            (
                inferred.usage.input,
                inferred.usage.output,
                inferred.usage.cache_read
            ),
            (30, 12, 10)
        );
    }

    #[test]
    fn calls_without_index_are_told_apart_by_id() {
        let (result, _) = stream(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{\"x\""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":":1}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"b","function":{"name":"g","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ]);
        assert_eq!(
            result.unwrap().tool_calls(),
            vec![call("a", "f", r#"{"x":1}"#), call("b", "g", "{}")]
        );
    }

    #[test]
    fn opaque_tool_call_fields_are_kept() {
        let (result, _) = stream(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"fc_1","type":"function","function":{"name":"f","arguments":"{}"},"extra_content":{"google":{"thought_signature":"c2ln"}}}]},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ]);
        let calls = result.unwrap().tool_calls();
        assert_eq!(
            calls[0].opaque,
            Some(Opaque {
                style: Style::Openai,
                data: json!({"extra_content": {"google": {"thought_signature": "c2ln"}}}),
            })
        );
    }

    #[test]
    fn openrouter_reasoning_and_comments() {
        let sse = concat!(
            ": OPENROUTER PROCESSING\n\n",
            "data: {\"model\":\"x/y\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"reasoning\":\"Think\"}}]}\n\n",
            ": OPENROUTER PROCESSING\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\",\"reasoning\":\"ing.\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,\"completion_tokens_details\":{\"reasoning_tokens\":4}}}\n\n",
            "data: [DONE]\n\n",
        );
        let (result, deltas) = assemble_bytes(sse.as_bytes(), OpenAi.assembler());
        let inferred = result.unwrap();
        assert_eq!(deltas, vec!["Hello", "!"]);
        assert_eq!(
            inferred.message.parts,
            vec![
                Part::Reasoning {
                    text: "Thinking.".into(),
                    opaque: Some(Opaque {
                        style: Style::Openai,
                        data: json!({"reasoning": "Thinking."}),
                    }),
                },
                Part::text("Hello!"),
            ]
        );
        assert_eq!(inferred.usage.reasoning, 4);
        assert_eq!(inferred.model.as_deref(), Some("x/y"));
    }

    #[test]
    fn streamed_content_filter() {
        let (result, deltas) = stream(&[
            r#"{"choices":[{"index":0,"delta":{"content":"Once upon"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}"#,
            "[DONE]",
        ]);
        let inferred = result.unwrap();
        assert_eq!(deltas, vec!["Once upon"]);
        assert_eq!(inferred.stop, Stop::ContentFilter);
    }

    #[test]
    fn mid_stream_error_is_an_error() {
        let (result, deltas) = stream(&[
            r#"{"choices":[{"index":0,"delta":{"content":"Partial"}}]}"#,
            r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","code":null}}"#,
            "[DONE]",
        ]);
        assert_eq!(deltas, vec!["Partial"]);
        let err = result.unwrap_err();
        assert_eq!(err.kind(), "provider_error");
        assert!(err.is_transient());
        assert!(err.to_string().contains("server had an error"));

        // OpenRouter sends the error beside a choice with finish_reason "error".
        let (result, _) = stream(&[
            r#"{"error":{"code":"invalid_prompt","message":"Prompt rejected"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}"#,
        ]);
        let err = result.unwrap_err();
        assert_eq!(err.kind(), "api_error");
        assert!(!err.is_transient());

        // A named error event.
        let sse = "event: error\ndata: {\"error\":{\"message\":\"Overloaded\",\"type\":\"overloaded_error\"}}\n\n";
        let err = assemble_bytes(sse.as_bytes(), OpenAi.assembler())
            .0
            .unwrap_err();
        assert!(err.is_transient());
    }

    #[test]
    fn stream_end_without_done() {
        // Closed after the finishing chunk: accepted.
        let (result, _) = stream(&[
            r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}"#,
        ]);
        assert_eq!(result.unwrap().text(), "Hi");
        // Closed before any finish reason: cut off.
        let (result, deltas) = stream(&[r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#]);
        assert_eq!(deltas, vec!["Hi"]);
        assert_eq!(
            result.unwrap_err(),
            ProviderError::Fetch("the stream ended before [DONE]".into())
        );
    }

    #[test]
    fn garbage_in_a_stream_is_a_parse_error() {
        for payloads in [
            &["not json"][..],
            &[r#"{"choices":"nope"}"#][..],
            &[r#"{"choices":[{"index":0,"delta":{"tool_calls":{"index":0}}}]}"#][..],
            &[
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}"#,
                "[DONE]",
            ][..],
        ] {
            let err = stream(payloads).0.unwrap_err();
            assert_eq!(err.kind(), "parse_error", "{payloads:?}");
        }
    }
}
