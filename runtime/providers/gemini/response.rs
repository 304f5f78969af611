//! Reading a `GenerateContentResponse`, whole, as an array of them, or as the events of a
//! stream: parts, tool calls (with ids made up where the model gave none), the stop, the usage.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use super::opaque::{SYNTHETIC_ID, fields_beside, gemini_opaque, signed};
use super::streamed_call::{StreamedCall, all_complete};
use crate::providers::{ProviderError, errors};
use crate::vocab::{Inferred, Message, Opaque, Part, Role, Stop, ToolCall, Usage};

/// without `alt=sse`), or the events of a stream: all are the same `GenerateContentResponse`s.
#[derive(Default)]
pub(super) struct Answer {
    parts: Vec<Part>,
    /// A function call whose arguments are still streaming (`willContinue`, `partialArgs`).
    open_call: Option<StreamedCall>,
    saw_candidate: bool,
    finish_reason: Option<String>,
    finish_message: Option<String>,
    block_reason: Option<String>,
    usage: Usage,
    model: Option<String>,
}

impl Answer {
    pub(super) fn responses(
        &mut self,
        value: &Value,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), ProviderError> {
        match value {
            Value::Array(items) => items
                .iter()
                .try_for_each(|item| self.response(item, on_text)),
            other => self.response(other, on_text),
        }
    }

    fn response(
        &mut self,
        response: &Value,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), ProviderError> {
        let Some(fields) = response.as_object() else {
            return Err(parse_error("a response is not a JSON object"));
        };
        if fields.contains_key("error") {
            return Err(errors::classify_stream_error(response));
        }
        if let Some(usage) = fields.get("usageMetadata") {
            self.usage = read_usage(usage);
        }
        if let Some(model) = fields.get("modelVersion").and_then(Value::as_str) {
            self.model = Some(model.to_string());
        }
        if let Some(reason) = fields
            .get("promptFeedback")
            .and_then(|f| f.get("blockReason"))
            .and_then(Value::as_str)
        {
            self.block_reason = Some(reason.to_string());
        }
        let Some(candidate) = first_candidate(fields)? else {
            return Ok(());
        };
        self.saw_candidate = true;
        if let Some(parts) = candidate.get("content").and_then(|c| c.get("parts")) {
            let parts = parts
                .as_array()
                .ok_or_else(|| parse_error("content.parts is not an array"))?;
            for part in parts {
                self.part(part, on_text)?;
            }
        }
        if let Some(reason) = candidate.get("finishReason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_string());
        }
        if let Some(message) = candidate.get("finishMessage").and_then(Value::as_str) {
            self.finish_message = Some(message.to_string());
        }
        Ok(())
    }

    fn part(&mut self, part: &Value, on_text: &mut dyn FnMut(&str)) -> Result<(), ProviderError> {
        let Some(fields) = part.as_object() else {
            return Err(parse_error("a part is not a JSON object"));
        };
        if let Some(call) = fields.get("functionCall") {
            return self.function_call(call, fields_beside(fields, "functionCall"));
        }
        let Some(text) = fields.get("text") else {
            // Parts colony does not model (inline data, code execution) are left out.
            return Ok(());
        };
        let text = text
            .as_str()
            .ok_or_else(|| parse_error("a part's text is not a string"))?;
        let extra = fields_beside(fields, "text");
        let thought = extra.get("thought") == Some(&Value::Bool(true));
        if !thought && !text.is_empty() {
            on_text(text);
        }
        self.close_call();
        self.text(text, extra, thought);
        Ok(())
    }

    /// Adds a text or thought piece, continuing the last part when it is an unsigned run of the
    /// same kind.
    fn text(&mut self, text: &str, extra: Map<String, Value>, thought: bool) {
        if text.is_empty() && extra.is_empty() {
            return;
        }
        let run = match self.parts.last_mut() {
            Some(Part::Text { text, opaque }) if !thought => Some((text, opaque)),
            Some(Part::Reasoning { text, opaque }) if thought => Some((text, opaque)),
            _ => None,
        };
        if let Some((run_text, opaque)) = run
            && !signed(opaque.as_ref())
        {
            run_text.push_str(text);
            if !extra.is_empty() {
                match opaque {
                    Some(Opaque {
                        data: Value::Object(data),
                        ..
                    }) => data.extend(extra),
                    _ => *opaque = Some(gemini_opaque(extra)),
                }
            }
            return;
        }
        let opaque = (!extra.is_empty()).then(|| gemini_opaque(extra));
        let text = text.to_string();
        self.parts.push(if thought {
            Part::Reasoning { text, opaque }
        } else {
            Part::Text { text, opaque }
        });
    }

    fn function_call(
        &mut self,
        call: &Value,
        extra: Map<String, Value>,
    ) -> Result<(), ProviderError> {
        let Some(call) = call.as_object() else {
            return Err(parse_error("functionCall is not a JSON object"));
        };
        let name = match call.get("name") {
            Some(name) => Some(
                name.as_str()
                    .ok_or_else(|| parse_error("functionCall.name is not a string"))?,
            ),
            None => None,
        };
        let id = call.get("id").and_then(Value::as_str);
        let will_continue = call.get("willContinue") == Some(&Value::Bool(true));
        let partial = call.get("partialArgs");
        match name {
            // The start of a call whose arguments stream in the parts that follow.
            Some(name) if will_continue || partial.is_some() => {
                self.close_call();
                let mut open = StreamedCall::new(name, id, extra);
                if let Some(partial) = partial {
                    open.apply(partial).map_err(|e| parse_error(&e))?;
                }
                self.open_call = Some(open);
                if !will_continue && partial.is_some_and(all_complete) {
                    self.close_call();
                }
            }
            // A whole call.
            Some(name) => {
                self.close_call();
                let args = match call.get("args") {
                    None | Some(Value::Null) => Value::Object(Map::new()),
                    Some(args @ Value::Object(_)) => args.clone(),
                    Some(_) => return Err(parse_error("functionCall.args is not an object")),
                };
                self.parts
                    .push(Part::ToolCall(tool_call(name, id, &args, extra)));
            }
            // More arguments for the open call, or its end (`"functionCall": {}`).
            None => {
                if let Some(partial) = partial {
                    let open = self.open_call.as_mut().ok_or_else(|| {
                        parse_error("functionCall.partialArgs came with no call open")
                    })?;
                    open.apply(partial).map_err(|e| parse_error(&e))?;
                    open.extra.extend(extra);
                    if !will_continue && all_complete(partial) {
                        self.close_call();
                    }
                } else if !will_continue {
                    self.close_call();
                }
            }
        }
        Ok(())
    }

    fn close_call(&mut self) {
        if let Some(open) = self.open_call.take() {
            let call = tool_call(&open.name, open.id.as_deref(), &open.args, open.extra);
            self.parts.push(Part::ToolCall(call));
        }
    }

    /// The answer; `streamed` says a missing `finishReason` means the stream was cut.
    pub(super) fn finish(mut self, streamed: bool) -> Result<Inferred, ProviderError> {
        self.close_call();
        let has_calls = self.parts.iter().any(|p| matches!(p, Part::ToolCall(_)));
        let stop = match (&self.finish_reason, &self.block_reason) {
            (Some(reason), _) => stop_reason(reason, has_calls),
            (None, Some(_)) => Stop::ContentFilter,
            (None, None) if streamed => {
                return Err(ProviderError::Fetch(
                    "the stream ended before a finishReason".into(),
                ));
            }
            (None, None) if !self.saw_candidate => {
                return Err(parse_error(
                    "the response has no candidates and no promptFeedback.blockReason",
                ));
            }
            (None, None) if has_calls => Stop::ToolUse,
            (None, None) => Stop::EndTurn,
        };
        if stop == Stop::Error {
            let reason = self.finish_reason.as_deref().unwrap_or("unknown reason");
            let note = match &self.finish_message {
                Some(message) => format!("{reason}: {message}"),
                None => reason.to_string(),
            };
            self.parts.push(Part::text(note));
        }
        Ok(Inferred {
            message: Message::new(Role::Assistant, self.parts),
            stop,
            usage: self.usage,
            model: self.model,
        })
    }
}

/// A Gemini answer (or a piece of a stream) that cannot be read.
fn parse_error(what: &str) -> ProviderError {
    ProviderError::Parse(format!("Gemini: {what}"))
}

/// The candidate answering this request (colony asks for one): index 0.
fn first_candidate(fields: &Map<String, Value>) -> Result<Option<&Value>, ProviderError> {
    let Some(candidates) = fields.get("candidates") else {
        return Ok(None);
    };
    let candidates = candidates
        .as_array()
        .ok_or_else(|| parse_error("candidates is not an array"))?;
    Ok(candidates
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0))
}

fn tool_call(
    name: &str,
    id: Option<&str>,
    args: &Value,
    mut extra: Map<String, Value>,
) -> ToolCall {
    let id = match id.filter(|id| !id.is_empty()) {
        Some(id) => id.to_string(),
        None => {
            extra.insert(SYNTHETIC_ID.into(), json!(true));
            synthetic_id()
        }
    };
    ToolCall {
        id,
        name: name.to_string(),
        arguments: args.to_string(),
        opaque: Some(gemini_opaque(extra)),
    }
}

/// An id for a call the model sent without one. It never goes on the wire, but it must not
/// repeat within a conversation, which may later move to a style that insists on unique ids.
fn synthetic_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    format!("gemini_{millis:x}_{n}")
}

fn stop_reason(reason: &str, has_calls: bool) -> Stop {
    match reason {
        "STOP" if has_calls => Stop::ToolUse,
        "STOP" => Stop::EndTurn,
        "MAX_TOKENS" => Stop::MaxTokens,
        "SAFETY"
        | "RECITATION"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "SPII"
        | "LANGUAGE"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION" => Stop::ContentFilter,
        _ => Stop::Error,
    }
}

fn read_usage(meta: &Value) -> Usage {
    const FIELDS: [&str; 5] = [
        "promptTokenCount",
        "toolUsePromptTokenCount",
        "candidatesTokenCount",
        "thoughtsTokenCount",
        "cachedContentTokenCount",
    ];
    if crate::providers::token_counts::garbled(meta, &FIELDS) {
        return Usage::default();
    }
    let count = |key: &str| {
        meta.get(key)
            .and_then(crate::providers::token_counts::count)
            .unwrap_or(0)
    };
    let reasoning = count("thoughtsTokenCount");
    Usage {
        input: count("promptTokenCount") + count("toolUsePromptTokenCount"),
        output: count("candidatesTokenCount") + reasoning,
        cache_read: count("cachedContentTokenCount"),
        cache_write: 0,
        reasoning,
    }
}
