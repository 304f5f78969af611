//! The text fallback for providers whose tools level is `text`: the tools are described in the
//! system prompt, the model is asked to answer a call as a fenced JSON block, and such blocks are
//! parsed back into [`ToolCall`]s. Output that does not parse is an ordinary text answer.

use serde_json::{Value, json};

use crate::vocab::{InferRequest, Inferred, Message, Part, Role, Stop, ToolCall, ToolChoice};

/// `req` rewritten for a model without native tools: no `tools` on the wire, the catalogue in the
/// system prompt, earlier calls and results as plain text.
pub fn prepare(req: &InferRequest) -> InferRequest {
    let mut out = req.clone();
    let mut prompt = String::new();
    if let Some(system) = &req.system {
        prompt.push_str(system);
        prompt.push_str("\n\n");
    }
    if req.tool_choice == ToolChoice::None {
        prompt.push_str("Do not call any tool now; answer in plain text.\n");
    } else {
        prompt.push_str(
            "You can call tools. To call one, answer with nothing but a fenced JSON block:\n\
             ```json\n{\"tool\": \"NAME\", \"arguments\": {...}}\n```\n\
             For several calls, write one block per call. The results come back in the next \
             message. When you need no tool, answer in plain text.\n\nTools:\n",
        );
        for t in &req.tools {
            prompt.push_str(&format!(
                "- {}: {}\n  arguments (JSON Schema): {}\n",
                t.name, t.description, t.parameters
            ));
        }
        if let ToolChoice::Tool(name) = &req.tool_choice {
            prompt.push_str(&format!("Call the tool {name} now.\n"));
        }
    }
    out.system = Some(prompt);
    out.tools.clear();
    out.tool_choice = ToolChoice::Auto;
    out.messages = req.messages.iter().map(flatten).collect();
    out
}

fn flatten(m: &Message) -> Message {
    let mut text = String::new();
    // Files the renderer left as files travel as they are, after the text.
    let mut files = Vec::new();
    for p in &m.parts {
        match p {
            Part::Text { text: t, .. } => text.push_str(t),
            Part::ToolCall(c) => {
                let args: Value = c.decoded().unwrap_or(Value::String(c.arguments.clone()));
                let block = json!({"tool": c.name, "arguments": args});
                text.push_str(&format!("\n```json\n{block}\n```\n"));
            }
            Part::ToolResult(r) => {
                let status = if r.is_error { "error" } else { "result" };
                text.push_str(&format!(
                    "Tool {} ({}) {status}:\n{}\n",
                    r.name, r.call_id, r.content
                ));
            }
            Part::Reasoning { .. } => {}
            Part::File(f) => files.push(Part::File(f.clone())),
        }
    }
    let role = if m.role == Role::Tool {
        Role::User
    } else {
        m.role
    };
    let mut parts = vec![Part::text(text.trim().to_string())];
    parts.extend(files);
    Message::new(role, parts)
}

/// Finds fenced JSON call blocks in the answer and turns them into tool calls. Text around them is
/// kept; an answer with no well-formed block is left alone.
pub fn parse_calls(inferred: &mut Inferred) {
    let text = inferred.message.text();
    let mut calls = Vec::new();
    let mut kept = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        let Some(end) = after.find("```") else { break };
        let inner = after[..end].trim_start_matches("json").trim();
        match parse_call(inner) {
            Some((name, args)) => {
                kept.push_str(&rest[..start]);
                calls.push(ToolCall {
                    id: format!("call_{}", calls.len() + 1),
                    name,
                    arguments: args.to_string(),
                    opaque: None,
                });
            }
            None => kept.push_str(&rest[..start + 3 + end + 3]),
        }
        rest = &after[end + 3..];
    }
    kept.push_str(rest);
    if calls.is_empty() {
        return;
    }
    let mut parts = Vec::new();
    let kept = kept.trim();
    if !kept.is_empty() {
        parts.push(Part::text(kept));
    }
    parts.extend(calls.into_iter().map(Part::ToolCall));
    inferred.message.parts = parts;
    inferred.stop = Stop::ToolUse;
}

fn parse_call(block: &str) -> Option<(String, Value)> {
    let v: Value = serde_json::from_str(block).ok()?;
    let name = v
        .get("tool")
        .or_else(|| v.get("name"))?
        .as_str()?
        .to_string();
    let args = v.get("arguments").cloned().unwrap_or_else(|| json!({}));
    args.is_object().then_some((name, args))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::Usage;

    fn answer(text: &str) -> Inferred {
        Inferred {
            message: Message::assistant(text),
            stop: Stop::EndTurn,
            usage: Usage::default(),
            model: None,
        }
    }

    #[test]
    fn fenced_block_becomes_a_call() {
        let mut a = answer(
            "Let me check.\n```json\n{\"tool\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
        );
        parse_calls(&mut a);
        assert_eq!(a.stop, Stop::ToolUse);
        let calls = a.tool_calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(a.text(), "Let me check.");
    }

    #[test]
    fn malformed_block_stays_text() {
        let text = "```json\n{\"tool\": \"weather\", \"arguments\": {\"city\": \n```";
        let mut a = answer(text);
        parse_calls(&mut a);
        assert_eq!(a.stop, Stop::EndTurn);
        assert_eq!(a.text(), text);
    }
}
