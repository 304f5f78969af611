//! Structured answers: JSON matching a schema, behind Lua's `ai.infer_structured`. Ask with the
//! schema (each style carries it its own way, [`crate::providers::structured`]), parse and
//! validate the answer locally (a server's own enforcement is not trusted: the OpenAI mapping is
//! not strict, compatible servers may ignore the field, Gemini supports a subset of JSON Schema),
//! and send a failed answer back once with the validator's messages. A refusal or a filtered
//! answer is not asked for again.

use jsonschema::Validator;
use serde_json::Value;

use crate::core::{Ask, Core};
use crate::providers::ProviderError;
use crate::providers::structured::DEFAULT_NAME;
use crate::vocab::{Message, Part, ResponseSchema, Role, Stop, Usage};

/// How many times the model is asked: the first answer, and one correction.
const MAX_ATTEMPTS: u32 = 2;

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
pub async fn ask_structured(
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
        let inferred = core.call_provider(&req, &ep, None).await?;
        usage.add(&inferred.usage);
        if let Some(e) = ProviderError::failed_answer(&inferred) {
            return Err(e.into());
        }
        let text = inferred.text();
        // A refusal or a filtered answer is said as such, and not asked for again (the same
        // request is refused the same way): it read "the answer is not JSON" after a second,
        // paid attempt, the refusal's own words lost.
        if matches!(inferred.stop, Stop::Refusal | Stop::ContentFilter) {
            let said = if text.trim().is_empty() {
                String::new()
            } else {
                format!(": {}", text.trim())
            };
            return Err(StructuredError::Invalid {
                message: format!(
                    "the model did not answer (stop = {}){said}",
                    inferred.stop.as_str()
                ),
                text,
            });
        }
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
    use serde_json::json;

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
