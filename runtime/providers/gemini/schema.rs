//! A tool's JSON Schema cut down to what Gemini's `Schema` (a subset of OpenAPI 3.0) accepts:
//! unknown keys stripped, `$ref` and `allOf` inlined, types converted.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

/// message, so any other key is a 400 "Unknown name".
const SCHEMA_KEYS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "default",
    "example",
    "items",
    "minItems",
    "maxItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "anyOf",
    "propertyOrdering",
];

/// How many `$ref`s are followed along one path; a recursive type ends in an unconstrained schema
/// there.
const MAX_REF_DEPTH: usize = 8;

/// A JSON Schema cut down to what Gemini's `parameters` accepts, or `None` for an object with no
/// properties (Gemini rejects an `OBJECT` without properties; a tool without parameters simply
/// has none).
///
/// Applied recursively through `properties` values, `items` and `anyOf`, never to the property
/// names themselves:
/// - kept: the keys of `SCHEMA_KEYS`; everything else is stripped, notably `$schema`, `$id`,
///   `additionalProperties`, `$comment`, `examples`, `not`, `if`/`then`/`else`,
///   `patternProperties`, `exclusiveMinimum`/`exclusiveMaximum`, `multipleOf`, `uniqueItems`;
/// - local `$ref`s (`#/$defs/X`, `#/definitions/X`) are inlined (siblings win) and the
///   definitions dropped; `allOf` is merged into its parent; `oneOf` becomes `anyOf`;
/// - `type: [T, "null"]` and an `anyOf` member `{type: "null"}` become `nullable: true`;
/// - `const: "x"` becomes `enum: ["x"]`; an `enum` that is not all strings is dropped (Gemini
///   enums are strings);
/// - `format` is kept only where Gemini knows it (`enum`, `date-time` for strings; `float`,
///   `double`, `int32`, `int64` for numbers), since others (`uri`, `email`) are refused;
/// - `required` keeps only names that are among the `properties`.
pub fn gemini_schema(schema: &Value) -> Option<Value> {
    let defs = Definitions::of(schema);
    let out = defs.convert(schema, 0);
    let empty_object = out.get("type").is_none_or(|t| t == "object")
        && out
            .get("properties")
            .and_then(Value::as_object)
            .is_none_or(Map::is_empty)
        && out.get("anyOf").is_none();
    (!empty_object).then_some(out)
}

struct Definitions<'a> {
    defs: Option<&'a Map<String, Value>>,
    definitions: Option<&'a Map<String, Value>>,
}

impl<'a> Definitions<'a> {
    fn of(root: &'a Value) -> Definitions<'a> {
        Definitions {
            defs: root.get("$defs").and_then(Value::as_object),
            definitions: root.get("definitions").and_then(Value::as_object),
        }
    }

    fn lookup(&self, reference: &str) -> Option<&'a Value> {
        if let Some(name) = reference.strip_prefix("#/$defs/") {
            return self.defs?.get(name);
        }
        self.definitions?
            .get(reference.strip_prefix("#/definitions/")?)
    }

    /// The schema with `$ref` and `allOf` resolved into one flat object, and how many `$ref`s
    /// were followed to get there (counted along the path, so a recursive type stops).
    fn flatten(&self, schema: &Value, refs: usize) -> (Map<String, Value>, usize) {
        let Some(source) = schema.as_object() else {
            // `true` and other non-object schemas accept anything.
            return (Map::new(), refs);
        };
        let mut flat = Map::new();
        let mut followed = refs;
        if let Some(reference) = source.get("$ref").and_then(Value::as_str)
            && refs < MAX_REF_DEPTH
            && let Some(target) = self.lookup(reference)
        {
            (flat, followed) = self.flatten(target, refs + 1);
        }
        for (key, value) in source {
            if key != "$ref" && key != "allOf" {
                flat.insert(key.clone(), value.clone());
            }
        }
        for member in source
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (member, member_refs) = self.flatten(member, refs);
            followed = followed.max(member_refs);
            merge_schema(&mut flat, member);
        }
        (flat, followed)
    }

    fn convert(&self, schema: &Value, refs: usize) -> Value {
        let (flat, refs) = self.flatten(schema, refs);
        let mut out = Map::new();
        for (key, value) in &flat {
            match key.as_str() {
                "type" => convert_type(value, &mut out),
                "properties" => {
                    let properties: Map<String, Value> = value
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(name, prop)| (name.clone(), self.convert(prop, refs)))
                        .collect();
                    out.insert(key.clone(), Value::Object(properties));
                }
                "items" => {
                    // A tuple (`items: [...]`) has no Gemini form: its first member stands in.
                    let item = value.as_array().and_then(|a| a.first()).unwrap_or(value);
                    out.insert(key.clone(), self.convert(item, refs));
                }
                "anyOf" | "oneOf" => self.convert_any_of(value, refs, &mut out),
                "const" if value.is_string() => {
                    out.insert("enum".into(), json!([value]));
                }
                "enum"
                    if value
                        .as_array()
                        .is_some_and(|a| a.iter().all(Value::is_string)) =>
                {
                    out.insert(key.clone(), value.clone());
                }
                "enum" | "format" => {}
                _ if SCHEMA_KEYS.contains(&key.as_str()) => {
                    out.insert(key.clone(), value.clone());
                }
                _ => {}
            }
        }
        if let Some(format) = flat.get("format").and_then(Value::as_str)
            && format_known(out.get("type").and_then(Value::as_str), format)
        {
            out.insert("format".into(), json!(format));
        }
        keep_defined_required(&mut out);
        Value::Object(out)
    }

    fn convert_any_of(&self, members: &Value, refs: usize, out: &mut Map<String, Value>) {
        let members = members.as_array().map(Vec::as_slice).unwrap_or_default();
        let mut kept: Vec<Value> = Vec::new();
        for member in members {
            if member.get("type").is_some_and(|t| t == "null") {
                out.insert("nullable".into(), json!(true));
            } else {
                kept.push(self.convert(member, refs));
            }
        }
        match kept.len() {
            0 => {}
            1 => {
                if let Some(Value::Object(only)) = kept.pop() {
                    for (k, v) in only {
                        out.entry(k).or_insert(v);
                    }
                }
            }
            _ => {
                out.insert("anyOf".into(), Value::Array(kept));
            }
        }
    }
}

/// `allOf` members add their properties and requirements; other keys already set stay.
fn merge_schema(target: &mut Map<String, Value>, member: Map<String, Value>) {
    for (key, value) in member {
        match (key.as_str(), target.get_mut(&key), value) {
            ("properties", Some(Value::Object(props)), Value::Object(more)) => props.extend(more),
            ("required", Some(Value::Array(names)), Value::Array(more)) => {
                for name in more {
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
            }
            (_, None, value) => {
                target.insert(key, value);
            }
            _ => {}
        }
    }
}

fn convert_type(value: &Value, out: &mut Map<String, Value>) {
    let Some(types) = value.as_array() else {
        out.insert("type".into(), value.clone());
        return;
    };
    let real: Vec<&Value> = types.iter().filter(|t| *t != "null").collect();
    if real.len() < types.len() {
        out.insert("nullable".into(), json!(true));
    }
    match real.as_slice() {
        [] => {}
        [one] => {
            out.insert("type".into(), (*one).clone());
        }
        many => {
            let any_of: Vec<Value> = many.iter().map(|t| json!({ "type": t })).collect();
            out.insert("anyOf".into(), Value::Array(any_of));
        }
    }
}

fn format_known(kind: Option<&str>, format: &str) -> bool {
    match kind {
        Some("string") => matches!(format, "enum" | "date-time"),
        Some("number") => matches!(format, "float" | "double"),
        Some("integer") => matches!(format, "int32" | "int64"),
        _ => false,
    }
}

fn keep_defined_required(schema: &mut Map<String, Value>) {
    let defined: HashSet<String> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.retain(|name| name.as_str().is_some_and(|n| defined.contains(n)));
        if required.is_empty() {
            schema.remove("required");
        }
    }
}
