//! Elicitation: a server asking our user for input in the middle of a call
//! (`elicitation/create`).
//!
//! The core does not know who the user is: a program gives an [`Elicitor`] (a Lua `on_elicit`
//! hook on the connection, the turn or the resident; `colony chat`'s question at the terminal),
//! and without one the request is declined, as a client that cannot ask anyone must. What an
//! elicitor answers is checked here, once for every kind of elicitor: the action must be one the
//! protocol knows, and an accepted form gets the schema's `default`s for the fields the answer
//! left out (SEP-1034), so a hook that only says "accept" sends a complete form.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Map, Value};

/// What a server asked, as the elicitor sees it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The server's name (as configured or given).
    pub server: String,
    /// `"form"` (fill in `schema`) or `"url"` (open `url`).
    pub mode: String,
    pub message: String,
    /// The form's JSON Schema (`requestedSchema`), for `"form"`.
    pub schema: Option<Value>,
    /// The page to open, for `"url"`.
    pub url: Option<String>,
}

/// The elicitor's answer: `accept` (with the form's `content`), `decline` or `cancel`.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub action: String,
    pub content: Option<Map<String, Value>>,
}

impl Answer {
    pub fn decline() -> Answer {
        Answer {
            action: "decline".into(),
            content: None,
        }
    }
}

/// Whoever answers a server's questions for this connection.
pub trait Elicitor: Send + Sync {
    /// Asks; `Err` is a message for the server (the hook raised, the program ended).
    fn elicit(&self, request: Request) -> BoxFuture<'static, Result<Answer, String>>;
}

/// A shared elicitor in a [`super::ServerSpec`]: specs compare equal when they share it.
#[derive(Clone)]
pub struct Hook(pub Arc<dyn Elicitor>);

impl PartialEq for Hook {
    fn eq(&self, other: &Hook) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook(elicitor)")
    }
}

/// The request as the elicitor is given it, from the wire's `elicitation/create` params.
pub fn request(server: &str, params: &Value) -> Request {
    let text = |k: &str| params.get(k).and_then(Value::as_str).map(str::to_string);
    Request {
        server: server.to_string(),
        mode: text("mode").unwrap_or_else(|| "form".into()),
        message: text("message").unwrap_or_default(),
        schema: params.get("requestedSchema").cloned(),
        url: text("url"),
    }
}

/// Reads an elicitor's answer given as JSON: `"accept"`, `"decline"`, `"cancel"`, or a table
/// `{ action = ..., content = {...} }`; a table without an action is the accepted form itself.
pub fn read_answer(v: &Value) -> Result<Answer, String> {
    let (action, content) = match v {
        Value::String(s) => (s.clone(), None),
        Value::Object(m) => match m.get("action") {
            Some(Value::String(a)) => {
                let content = match m.get("content") {
                    None | Some(Value::Null) => None,
                    Some(Value::Object(c)) => Some(c.clone()),
                    // An empty Lua table reads as an empty array.
                    Some(Value::Array(a)) if a.is_empty() => Some(Map::new()),
                    Some(other) => {
                        return Err(format!("content must be a table of fields, not {other}"));
                    }
                };
                (a.clone(), content)
            }
            Some(other) => return Err(format!("action must be a string, not {other}")),
            None => ("accept".to_string(), Some(m.clone())),
        },
        Value::Null => ("decline".to_string(), None),
        other => {
            return Err(format!(
                "on_elicit answers \"accept\", \"decline\", \"cancel\" or {{ action, content }}, not {other}"
            ));
        }
    };
    match action.as_str() {
        "accept" | "decline" | "cancel" => Ok(Answer { action, content }),
        other => Err(format!(
            "action {other:?} is not one of \"accept\", \"decline\", \"cancel\""
        )),
    }
}

/// An accepted form completed with the schema's defaults for the fields it left out.
pub fn with_defaults(mut answer: Answer, schema: Option<&Value>) -> Answer {
    if answer.action != "accept" {
        answer.content = None;
        return answer;
    }
    let mut content = answer.content.take().unwrap_or_default();
    if let Some(props) = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
    {
        for (name, prop) in props {
            if let Some(d) = prop.get("default")
                && !content.contains_key(name)
            {
                content.insert(name.clone(), d.clone());
            }
        }
    }
    answer.content = Some(content);
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_are_read_and_completed_with_defaults() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "John"},
            "age": {"type": "integer", "default": 30},
            "free": {"type": "string"}
        }});
        let a = read_answer(&json!({"action": "accept", "content": {"name": "Ann"}})).unwrap();
        let a = with_defaults(a, Some(&schema));
        assert_eq!(
            a.content.unwrap(),
            json!({"name": "Ann", "age": 30})
                .as_object()
                .unwrap()
                .clone()
        );
        let a = with_defaults(read_answer(&json!("accept")).unwrap(), Some(&schema));
        assert_eq!(a.content.unwrap()["name"], "John");
        let d = with_defaults(read_answer(&json!("decline")).unwrap(), Some(&schema));
        assert_eq!(d, Answer::decline());
        assert!(read_answer(&json!("maybe")).unwrap_err().contains("maybe"));
        assert!(read_answer(&json!(3)).is_err());
        assert_eq!(
            read_answer(&json!({"x": 1})).unwrap().content.unwrap()["x"],
            1
        );
    }
}
