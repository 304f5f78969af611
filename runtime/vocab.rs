//! The provider-neutral vocabulary: the one set of types used everywhere above the wire.
//!
//! A provider module translates these to and from its own JSON; nothing here names a wire field.
//! Provider-specific data that must travel back unchanged (Gemini thought signatures, Anthropic
//! thinking blocks, OpenAI-compatible `reasoning_content`) rides in [`Opaque`] values tagged with the
//! style that produced them, so a conversation can move between providers without leaking them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }
}

/// The wire family a provider speaks. Opaque data is only ever sent back to the style that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Style {
    Anthropic,
    Openai,
    Gemini,
    Replay,
}

impl Style {
    pub fn as_str(self) -> &'static str {
        match self {
            Style::Anthropic => "anthropic",
            Style::Openai => "openai",
            Style::Gemini => "gemini",
            Style::Replay => "replay",
        }
    }
}

/// Provider-specific data that must be sent back unchanged on the next request to the same style.
///
/// `data` is whatever the style module needs to rebuild the wire form: for Anthropic a whole
/// `thinking` / `redacted_thinking` block, for Gemini the fields beside a part (`thoughtSignature`),
/// for OpenAI-compatible servers the extra message fields (`reasoning_content`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Opaque {
    pub style: Style,
    pub data: Value,
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        opaque: Option<Opaque>,
    },
    /// Model reasoning: shown text (may be empty or summarised) plus the data to send back.
    Reasoning {
        #[serde(default)]
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        opaque: Option<Opaque>,
    },
    ToolCall(ToolCall),
    ToolResult(ToolResult),
    /// An attached file, by reference. In a tool message it belongs to the result before it.
    File(FileRef),
}

impl Part {
    pub fn text(text: impl Into<String>) -> Part {
        Part::Text {
            text: text.into(),
            opaque: None,
        }
    }
}

/// A file as a message holds it: recorded once (name, content type, size, content hash) and
/// referred to by hash. The bytes ride beside the reference in memory, shared, and are never
/// serialised with the message: a store keeps them once by hash and puts them back on load.
#[derive(Clone, Serialize, Deserialize)]
pub struct FileRef {
    /// The name it was attached under (a path's file name, or the caller's name).
    pub name: String,
    /// Normalised (see [`crate::files::normalize`]).
    pub content_type: String,
    pub size: u64,
    /// Hex SHA-256 of the bytes.
    pub sha256: String,
    #[serde(skip)]
    pub data: Option<std::sync::Arc<[u8]>>,
    /// Why the provider refused it, once it has: it travels as a note saying so from then on
    /// (the conversation keeps the reference, so it still marks where the file was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shed: Option<String>,
}

impl FileRef {
    /// The short handle the model and `view_file` use: the first 12 hex digits of the hash.
    pub fn handle(&self) -> &str {
        &self.sha256[..self.sha256.len().min(12)]
    }
}

/// Two references are equal when they name the same recorded file; the bytes are the hash's.
impl PartialEq for FileRef {
    fn eq(&self, other: &FileRef) -> bool {
        self.name == other.name
            && self.content_type == other.content_type
            && self.size == other.size
            && self.sha256 == other.sha256
            && self.shed == other.shed
    }
}

impl std::fmt::Debug for FileRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileRef")
            .field("name", &self.name)
            .field("content_type", &self.content_type)
            .field("size", &self.size)
            .field("sha256", &self.handle())
            .field("loaded", &self.data.is_some())
            .finish()
    }
}

/// A message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
    /// For a user message that is a resident's mail: who sent it, and over how many relays.
    /// Kept with the conversation, never sent to a model: a turn resumed after a restart
    /// serves the same mail, and its tools are told where it came from
    /// (`ai.inbound_provenance()` answered nothing, and a relaying tool lost the hop count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mail: Option<Box<MailFrom>>,
}

/// Where a mail came from, as its message keeps it ([`Message::mail`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MailFrom {
    pub source: String,
    pub hop: u32,
}

impl Message {
    pub fn new(role: Role, parts: Vec<Part>) -> Message {
        Message {
            role,
            parts,
            mail: None,
        }
    }

    pub fn user(text: impl Into<String>) -> Message {
        Message::new(Role::User, vec![Part::text(text)])
    }

    pub fn assistant(text: impl Into<String>) -> Message {
        Message::new(Role::Assistant, vec![Part::text(text)])
    }

    /// The length of [`Message::text`], without building it.
    pub fn text_len(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Text { text, .. } => text.len(),
                _ => 0,
            })
            .sum()
    }

    /// The concatenated visible text of the message (reasoning excluded).
    pub fn text(&self) -> String {
        let mut out = String::new();
        for part in &self.parts {
            if let Part::Text { text, .. } = part {
                out.push_str(text);
            }
        }
        out
    }

    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.parts.iter().filter_map(|p| match p {
            Part::ToolCall(c) => Some(c),
            _ => None,
        })
    }

    pub fn files(&self) -> impl Iterator<Item = &FileRef> {
        self.parts.iter().filter_map(|p| match p {
            Part::File(f) => Some(f),
            _ => None,
        })
    }

    pub fn tool_results(&self) -> impl Iterator<Item = &ToolResult> {
        self.parts.iter().filter_map(|p| match p {
            Part::ToolResult(r) => Some(r),
            _ => None,
        })
    }
}

/// A tool offered to the model. `parameters` is a JSON Schema object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub parameters: Value,
}

/// A call the model asked for.
///
/// `arguments` is the JSON text exactly as the model sent it (OpenAI sends text; for Anthropic and
/// Gemini, which send objects, it is the compact serialisation). It may not be valid JSON: deciding
/// what that means is the caller's business, see [`ToolCall::decoded`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opaque: Option<Opaque>,
}

impl ToolCall {
    /// The arguments as a JSON value; an empty text counts as `{}`.
    pub fn decoded(&self) -> Result<Value, serde_json::Error> {
        if self.arguments.trim().is_empty() {
            return Ok(Value::Object(Default::default()));
        }
        serde_json::from_str(&self.arguments)
    }
}

/// The answer to one [`ToolCall`], matched by `call_id`. `name` is the called tool's name, which
/// Gemini needs on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub call_id: String,
    pub name: String,
    pub content: String,
    #[serde(default)]
    pub is_error: bool,
}

/// How the model may use the offered tools.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    #[default]
    Auto,
    None,
    /// The model must call some tool.
    Required,
    /// The model must call this tool.
    Tool(String),
}

/// Token counts. Summed over steps by the turn loop.
///
/// `input` counts every prompt token, cached ones included (`cache_read` and `cache_write` say
/// how many of them hit or filled a cache); `output` counts every generated token, reasoning
/// included (`reasoning` says how many). OpenAI and Gemini report this way; the Anthropic style
/// adds its separately reported cache tokens into `input`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub reasoning: u64,
}

impl Usage {
    /// What was added to `earlier` to make this (each count, never below 0).
    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            input: self.input.saturating_sub(earlier.input),
            output: self.output.saturating_sub(earlier.output),
            cache_read: self.cache_read.saturating_sub(earlier.cache_read),
            cache_write: self.cache_write.saturating_sub(earlier.cache_write),
            reasoning: self.reasoning.saturating_sub(earlier.reasoning),
        }
    }

    /// The most tokens one answer is believed to report of each kind: far past any model's
    /// window (a trillion), and small enough that sums over any run stay exact in a `u64` and in
    /// the store's signed 64-bit columns. A provider that reported 2^64 - 1 made the turn's sum
    /// overflow (a panic in a debug build, a wrapped total and a bypassed budget in a release one).
    pub const MOST_REPORTED: u64 = 1 << 40;

    /// The counts, each at most [`Usage::MOST_REPORTED`].
    pub fn believable(self) -> Usage {
        let cap = |n: u64| n.min(Self::MOST_REPORTED);
        Usage {
            input: cap(self.input),
            output: cap(self.output),
            cache_read: cap(self.cache_read),
            cache_write: cap(self.cache_write),
            reasoning: cap(self.reasoning),
        }
    }

    pub fn add(&mut self, other: &Usage) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.cache_read = self.cache_read.saturating_add(other.cache_read);
        self.cache_write = self.cache_write.saturating_add(other.cache_write);
        self.reasoning = self.reasoning.saturating_add(other.reasoning);
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    EndTurn,
    ToolUse,
    MaxTokens,
    StopSequence,
    Refusal,
    ContentFilter,
    MaxSteps,
    Error,
}

impl Stop {
    pub fn as_str(self) -> &'static str {
        match self {
            Stop::EndTurn => "end_turn",
            Stop::ToolUse => "tool_use",
            Stop::MaxTokens => "max_tokens",
            Stop::StopSequence => "stop_sequence",
            Stop::Refusal => "refusal",
            Stop::ContentFilter => "content_filter",
            Stop::MaxSteps => "max_steps",
            Stop::Error => "error",
        }
    }
}

/// One request to a model, in neutral form. Endpoint, key and transport live elsewhere
/// ([`crate::providers::Endpoint`]); this is what gets fingerprinted for replay.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InferRequest {
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    #[serde(default)]
    pub tool_choice: ToolChoice,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_sequences: Vec<String>,
    /// Fields merged over the wire body last (a JSON object), for knobs colony does not model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Value>,
    /// Ask for an answer that is JSON matching this schema (structured output), in the style's
    /// native form where it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<ResponseSchema>,
    /// The first message whose files travel inlined (a turn fixes it at its start, so what the
    /// turn appends never changes earlier bytes); `None`: the newest file-bearing message.
    /// Not part of what is fingerprinted: the messages say which files there are.
    #[serde(skip)]
    pub files_from: Option<usize>,
}

/// A JSON Schema the answer's text must match, with a name (OpenAI requires one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseSchema {
    pub name: String,
    pub schema: Value,
}

/// What one model call produced: the assistant message, why it stopped, and what it cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inferred {
    pub message: Message,
    pub stop: Stop,
    #[serde(default)]
    pub usage: Usage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl Inferred {
    pub fn text(&self) -> String {
        self.message.text()
    }

    pub fn tool_calls(&self) -> Vec<ToolCall> {
        self.message.tool_calls().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_len_is_the_length_of_the_text() {
        let message = Message {
            mail: None,
            role: Role::Assistant,
            parts: vec![
                Part::text("héllo "),
                Part::Reasoning {
                    text: "not counted".into(),
                    opaque: None,
                },
                Part::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "add".into(),
                    arguments: "{}".into(),
                    opaque: None,
                }),
                Part::text("world"),
            ],
        };
        assert_eq!(message.text(), "héllo world");
        assert_eq!(message.text_len(), message.text().len());
        assert_eq!(Message::user("").text_len(), 0);
    }
}
