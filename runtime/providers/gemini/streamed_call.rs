//! Function-call arguments streamed in pieces (Vertex `streamFunctionCallArguments`): each
//! `partialArgs` entry sets one JSON path of the arguments. What cannot be read is described in an
//! `Err(String)`; the response reader makes it a parse error.

use serde_json::{Map, Value, json};

/// A call whose arguments arrive as `partialArgs` entries: `{jsonPath: "$.a.b[0]", stringValue |
/// numberValue | boolValue | nullValue, willContinue}`. A string with `willContinue` goes on in
/// the next entry for the same path.
pub(super) struct StreamedCall {
    pub(super) name: String,
    pub(super) id: Option<String>,
    pub(super) args: Value,
    pub(super) extra: Map<String, Value>,
    open_string: Option<String>,
}

/// The longest array a partial argument may index into, so a bad index cannot exhaust memory.
const MAX_PARTIAL_INDEX: usize = 10_000;

#[derive(Debug, PartialEq)]
pub(super) enum Step {
    Key(String),
    Index(usize),
}

impl StreamedCall {
    pub(super) fn new(name: &str, id: Option<&str>, extra: Map<String, Value>) -> StreamedCall {
        StreamedCall {
            name: name.to_string(),
            id: id.map(str::to_string),
            args: Value::Object(Map::new()),
            extra,
            open_string: None,
        }
    }

    pub(super) fn apply(&mut self, partial: &Value) -> Result<(), String> {
        let entries = partial
            .as_array()
            .ok_or_else(|| "functionCall.partialArgs is not an array".to_string())?;
        for entry in entries {
            let path = entry
                .get("jsonPath")
                .and_then(Value::as_str)
                .ok_or_else(|| "a partialArgs entry has no jsonPath".to_string())?;
            let steps = json_path(path)?;
            let continues = entry.get("willContinue") == Some(&Value::Bool(true));
            let slot = slot(&mut self.args, &steps)?;
            if let Some(piece) = entry.get("stringValue").and_then(Value::as_str) {
                match slot {
                    Value::String(s) if self.open_string.as_deref() == Some(path) => {
                        s.push_str(piece)
                    }
                    other => *other = json!(piece),
                }
                self.open_string = continues.then(|| path.to_string());
                continue;
            }
            *slot = if let Some(n) = entry.get("numberValue") {
                n.clone()
            } else if let Some(b) = entry.get("boolValue") {
                b.clone()
            } else if entry.get("nullValue").is_some() {
                Value::Null
            } else {
                return Err(format!("partialArgs entry {path} has no value"));
            };
            self.open_string = None;
        }
        Ok(())
    }
}

pub(super) fn all_complete(partial: &Value) -> bool {
    partial.as_array().is_some_and(|entries| {
        entries
            .iter()
            .all(|e| e.get("willContinue") != Some(&Value::Bool(true)))
    })
}

/// `$.recipe.ingredients[0].name`, `$['odd.key']` -> steps below the root object.
pub(super) fn json_path(path: &str) -> Result<Vec<Step>, String> {
    let bad = || format!("cannot read the jsonPath {path:?}");
    let mut rest = path.strip_prefix('$').ok_or_else(bad)?;
    let mut steps = Vec::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            if end == 0 {
                return Err(bad());
            }
            steps.push(Step::Key(after[..end].to_string()));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']').ok_or_else(bad)?;
            let inside = &after[..end];
            let quoted = inside
                .strip_prefix('\'')
                .and_then(|s| s.strip_suffix('\''))
                .or_else(|| inside.strip_prefix('"').and_then(|s| s.strip_suffix('"')));
            steps.push(match quoted {
                Some(key) => Step::Key(key.to_string()),
                None => Step::Index(inside.parse().map_err(|_| bad())?),
            });
            rest = &after[end + 1..];
        } else {
            return Err(bad());
        }
    }
    if steps.is_empty() {
        return Err(bad());
    }
    Ok(steps)
}

/// The value at `steps` under `root`, creating objects and arrays on the way.
pub(super) fn slot<'v>(root: &'v mut Value, steps: &[Step]) -> Result<&'v mut Value, String> {
    let mut current = root;
    for step in steps {
        current = match step {
            Step::Key(key) => {
                if current.is_null() {
                    *current = Value::Object(Map::new());
                }
                let Value::Object(map) = current else {
                    return Err(format!(
                        "partialArgs put key {key:?} into something not an object"
                    ));
                };
                map.entry(key.clone()).or_insert(Value::Null)
            }
            Step::Index(index) => {
                if current.is_null() {
                    *current = Value::Array(Vec::new());
                }
                let Value::Array(items) = current else {
                    return Err(format!(
                        "partialArgs put index {index} into something not an array"
                    ));
                };
                if *index > MAX_PARTIAL_INDEX {
                    return Err(format!("partialArgs index {index} is too large"));
                }
                if items.len() <= *index {
                    items.resize(index + 1, Value::Null);
                }
                &mut items[*index]
            }
        };
    }
    Ok(current)
}
