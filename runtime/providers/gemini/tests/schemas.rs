//! Tool schemas cut down to what Gemini accepts.

use super::*;

#[test]
fn schema_keys_gemini_rejects_are_stripped() {
    let schema = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "urn:x",
        "type": "object",
        "additionalProperties": false,
        "properties": {
            // Property names that look like schema keywords are kept.
            "additionalProperties": {"type": "string", "description": "a property named so"},
            "$id": {"type": "integer", "exclusiveMinimum": 0},
            "url": {"type": "string", "format": "uri"},
            "when": {"type": "string", "format": "date-time"},
            "tags": {
                "type": "array",
                "items": {"type": "object", "additionalProperties": false, "properties": {"k": {"type": "string"}}},
            },
            "maybe": {"type": ["string", "null"]},
            "kind": {"const": "fixed"},
            "either": {"oneOf": [{"type": "string"}, {"type": "number"}]},
        },
        "required": ["url", "missing"],
    });
    let out = gemini_schema(&schema).expect("has properties");
    assert_eq!(
        out,
        json!({
            "type": "object",
            "properties": {
                "additionalProperties": {"type": "string", "description": "a property named so"},
                "$id": {"type": "integer"},
                "url": {"type": "string"},
                "when": {"type": "string", "format": "date-time"},
                "tags": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"k": {"type": "string"}}},
                },
                "maybe": {"nullable": true, "type": "string"},
                "kind": {"enum": ["fixed"]},
                "either": {"anyOf": [{"type": "string"}, {"type": "number"}]},
            },
            "required": ["url"],
        })
    );
}

#[test]
fn schema_refs_and_all_of_are_inlined() {
    let schema = json!({
        "type": "object",
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
        "properties": {
            "at": {"$ref": "#/$defs/Point", "description": "where"},
            "opt": {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}]},
            "both": {"allOf": [{"$ref": "#/$defs/Point"}, {"properties": {"y": {"type": "number"}}}]},
        },
    });
    let out = gemini_schema(&schema).expect("has properties");
    let point =
        json!({"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]});
    assert_eq!(out.get("$defs"), None);
    let mut at = point.clone();
    at["description"] = json!("where");
    assert_eq!(out["properties"]["at"], at);
    let mut opt = point.clone();
    opt["nullable"] = json!(true);
    assert_eq!(out["properties"]["opt"], opt);
    assert_eq!(
        out["properties"]["both"]["properties"],
        json!({"x": {"type": "number"}, "y": {"type": "number"}})
    );
}

#[test]
fn recursive_refs_stop() {
    let schema = json!({
        "type": "object",
        "definitions": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/definitions/Node"}}}},
        "properties": {"head": {"$ref": "#/definitions/Node"}},
    });
    let out = gemini_schema(&schema).expect("has properties");
    assert!(out.to_string().len() < 10_000);
}
