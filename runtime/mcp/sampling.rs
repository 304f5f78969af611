//! Sampling: a server asking our model for a completion in the middle of a call
//! (`sampling/createMessage`).
//!
//! Off unless the program names the use-type that answers (`sampling = "helper"` on the
//! server's spec or its `[mcp.NAME]` entry): a server must not spend the program's tokens, or
//! read its model's answers, without being let. With a use-type, the capability is offered at
//! the handshake and each request goes to that use-type's model through the [`Core`]; without
//! one, the capability is not offered and a request is refused with an error that says how to
//! allow it. The call is one [`Core::call_provider`]: the use-type's settings and key, a traced
//! step, the provider's concurrency bound; not a resident's middleware (retries, breaker,
//! budget), which belongs to the resident's own turns.
//!
//! The request's `modelPreferences` are hints the specification lets a client ignore: the
//! use-type's own model answers. `systemPrompt`, `maxTokens`, `temperature` and
//! `stopSequences` are kept; text, image and audio content are sent as the model's message
//! parts (media as files).

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use crate::core::{Ask, Core};
use crate::vocab::{Message, Part, Role, Stop};

/// Whoever answers a server's sampling requests for this connection.
pub trait Sampler: Send + Sync {
    /// Answers the `sampling/createMessage` params (JSON) with a `CreateMessageResult` (JSON);
    /// `Err` is a message for the server.
    fn sample(&self, params: Value) -> BoxFuture<'static, Result<Value, String>>;
}

/// A shared sampler: specs compare equal when they share it.
#[derive(Clone)]
pub struct Hook(pub Arc<dyn Sampler>);

/// A server's sampling: the use-type named, and (once the program has wired it to its core)
/// the sampler that asks it.
#[derive(Clone)]
pub struct Sampling {
    pub use_type: String,
    pub sampler: Option<Hook>,
}

impl Sampling {
    pub fn new(use_type: String) -> Sampling {
        Sampling {
            use_type,
            sampler: None,
        }
    }

    /// The same sampling, answered through `core`.
    pub fn wired(&self, core: &Core) -> Sampling {
        Sampling {
            use_type: self.use_type.clone(),
            sampler: Some(Hook(Arc::new(CoreSampler {
                core: core.clone(),
                use_type: self.use_type.clone(),
            }))),
        }
    }
}

impl PartialEq for Sampling {
    fn eq(&self, other: &Sampling) -> bool {
        self.use_type == other.use_type
            && match (&self.sampler, &other.sampler) {
                (Some(a), Some(b)) => Arc::ptr_eq(&a.0, &b.0),
                (None, None) => true,
                _ => false,
            }
    }
}

impl std::fmt::Debug for Sampling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampling")
            .field("use_type", &self.use_type)
            .field("wired", &self.sampler.is_some())
            .finish()
    }
}

/// The sampler of a use-type: one model call through the core.
struct CoreSampler {
    core: Core,
    use_type: String,
}

impl Sampler for CoreSampler {
    fn sample(&self, params: Value) -> BoxFuture<'static, Result<Value, String>> {
        let core = self.core.clone();
        let use_type = self.use_type.clone();
        Box::pin(async move {
            let ask = ask(&use_type, &params)?;
            let (req, ep) = core
                .prepare(ask)
                .map_err(|e| format!("use-type {use_type}: {e}"))?;
            let model = req.model.clone();
            let done = core
                .call_provider(&req, &ep, None)
                .await
                .map_err(|e| format!("use-type {use_type}: {e}"))?;
            Ok(json!({
                "role": "assistant",
                "content": { "type": "text", "text": done.text() },
                "model": done.model.unwrap_or(model),
                "stopReason": stop_reason(done.stop),
            }))
        })
    }
}

/// The request as one call of `use_type`: its messages, system prompt and limits.
pub fn ask(use_type: &str, params: &Value) -> Result<Ask, String> {
    let mut ask = Ask::default();
    ask.overrides.use_type = Some(use_type.to_string());
    ask.system = params
        .get("systemPrompt")
        .and_then(Value::as_str)
        .map(str::to_string);
    ask.overrides.max_tokens = params
        .get("maxTokens")
        .and_then(Value::as_u64)
        .map(|n| n.min(u32::MAX as u64) as u32);
    // rmcp holds the temperature as an f32: its shortest decimal form is what the server sent
    // (0.7, not 0.699999988079071).
    ask.overrides.temperature = params
        .get("temperature")
        .and_then(Value::as_f64)
        .map(|t| (t as f32).to_string().parse().unwrap_or(t));
    ask.stop_sequences = params
        .get("stopSequences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let messages = params
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("sampling/createMessage without messages")?;
    for (i, m) in messages.iter().enumerate() {
        let role = match m.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            other => {
                return Err(format!(
                    "messages[{i}].role is {other:?}, not user or assistant"
                ));
            }
        };
        // One content block, or (2025-11-25) a list of them.
        let blocks = match m.get("content") {
            Some(Value::Array(a)) => a.clone(),
            Some(one) => vec![one.clone()],
            None => Vec::new(),
        };
        let mut parts = Vec::new();
        for (n, block) in blocks.iter().enumerate() {
            match (block.get("type").and_then(Value::as_str), block.get("text")) {
                (Some("text"), Some(Value::String(t))) => parts.push(Part::text(t.clone())),
                _ => match super::result::content_to_file(block, n + 1) {
                    Some(file) => parts.push(Part::File(file)),
                    None => parts.push(Part::text(super::result::content_to_text(block))),
                },
            }
        }
        ask.messages.push(Message::new(role, parts));
    }
    Ok(ask)
}

/// The model's stop as MCP names it.
fn stop_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::MaxTokens => "maxTokens",
        Stop::StopSequence => "stopSequence",
        _ => "endTurn",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_becomes_one_call_of_the_use_type() {
        let ask = ask(
            "helper",
            &json!({
                "messages": [
                    { "role": "user", "content": { "type": "text", "text": "What is 2+2?" } },
                    { "role": "assistant", "content": [{ "type": "text", "text": "4" }] },
                ],
                "systemPrompt": "Be brief.",
                "maxTokens": 100,
                "temperature": 0.2,
                "stopSequences": ["\n\n"],
                "modelPreferences": { "hints": [{ "name": "claude-3-sonnet" }] },
            }),
        )
        .unwrap();
        assert_eq!(ask.overrides.use_type.as_deref(), Some("helper"));
        assert_eq!(ask.overrides.model, None, "hints do not choose the model");
        assert_eq!(ask.system.as_deref(), Some("Be brief."));
        assert_eq!(ask.overrides.max_tokens, Some(100));
        assert_eq!(ask.overrides.temperature, Some(0.2));
        assert_eq!(ask.stop_sequences, vec!["\n\n".to_string()]);
        assert_eq!(ask.messages.len(), 2);
        assert_eq!(ask.messages[0].role, Role::User);
        assert_eq!(ask.messages[0].text(), "What is 2+2?");
        assert_eq!(ask.messages[1].text(), "4");
        let bad = super::ask("helper", &json!({ "messages": [{ "role": "system" }] }));
        assert_eq!(
            bad.unwrap_err(),
            "messages[0].role is Some(\"system\"), not user or assistant"
        );
    }
}
