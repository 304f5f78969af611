//! The chat-completions request body, written straight from the [`InferRequest`] it borrows.
//!
//! It is sent on every step, and building it as a `serde_json::Value` first cost a step about
//! 45 K instructions: every message, text and tool schema copied into a tree, the tree
//! serialised, then freed. Here each piece serialises itself from the request; only `extra`
//! (merged over the body last) goes through a `Value`.

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Value, json};

use super::{ERROR_PREFIX, response_format};
use crate::providers::merge_extra;
use crate::vocab::{
    FileRef, InferRequest, Message, Opaque, Part, Role, Style, ToolCall, ToolChoice, ToolResult,
    ToolSpec,
};

/// The body of `req` as JSON bytes; `stream` asks for SSE.
pub(super) fn body(req: &InferRequest, stream: bool) -> Vec<u8> {
    let body = Body { req, stream };
    let written = match &req.extra {
        Some(extra @ Value::Object(_)) => serde_json::to_value(&body).map(|mut value| {
            merge_extra(&mut value, Some(extra));
            serde_json::to_vec(&value)
        }),
        _ => Ok(serde_json::to_vec(&body)),
    };
    // Every piece is a string, number, bool or JSON value with string keys: writing to memory
    // cannot fail.
    written.and_then(|w| w).expect("a request body serialises")
}

struct Body<'a> {
    req: &'a InferRequest,
    stream: bool,
}

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let req = self.req;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("model", &req.model)?;
        map.serialize_entry("messages", &Messages(req))?;
        if let Some(temperature) = req.temperature {
            map.serialize_entry("temperature", &temperature)?;
        }
        if let Some(max_tokens) = req.max_tokens {
            map.serialize_entry("max_tokens", &max_tokens)?;
        }
        if !req.stop_sequences.is_empty() {
            map.serialize_entry("stop", &req.stop_sequences)?;
        }
        if !req.tools.is_empty() {
            map.serialize_entry("tools", &Tools(&req.tools))?;
            map.serialize_entry("tool_choice", &Choice(&req.tool_choice))?;
        }
        if let Some(schema) = &req.response_schema {
            map.serialize_entry("response_format", &response_format(schema))?;
        }
        if self.stream {
            map.serialize_entry("stream", &true)?;
            // Without it the usage never arrives in a stream.
            map.serialize_entry("stream_options", &IncludeUsage)?;
        }
        map.end()
    }
}

struct IncludeUsage;

impl Serialize for IncludeUsage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry("include_usage", &true)?;
        map.end()
    }
}

/// `req.system` as a leading system message, then each message as the wire wants it: an
/// assistant message followed by any results it holds, a user or tool message's results before
/// its text, images as content parts.
struct Messages<'a>(&'a InferRequest);

impl Serialize for Messages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let req = self.0;
        let mut seq = s.serialize_seq(None)?;
        if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
            seq.serialize_element(&Said("system", Cow::Borrowed(system)))?;
        }
        for message in &req.messages {
            match message.role {
                Role::System => seq.serialize_element(&Said("system", message.text().into()))?,
                Role::Assistant => {
                    seq.serialize_element(&Assistant(message))?;
                    for result in message.tool_results() {
                        seq.serialize_element(&Answered(result))?;
                    }
                }
                Role::User | Role::Tool => {
                    let mut results = 0;
                    for result in message.tool_results() {
                        seq.serialize_element(&Answered(result))?;
                        results += 1;
                    }
                    let text = message.text();
                    let user_text =
                        !text.is_empty() || (message.role == Role::User && results == 0);
                    let images: Vec<Value> = message.files().filter_map(image_part).collect();
                    if !images.is_empty() {
                        // Content parts: the text, then each image as a data URL.
                        let mut content = Vec::with_capacity(images.len() + 1);
                        if !text.is_empty() {
                            content.push(json!({"type": "text", "text": text}));
                        }
                        content.extend(images);
                        seq.serialize_element(&json!({"role": "user", "content": content}))?;
                    } else if user_text {
                        seq.serialize_element(&Said("user", text.into()))?;
                    }
                }
            }
        }
        seq.end()
    }
}

/// `{"role": role, "content": text}`.
struct Said<'a>(&'static str, Cow<'a, str>);

impl Serialize for Said<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("role", self.0)?;
        map.serialize_entry("content", &self.1)?;
        map.end()
    }
}

/// `content` is the text, or `null` when the message only calls tools (a text-less assistant
/// message without calls still needs a string). Opaque fields of this style are added beside.
struct Assistant<'a>(&'a Message);

impl Serialize for Assistant<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let message = self.0;
        let text = message.text();
        let calls = message.tool_calls().count();
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("role", "assistant")?;
        if text.is_empty() && calls > 0 {
            map.serialize_entry("content", &())?;
        } else {
            map.serialize_entry("content", &text)?;
        }
        let mut set: Vec<&str> = vec!["role", "content"];
        if calls > 0 {
            map.serialize_entry("tool_calls", &Calls(message))?;
            set.push("tool_calls");
        }
        for part in &message.parts {
            if let Part::Reasoning { opaque, .. } | Part::Text { opaque, .. } = part {
                add_opaque(&mut map, &mut set, opaque.as_ref())?;
            }
        }
        map.end()
    }
}

struct Calls<'a>(&'a Message);

impl Serialize for Calls<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.tool_calls().map(Call))
    }
}

struct Call<'a>(&'a ToolCall);

impl Serialize for Call<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let call = self.0;
        // An empty argument text is what no-argument calls sometimes stream; servers want an
        // object.
        let arguments = if call.arguments.trim().is_empty() {
            "{}"
        } else {
            call.arguments.as_str()
        };
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("id", &call.id)?;
        map.serialize_entry("type", "function")?;
        map.serialize_entry(
            "function",
            &Function {
                name: &call.name,
                arguments,
            },
        )?;
        let mut set = vec!["id", "type", "function"];
        add_opaque(&mut map, &mut set, call.opaque.as_ref())?;
        map.end()
    }
}

#[derive(serde::Serialize)]
struct Function<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// Writes the fields of an opaque value made by this style; others' data is dropped. Fields
/// already written (`set`) win, so opaque data can never change the role, text or calls, and
/// of two parts carrying one field the first wins.
fn add_opaque<'a, M: SerializeMap>(
    map: &mut M,
    set: &mut Vec<&'a str>,
    opaque: Option<&'a Opaque>,
) -> Result<(), M::Error> {
    let Some(fields) = opaque
        .filter(|o| o.style == Style::Openai)
        .and_then(|o| o.data.as_object())
    else {
        return Ok(());
    };
    for (key, value) in fields {
        if !set.contains(&key.as_str()) {
            map.serialize_entry(key, value)?;
            set.push(key);
        }
    }
    Ok(())
}

/// A result as its own `{"role":"tool"}` message. The wire has no error flag: a failed
/// result's content carries the prefix.
struct Answered<'a>(&'a ToolResult);

impl Serialize for Answered<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let result = self.0;
        let content: Cow<str> = if result.is_error {
            format!("{ERROR_PREFIX}{}", result.content).into()
        } else {
            Cow::Borrowed(&result.content)
        };
        let mut map = s.serialize_map(Some(3))?;
        map.serialize_entry("role", "tool")?;
        map.serialize_entry("tool_call_id", &result.call_id)?;
        map.serialize_entry("content", &content)?;
        map.end()
    }
}

/// An image the file renderer left as a file (only for an endpoint that reads images) as an
/// `image_url` content part with a base64 data URL.
fn image_part(file: &FileRef) -> Option<Value> {
    let data = STANDARD.encode(file.data.as_deref()?);
    let url = format!("data:{};base64,{data}", file.content_type);
    Some(json!({"type": "image_url", "image_url": {"url": url}}))
}

struct Tools<'a>(&'a [ToolSpec]);

impl Serialize for Tools<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(Tool))
    }
}

/// `{"type":"function","function":{name, description, parameters}}`.
struct Tool<'a>(&'a ToolSpec);

impl Serialize for Tool<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("type", "function")?;
        map.serialize_entry("function", &ToolFunction(self.0))?;
        map.end()
    }
}

struct ToolFunction<'a>(&'a ToolSpec);

impl Serialize for ToolFunction<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let tool = self.0;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("name", &tool.name)?;
        if !tool.description.is_empty() {
            map.serialize_entry("description", &tool.description)?;
        }
        match &tool.parameters {
            // A tool without parameters still needs a schema on the wire.
            Value::Null => map.serialize_entry("parameters", &NoParameters)?,
            schema => map.serialize_entry("parameters", schema)?,
        }
        map.end()
    }
}

/// `{"type": "object", "properties": {}}`.
struct NoParameters;

impl Serialize for NoParameters {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("type", "object")?;
        map.serialize_entry("properties", &Map::new())?;
        map.end()
    }
}

struct Choice<'a>(&'a ToolChoice);

impl Serialize for Choice<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            ToolChoice::Auto => s.serialize_str("auto"),
            ToolChoice::None => s.serialize_str("none"),
            ToolChoice::Required => s.serialize_str("required"),
            ToolChoice::Tool(name) => {
                json!({"type": "function", "function": {"name": name}}).serialize(s)
            }
        }
    }
}
