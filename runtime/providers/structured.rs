//! Structured output: an answer that is JSON matching a schema.
//!
//! Two pieces live here.
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
//! **The validation loop** ([`infer_structured`]), behind Lua's `ai.infer_structured`: ask with the
//! schema, parse and validate the answer locally (a server's own enforcement is not trusted: the
//! OpenAI mapping is not strict, compatible servers may ignore the field, Gemini supports a
//! subset of JSON Schema), and send a failed answer back once with the validator's messages.

use jsonschema::Validator;
use serde_json::{Map, Value, json};

use super::ProviderError;
use crate::core::{Ask, Core};
use crate::vocab::{
    InferRequest, Inferred, Message, Part, ResponseSchema, Role, Stop, ToolChoice, ToolSpec, Usage,
};

/// The tool the Anthropic rewrite forces.
pub const TOOL_NAME: &str = "structured_output";

const TOOL_DESCRIPTION: &str =
    "Give your final answer by calling this tool with arguments that match the schema.";

/// The name a schema goes by when the caller gives none (OpenAI requires one).
pub const DEFAULT_NAME: &str = "response";

/// How many times the model is asked: the first answer, and one correction.
const MAX_ATTEMPTS: u32 = 2;

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

// ---------------------------------------------------------------------------------------------
// The validation loop

/// A validated answer.
#[derive(Debug, Clone, PartialEq)]
pub struct StructuredOutcome {
    /// The answer, parsed, matching the schema.
    pub value: Value,
    /// Summed over every attempt.
    pub usage: Usage,
    /// 1 when the first answer matched, 2 when the correction did.
    pub attempts: u32,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StructuredError {
    /// The schema itself does not compile (not a schema, unknown draft, unresolvable `$ref`).
    #[error("the schema does not compile: {0}")]
    BadSchema(String),
    /// Both answers failed: not JSON, or JSON that breaks the schema. `message` names the
    /// validator's findings on the last answer; `text` is that answer.
    #[error("{message}")]
    Invalid { message: String, text: String },
    /// The model call itself failed.
    #[error(transparent)]
    Provider(#[from] ProviderError),
}

impl StructuredError {
    /// The neutral name Lua sees: `schema`, `invalid_output`, or the provider error's own kind.
    pub fn kind(&self) -> &'static str {
        match self {
            StructuredError::BadSchema(_) => "schema",
            StructuredError::Invalid { .. } => "invalid_output",
            StructuredError::Provider(e) => e.kind(),
        }
    }
}

/// Asks for an answer matching `schema` and validates it, correcting once.
///
/// The request is `ask` resolved as any other (`core.prepare`) with the schema attached under
/// `name` (default [`DEFAULT_NAME`]). An answer that is not JSON or breaks the schema is sent
/// back with the validator's messages and asked for again; a second failure is
/// [`StructuredError::Invalid`].
pub async fn infer_structured(
    core: &Core,
    ask: Ask,
    schema: Value,
    name: Option<String>,
) -> Result<StructuredOutcome, StructuredError> {
    let validator = jsonschema::validator_for(&schema)
        .map_err(|e| StructuredError::BadSchema(e.to_string()))?;
    let (mut req, ep) = core.prepare(ask)?;
    req.response_schema = Some(ResponseSchema {
        name: name.unwrap_or_else(|| DEFAULT_NAME.into()),
        schema,
    });
    let mut usage = Usage::default();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let inferred = core.infer(&req, &ep, None).await?;
        usage.add(&inferred.usage);
        let text = inferred.text();
        let problem = match check(&validator, &text) {
            Ok(value) => {
                return Ok(StructuredOutcome {
                    value,
                    usage,
                    attempts,
                });
            }
            Err(problem) => problem,
        };
        if attempts >= MAX_ATTEMPTS {
            return Err(StructuredError::Invalid {
                message: format!(
                    "the answer did not match the schema after {attempts} attempts: {problem}"
                ),
                text,
            });
        }
        req.messages.push(answer_for_history(inferred.message));
        req.messages.push(Message::user(format!(
            "Your answer did not match the required JSON schema: {problem}. \
             Answer again with only JSON that matches the schema."
        )));
    }
}

/// The answer as it goes back into the conversation. Tool calls are left out: they would need
/// results to keep the transcript valid, and the correction asks for JSON, not calls.
fn answer_for_history(message: Message) -> Message {
    let parts = message
        .parts
        .into_iter()
        .filter(|p| matches!(p, Part::Text { .. } | Part::Reasoning { .. }))
        .collect();
    Message::new(Role::Assistant, parts)
}

/// The answer's JSON if it matches, else what is wrong with it, in words for the model.
fn check(validator: &Validator, text: &str) -> Result<Value, String> {
    let value = extract_json(text).ok_or_else(|| {
        if text.trim().is_empty() {
            "the answer was empty, not JSON".to_string()
        } else {
            "the answer is not JSON".to_string()
        }
    })?;
    let problems: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| {
            let path = e.instance_path().as_str();
            let at = if path.is_empty() { "the root" } else { path };
            format!("at {at}: {}", finding(&e))
        })
        .collect();
    if problems.is_empty() {
        Ok(value)
    } else {
        Err(problems.join("; "))
    }
}

/// The longest validator message passed on as it is. A message quotes the offending value,
/// which may be the whole answer (a wrong type at the root); past this length the value is
/// replaced by the word `value`, since the correction needs the finding, not a copy.
const MAX_FINDING_CHARS: usize = 300;

fn finding(error: &jsonschema::ValidationError<'_>) -> String {
    let full = error.to_string();
    if full.chars().count() <= MAX_FINDING_CHARS {
        full
    } else {
        error.masked().to_string()
    }
}

/// The JSON in a model's answer: the whole text; else the inside of a fenced block
/// (```` ```json ... ``` ````); else the outermost `{...}` or `[...]` (prose around it).
pub fn extract_json(text: &str) -> Option<Value> {
    let text = text.trim();
    if let Ok(value) = serde_json::from_str(text) {
        return Some(value);
    }
    if let Some(value) = fenced(text).and_then(|inner| serde_json::from_str(inner).ok()) {
        return Some(value);
    }
    // Whichever bracket opens first is the outer one; the other is the fallback.
    let mut spans: Vec<(usize, usize)> = [('{', '}'), ('[', ']')]
        .into_iter()
        .filter_map(|(open, close)| Some((text.find(open)?, text.rfind(close)?)))
        .filter(|(start, end)| start < end)
        .collect();
    spans.sort();
    spans
        .into_iter()
        .find_map(|(start, end)| serde_json::from_str(&text[start..=end]).ok())
}

/// The text inside the first ``` fence, without its language tag.
fn fenced(text: &str) -> Option<&str> {
    let start = text.find("```")? + 3;
    let rest = &text[start..];
    let end = rest.find("```")?;
    let inner = &rest[..end];
    // The language tag is whatever precedes the first line break (`json`, `JSON`, nothing).
    let inner = match inner.find('\n') {
        Some(newline) if !inner[..newline].trim_start().starts_with(['{', '[']) => {
            &inner[newline + 1..]
        }
        _ => inner,
    };
    Some(inner.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::ToolCall;

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
        let body = Anthropic.request(&prepare(&req), &ep, false).body;
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
            Anthropic.request(&req, &ep, false).body,
            Anthropic.request(&plain, &ep, false).body
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

    #[test]
    fn json_is_found_in_fences_and_prose() {
        let cases = [
            (r#"{"a": 1}"#, json!({"a": 1})),
            ("```json\n{\"a\": 1}\n```", json!({"a": 1})),
            ("```\n[1, 2]\n```", json!([1, 2])),
            ("```{\"a\": 1}```", json!({"a": 1})),
            (
                "Here it is:\n```JSON\n{\"a\": 1}\n```\nDone.",
                json!({"a": 1}),
            ),
            (
                "Sure! {\"a\": {\"b\": [1]}} Hope that helps.",
                json!({"a": {"b": [1]}}),
            ),
            ("The list: [1, {\"x\": 2}] as asked.", json!([1, {"x": 2}])),
            ("  42  ", json!(42)),
        ];
        for (text, expected) in cases {
            assert_eq!(extract_json(text), Some(expected), "{text}");
        }
        assert_eq!(extract_json("no json here"), None);
        assert_eq!(extract_json("{ broken"), None);
    }

    #[test]
    fn check_names_each_violation_with_its_path() {
        let schema = json!({"type": "object",
            "properties": {"age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["age"]});
        let validator = jsonschema::validator_for(&schema).unwrap();
        assert_eq!(
            check(&validator, r#"{"age": 3, "tags": ["x"]}"#),
            Ok(json!({"age": 3, "tags": ["x"]}))
        );
        let problem = check(&validator, r#"{"age": "three", "tags": [1]}"#).unwrap_err();
        assert!(
            problem.contains("at /age: \"three\" is not of type \"integer\""),
            "{problem}"
        );
        assert!(
            problem.contains("at /tags/0: 1 is not of type \"string\""),
            "{problem}"
        );
        let problem = check(&validator, "{}").unwrap_err();
        assert!(
            problem.contains("at the root: \"age\" is a required property"),
            "{problem}"
        );
        assert_eq!(
            check(&validator, "nope"),
            Err("the answer is not JSON".into())
        );
    }

    #[test]
    fn long_values_are_not_quoted() {
        let validator = jsonschema::validator_for(&json!({"type": "array"})).unwrap();
        let long = json!({"text": "x".repeat(2000)}).to_string();
        let problem = check(&validator, &long).unwrap_err();
        assert_eq!(problem, r#"at the root: value is not of type "array""#);
    }

    #[test]
    fn error_kinds() {
        assert_eq!(StructuredError::BadSchema("x".into()).kind(), "schema");
        let invalid = StructuredError::Invalid {
            message: "m".into(),
            text: "t".into(),
        };
        assert_eq!(invalid.kind(), "invalid_output");
        assert_eq!(
            StructuredError::from(ProviderError::Fetch("reset".into())).kind(),
            "fetch_error"
        );
    }
}
