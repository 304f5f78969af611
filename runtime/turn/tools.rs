//! Tools as a turn sees them: the spec offered to the model, the schema its arguments are checked
//! against, a deadline, and the handler that runs the call.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use crate::script::FnId;
use crate::vocab::ToolSpec;

/// How long a tool may run when it does not say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// A tool written in Rust: arguments in (already checked against the schema), a JSON value or
/// an error message out. An embedding application registers these beside a program's Lua tools.
pub type NativeFn = Arc<dyn Fn(Value) -> BoxFuture<'static, Result<Value, String>> + Send + Sync>;

/// A tool written in Rust whose result may carry files (an MCP server's images and resources).
pub type AttachingFn = Arc<
    dyn Fn(Value) -> BoxFuture<'static, Result<(String, Vec<crate::vocab::FileRef>), String>>
        + Send
        + Sync,
>;

/// What runs a call.
#[derive(Clone)]
pub enum Handler {
    /// A script's function, reached through the program's [`crate::script::Script`].
    Lua(FnId),
    /// An async Rust closure, run on the core.
    Native(NativeFn),
    /// An async Rust closure whose result carries files, run on the core.
    Attaching(AttachingFn),
    /// The turn's own `view_file` ([`crate::files::view`]): it reads the conversation's files.
    ViewFile,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handler::Lua(id) => write!(f, "Lua({id})"),
            Handler::Native(_) => f.write_str("Native"),
            Handler::Attaching(_) => f.write_str("Attaching"),
            Handler::ViewFile => f.write_str("ViewFile"),
        }
    }
}

/// A tool ready for turns. Cheap to clone; the compiled schema is shared.
#[derive(Clone)]
pub struct ToolDef {
    pub spec: ToolSpec,
    pub timeout: Duration,
    pub handler: Handler,
    /// Whether the MCP server may export it.
    pub exportable: bool,
    /// Whether running it twice is harmless: a call cut off by a restart runs again instead of
    /// answering "interrupted by a restart".
    pub idempotent: bool,
    /// How often it may be called (one bucket for every turn that offers it); a call over it is
    /// answered `rate_limited` without running.
    pub rate: Option<crate::rate::RateLimit>,
    validator: Arc<jsonschema::Validator>,
}

impl std::fmt::Debug for ToolDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolDef")
            .field("name", &self.spec.name)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Where a tool's `parameters` break the JSON Schema meta-schema, as its author wrote them: the
/// property (`address.city`, or the top level) and the keyword that is wrong, then what is
/// wrong with it (`property city, keyword "type": "strin" is not valid under ...`).
fn schema_fault(e: &jsonschema::ValidationError<'_>) -> String {
    let pointer = e.instance_path().to_string();
    let mut segments = pointer
        .split('/')
        .skip(1)
        .map(|s| s.replace("~1", "/").replace("~0", "~"));
    let mut property = Vec::new();
    let mut keyword = None;
    while let Some(seg) = segments.next() {
        if seg == "properties"
            && let Some(name) = segments.next()
        {
            property.push(name);
            continue;
        }
        keyword = Some(seg);
        break;
    }
    let at = if property.is_empty() {
        "the top level".to_string()
    } else {
        format!("property {}", property.join("."))
    };
    match keyword {
        Some(k) => format!("{at}, keyword {k:?}: {e}"),
        None => format!("{at}: {e}"),
    }
}

impl ToolDef {
    /// Checks the name and compiles the schema (expanding the shorthand first).
    pub fn new(
        name: &str,
        description: &str,
        parameters: Value,
        timeout: Option<Duration>,
        handler: Handler,
    ) -> Result<ToolDef, String> {
        if name.is_empty() || name.chars().any(|c| c.is_whitespace()) {
            return Err(format!("a tool name must be a word, not {name:?}"));
        }
        let parameters =
            expand_shorthand(parameters).map_err(|e| format!("tool {name}: parameters: {e}"))?;
        let validator = jsonschema::validator_for(&parameters).map_err(|e| {
            format!(
                "tool {name}: parameters are not a valid JSON Schema: {}",
                schema_fault(&e)
            )
        })?;
        Ok(ToolDef {
            spec: ToolSpec {
                name: name.to_string(),
                description: description.to_string(),
                parameters,
            },
            timeout: timeout.unwrap_or(DEFAULT_TIMEOUT),
            handler,
            exportable: false,
            idempotent: false,
            rate: None,
            validator: Arc::new(validator),
        })
    }

    /// A tool whose handler is an async Rust closure:
    ///
    /// ```
    /// use colony::turn::ToolDef;
    /// let add = ToolDef::native("add", "Adds two numbers", serde_json::json!({"a": "number", "b": "number"}),
    ///     |args| async move {
    ///         let (a, b) = (args["a"].as_f64().unwrap_or(0.0), args["b"].as_f64().unwrap_or(0.0));
    ///         Ok(serde_json::json!(a + b))
    ///     }).unwrap();
    /// assert_eq!(add.spec.name, "add");
    /// ```
    pub fn native<F, Fut>(
        name: &str,
        description: &str,
        parameters: Value,
        handler: F,
    ) -> Result<ToolDef, String>
    where
        F: Fn(Value) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Value, String>> + Send + 'static,
    {
        let run: NativeFn = Arc::new(move |args| Box::pin(handler(args)));
        ToolDef::new(name, description, parameters, None, Handler::Native(run))
    }

    /// The schema's complaints about `args`, one line each with its path; empty when valid.
    pub fn violations(&self, args: &Value) -> Vec<String> {
        self.validator
            .iter_errors(args)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect()
    }

    /// Whether the schema declares a property `name` (what `pin` overwrites).
    pub fn has_property(&self, name: &str) -> bool {
        self.spec
            .parameters
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|p| p.contains_key(name))
    }
}

const SHORT_TYPES: &[&str] = &[
    "string", "integer", "number", "boolean", "object", "array", "null",
];

/// Expands `{ city = "string", days = "integer?" }` into a JSON Schema object: each value a type
/// name, `?` marking it optional. A table that already looks like a schema (it has `type`,
/// `properties`, `$schema`, `anyOf`, ...) passes unchanged; so does an empty one, which takes no
/// arguments.
pub fn expand_shorthand(parameters: Value) -> Result<Value, String> {
    let Value::Object(map) = &parameters else {
        if parameters.is_null() {
            return Ok(json!({"type": "object", "properties": {}}));
        }
        let what = match &parameters {
            Value::Array(_) => "a list",
            Value::String(_) => "a string",
            Value::Number(_) => "a number",
            _ => "a boolean",
        };
        return Err(format!(
            "{what}, not a JSON Schema or the shorthand {{ name = \"type\", ... }}"
        ));
    };
    if map.is_empty() {
        return Ok(json!({"type": "object", "properties": {}}));
    }
    let schema_words = [
        "type",
        "properties",
        "$schema",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "required",
    ];
    if map.keys().any(|k| schema_words.contains(&k.as_str())) {
        // A model's tool takes its arguments by name: every provider refuses the request (a
        // 400 at the first turn) when the parameters' schema is of another type.
        let object = match map.get("type") {
            None => true,
            Some(Value::String(t)) => t == "object",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
            Some(_) => false,
        };
        if !object {
            return Err(format!(
                "a tool's parameters are an object schema (its arguments by name), not type {}: \
                 say {{ value = \"string\" }} for one argument",
                map["type"]
            ));
        }
        return Ok(parameters);
    }
    let mut properties = Map::new();
    let mut required = Vec::new();
    for (name, kind) in map {
        let Some(kind) = kind.as_str() else {
            return Err(format!(
                "{name}: in the shorthand each value is a type name such as \"string\" or \"integer?\""
            ));
        };
        let (kind, optional) = match kind.strip_suffix('?') {
            Some(k) => (k, true),
            None => (kind, false),
        };
        if !SHORT_TYPES.contains(&kind) {
            return Err(format!(
                "{name}: unknown type {kind:?} (types: {})",
                SHORT_TYPES.join(", ")
            ));
        }
        properties.insert(name.clone(), json!({ "type": kind }));
        if !optional {
            required.push(Value::String(name.clone()));
        }
    }
    required.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
    Ok(json!({"type": "object", "properties": properties, "required": required}))
}

/// `*` matches any run of characters, `?` any one; everything else matches itself.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn go(p: &[char], n: &[char]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some('*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some('?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    go(&p, &n)
}

/// The tools left after `allow` (when given, only those matching) and `deny` (never these).
pub fn narrow(tools: &[ToolDef], allow: &[String], deny: &[String]) -> Vec<ToolDef> {
    tools
        .iter()
        .filter(|t| allow.is_empty() || allow.iter().any(|p| glob_match(p, &t.spec.name)))
        .filter(|t| !deny.iter().any(|p| glob_match(p, &t.spec.name)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorthand_expands_with_optional_marks() {
        let s = expand_shorthand(json!({"city": "string", "days": "integer?"})).unwrap();
        assert_eq!(
            s,
            json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]})
        );
        let full = json!({"type": "object", "properties": {}});
        assert_eq!(expand_shorthand(full.clone()).unwrap(), full);
        let e = expand_shorthand(json!({"city": "text"})).unwrap_err();
        assert!(e.contains("unknown type \"text\""), "{e}");
        // A list (`{"string"}` in Lua) and a schema of another type than an object are said
        // for what they are (a provider refused the latter at the first turn).
        let e = expand_shorthand(json!(["string"])).unwrap_err();
        assert!(e.starts_with("a list, not a JSON Schema"), "{e}");
        let e = expand_shorthand(json!({"type": "string"})).unwrap_err();
        assert!(e.contains("not type \"string\""), "{e}");
        let nullable = json!({"type": ["object", "null"], "properties": {}});
        assert_eq!(expand_shorthand(nullable.clone()).unwrap(), nullable);
    }

    #[test]
    fn globs() {
        assert!(glob_match("notes.*", "notes.search"));
        assert!(!glob_match("notes.*", "mail.send"));
        assert!(glob_match("*", "x"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "ac"));
    }

    #[test]
    fn violations_name_the_path() {
        let t = ToolDef::new(
            "t",
            "",
            json!({"city": "string", "days": "integer?"}),
            None,
            Handler::Lua(1),
        )
        .unwrap();
        assert!(t.violations(&json!({"city": "x"})).is_empty());
        let v = t.violations(&json!({"city": "x", "days": "three"}));
        assert_eq!(v.len(), 1);
        assert!(v[0].starts_with("/days: "), "{v:?}");
        assert!(!t.violations(&json!({})).is_empty());
    }
}
