//! Structured output: an answer that is JSON matching a schema.
//!
//! **The Anthropic rewrite** ([`prepare`] / [`finish`]). OpenAI-style and Gemini-style servers take
//! the schema natively (their codecs map [`InferRequest::response_schema`] to `response_format`
//! and `responseJsonSchema`); the stable Anthropic Messages API has no JSON-schema output, but a
//! forced tool call is constrained to its `input_schema` just as well. So, like the text fallback
//! for tools ([`super::text_tools`]), the request is rewritten before the codec: a tool named
//! [`TOOL_NAME`] taking the schema as its parameters is added (the caller's own tools stay) and
//! forced with `tool_choice`; after parsing, that call's arguments become the answer's text. Above
//! the provider the answer looks the same in every style: one text part holding the JSON.
//!
//! The validation loop above the providers (ask, validate, correct once) is
//! [`crate::structured`].

use serde_json::{Map, Value, json};

use crate::vocab::{InferRequest, Inferred, Part, Stop, ToolChoice, ToolSpec};

/// The tool the Anthropic rewrite forces.
pub const TOOL_NAME: &str = "structured_output";

const TOOL_DESCRIPTION: &str =
    "Give your final answer by calling this tool with arguments that match the schema.";

/// The name a schema goes by when the caller gives none (OpenAI requires one).
pub const DEFAULT_NAME: &str = "response";

/// `req` rewritten for a style without native structured output: the schema becomes a forced
/// tool. A request without a schema comes back unchanged.
///
/// A tool's input must be an object, so a schema for anything else (an array, a string, an
/// object-or-null) is wrapped as the property `value` of an object, with its `$defs` /
/// `definitions` moved up beside it so that `#/$defs/...` references still resolve; [`finish`]
/// unwraps it.
pub fn prepare(req: &InferRequest) -> InferRequest {
    let mut out = req.clone();
    let Some(schema) = out.response_schema.take() else {
        return out;
    };
    out.tools.retain(|t| t.name != TOOL_NAME);
    out.tools.push(ToolSpec {
        name: TOOL_NAME.into(),
        description: TOOL_DESCRIPTION.into(),
        parameters: tool_parameters(schema.schema),
    });
    out.tool_choice = ToolChoice::Tool(TOOL_NAME.into());
    out
}

/// Turns the forced call in an answer to the request `req` (as it was before [`prepare`]) back
/// into text: the message becomes one text part holding the arguments' JSON, and a `tool_use`
/// stop becomes `end_turn` (another stop, such as `max_tokens`, is kept: it says why the JSON
/// may be cut short). An answer without the call is left alone; validation reports it.
pub fn finish(req: &InferRequest, inferred: &mut Inferred) {
    let Some(schema) = &req.response_schema else {
        return;
    };
    let Some(call) = inferred.message.tool_calls().find(|c| c.name == TOOL_NAME) else {
        return;
    };
    let text = if wraps(&schema.schema) {
        // Arguments without `value` go back as they are, for validation to name the problem.
        call.decoded()
            .ok()
            .and_then(|mut args| args.get_mut("value").map(Value::take))
            .map(|value| value.to_string())
            .unwrap_or_else(|| call.arguments.clone())
    } else if call.arguments.trim().is_empty() {
        "{}".to_string()
    } else {
        call.arguments.clone()
    };
    inferred.message.parts = vec![Part::text(text)];
    if inferred.stop == Stop::ToolUse {
        inferred.stop = Stop::EndTurn;
    }
}

/// Whether a schema must be wrapped to serve as a tool's input: only `type: "object"` need not.
fn wraps(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) != Some("object")
}

fn tool_parameters(schema: Value) -> Value {
    if !wraps(&schema) {
        return schema;
    }
    let mut wrapper = Map::new();
    wrapper.insert("type".into(), json!("object"));
    let mut inner = schema;
    if let Value::Object(fields) = &mut inner {
        for key in ["$defs", "definitions"] {
            if let Some(defs) = fields.remove(key) {
                wrapper.insert(key.into(), defs);
            }
        }
    }
    wrapper.insert("properties".into(), json!({ "value": inner }));
    wrapper.insert("required".into(), json!(["value"]));
    Value::Object(wrapper)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::ToolCall;
    use crate::vocab::{Message, ResponseSchema, Role, Usage};

    fn schema_req(schema: Value) -> InferRequest {
        InferRequest {
            model: "claude-test".into(),
            messages: vec![Message::user("Who?")],
            response_schema: Some(ResponseSchema {
                name: "person".into(),
                schema,
            }),
            ..Default::default()
        }
    }

    fn person() -> Value {
        json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})
    }

    fn answer_with_call(arguments: &str) -> Inferred {
        Inferred {
            message: Message::new(
                Role::Assistant,
                vec![Part::ToolCall(ToolCall {
                    id: "toolu_1".into(),
                    name: TOOL_NAME.into(),
                    arguments: arguments.into(),
                    opaque: None,
                })],
            ),
            stop: Stop::ToolUse,
            usage: Usage::default(),
            model: None,
        }
    }

    fn weather_tool() -> ToolSpec {
        ToolSpec {
            name: "get_weather".into(),
            description: "Weather for a city".into(),
            parameters: json!({"type": "object"}),
        }
    }

    #[test]
    fn prepare_adds_and_forces_the_tool() {
        let mut req = schema_req(person());
        req.tools = vec![weather_tool()];
        let out = prepare(&req);
        assert_eq!(
            out.tools,
            vec![
                weather_tool(),
                ToolSpec {
                    name: "structured_output".into(),
                    description: TOOL_DESCRIPTION.into(),
                    parameters: person(),
                },
            ]
        );
        assert_eq!(
            out.tool_choice,
            ToolChoice::Tool("structured_output".into())
        );
        assert_eq!(out.response_schema, None);
        assert_eq!(out.messages, req.messages);
    }

    #[test]
    fn anthropic_wire_carries_the_forced_tool() {
        use crate::providers::{Codec, Endpoint, ToolsLevel, anthropic::Anthropic};
        let ep = Endpoint {
            reads: Default::default(),
            provider: "anthropic".into(),
            style: crate::vocab::Style::Anthropic,
            base_url: "https://api.anthropic.com/v1".into(),
            key: None,
            tools_level: ToolsLevel::Native,
            timeout: std::time::Duration::from_secs(30),
            max_response_bytes: crate::providers::body::DEFAULT_MAX_RESPONSE_BYTES,
            max_concurrent_calls: crate::providers::DEFAULT_MAX_CONCURRENT_CALLS,
        };
        let req = schema_req(person());
        let body = Anthropic.request(&prepare(&req), &ep, false).json();
        assert_eq!(
            body["tools"],
            json!([{"name": "structured_output",
                    "description": "Give your final answer by calling this tool with arguments that match the schema.",
                    "input_schema": person()}])
        );
        assert_eq!(
            body["tool_choice"],
            json!({"type": "tool", "name": "structured_output"})
        );
        // The codec itself ignores the field: without the rewrite the body is the plain one.
        let plain = InferRequest {
            response_schema: None,
            ..req.clone()
        };
        assert_eq!(
            Anthropic.request(&req, &ep, false).json(),
            Anthropic.request(&plain, &ep, false).json()
        );
    }

    #[test]
    fn prepare_without_schema_changes_nothing() {
        let req = InferRequest {
            tools: vec![weather_tool()],
            tool_choice: ToolChoice::Required,
            ..schema_req(person())
        };
        let plain = InferRequest {
            response_schema: None,
            ..req
        };
        assert_eq!(prepare(&plain), plain);
    }

    #[test]
    fn finish_turns_the_call_into_text() {
        let req = schema_req(person());
        let mut answer = answer_with_call(r#"{"name":"Ada"}"#);
        finish(&req, &mut answer);
        assert_eq!(answer.message.parts, vec![Part::text(r#"{"name":"Ada"}"#)]);
        assert_eq!(answer.stop, Stop::EndTurn);

        // Cut short: the stop says so.
        let mut answer = answer_with_call(r#"{"name":"Ad"#);
        answer.stop = Stop::MaxTokens;
        finish(&req, &mut answer);
        assert_eq!(answer.text(), r#"{"name":"Ad"#);
        assert_eq!(answer.stop, Stop::MaxTokens);

        // Without a schema in the request, nothing happens.
        let mut answer = answer_with_call("{}");
        finish(&InferRequest::default(), &mut answer);
        assert_eq!(answer.stop, Stop::ToolUse);
        assert_eq!(answer.tool_calls().len(), 1);
    }

    #[test]
    fn non_object_schemas_are_wrapped_and_unwrapped() {
        let schema = json!({"type": "array", "items": {"$ref": "#/$defs/tag"},
                            "$defs": {"tag": {"type": "string"}}});
        let req = schema_req(schema);
        let out = prepare(&req);
        assert_eq!(
            out.tools[0].parameters,
            json!({"type": "object",
                   "$defs": {"tag": {"type": "string"}},
                   "properties": {"value": {"type": "array", "items": {"$ref": "#/$defs/tag"}}},
                   "required": ["value"]})
        );
        let mut answer = answer_with_call(r#"{"value":["a","b"]}"#);
        finish(&req, &mut answer);
        assert_eq!(answer.text(), r#"["a","b"]"#);
    }
}
