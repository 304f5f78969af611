//! Tool names on the wire. A public name may contain `.` (`notes.search`), but the providers'
//! alphabets do not allow it (OpenAI and Anthropic: `[A-Za-z0-9_-]{1,64}`; Gemini similar). Names
//! are reshaped on the way out and mapped back on the way in, so nothing above the wire sees the
//! reshaped form.

use std::collections::HashMap;

use crate::vocab::{InferRequest, Inferred, Part, ToolChoice};

const MAX_LEN: usize = 64;

/// The mapping for one request: public name to wire name and back.
#[derive(Debug, Default)]
pub struct WireNames {
    to_wire: HashMap<String, String>,
    to_public: HashMap<String, String>,
}

fn allowed(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn reshape(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        s.push('_');
    }
    s.truncate(MAX_LEN);
    s
}

impl WireNames {
    /// Every name the request mentions (offered tools and calls in the history).
    pub fn for_request(req: &InferRequest) -> WireNames {
        let mut names: Vec<&str> = req.tools.iter().map(|t| t.name.as_str()).collect();
        for m in &req.messages {
            for p in &m.parts {
                match p {
                    Part::ToolCall(c) => names.push(&c.name),
                    Part::ToolResult(r) => names.push(&r.name),
                    _ => {}
                }
            }
        }
        let mut map = WireNames::default();
        let taken: Vec<&str> = names.iter().copied().filter(|n| allowed(n)).collect();
        for name in names {
            if allowed(name) || map.to_wire.contains_key(name) {
                continue;
            }
            let base = reshape(name);
            let mut candidate = base.clone();
            let mut n = 2;
            while taken.contains(&candidate.as_str()) || map.to_public.contains_key(&candidate) {
                let suffix = format!("_{n}");
                let mut b = base.clone();
                b.truncate(MAX_LEN - suffix.len());
                candidate = b + &suffix;
                n += 1;
            }
            map.to_wire.insert(name.to_string(), candidate.clone());
            map.to_public.insert(candidate, name.to_string());
        }
        map
    }

    pub fn is_identity(&self) -> bool {
        self.to_wire.is_empty()
    }

    fn wire<'a>(&'a self, name: &'a str) -> &'a str {
        self.to_wire.get(name).map(String::as_str).unwrap_or(name)
    }

    /// A copy of `req` with every reshaped name in wire form.
    pub fn outgoing(&self, req: &InferRequest) -> InferRequest {
        let mut out = req.clone();
        for t in &mut out.tools {
            t.name = self.wire(&t.name).to_string();
        }
        if let ToolChoice::Tool(name) = &mut out.tool_choice {
            *name = self.wire(name).to_string();
        }
        for m in &mut out.messages {
            for p in &mut m.parts {
                match p {
                    Part::ToolCall(c) => c.name = self.wire(&c.name).to_string(),
                    Part::ToolResult(r) => r.name = self.wire(&r.name).to_string(),
                    _ => {}
                }
            }
        }
        out
    }

    /// Maps the names in a response back to their public form.
    pub fn incoming(&self, inferred: &mut Inferred) {
        for p in &mut inferred.message.parts {
            if let Part::ToolCall(c) = p
                && let Some(public) = self.to_public.get(&c.name)
            {
                c.name = public.clone();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::{Message, Role, Stop, ToolCall, ToolSpec, Usage};

    fn spec(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: serde_json::json!({"type":"object"}),
        }
    }

    #[test]
    fn dotted_names_round_trip_without_clashing() {
        let req = InferRequest {
            tools: vec![spec("notes.search"), spec("notes_search"), spec("ok")],
            ..Default::default()
        };
        let names = WireNames::for_request(&req);
        let out = names.outgoing(&req);
        let wire: Vec<_> = out.tools.iter().map(|t| t.name.clone()).collect();
        assert_eq!(wire, ["notes_search_2", "notes_search", "ok"]);
        let mut inferred = Inferred {
            message: Message::new(
                Role::Assistant,
                vec![Part::ToolCall(ToolCall {
                    id: "1".into(),
                    name: "notes_search_2".into(),
                    arguments: "{}".into(),
                    opaque: None,
                })],
            ),
            stop: Stop::ToolUse,
            usage: Usage::default(),
            model: None,
        };
        names.incoming(&mut inferred);
        assert_eq!(inferred.tool_calls()[0].name, "notes.search");
    }
}
