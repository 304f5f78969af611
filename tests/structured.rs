//! Structured output through the library against the fake provider, in each wire style: the
//! request carries the style's native field (OpenAI `response_format`, Gemini
//! `responseJsonSchema`) or the forced `structured_output` tool (Anthropic); an answer that
//! breaks the schema is sent back once with the validator's message; a second failure is an
//! `invalid_output` error.

mod support;

use colony::config::{Config, Overrides};
use colony::core::{Ask, Core};
use colony::providers::Providers;
use colony::structured::{StructuredError, StructuredOutcome, ask_structured};
use colony::vocab::Message;
use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::model_calls;

const STYLES: [&str; 3] = ["anthropic", "openai", "gemini"];

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "born": {"type": "integer"}},
        "required": ["name", "born"],
    })
}

fn ask(fake: &FakeProvider, style: &str) -> Ask {
    Ask {
        overrides: Overrides {
            provider: Some(style.into()),
            key: Some("test-key-0123456789".into()),
            base_url: Some(fake.base_url(style)),
            ..Default::default()
        },
        messages: vec![Message::user("Who wrote the first program?")],
        ..Default::default()
    }
}

/// `ask_structured` on a fresh core and runtime, as the Lua binding will call it.
fn run(
    fake: &FakeProvider,
    style: &str,
    schema: Value,
) -> Result<StructuredOutcome, StructuredError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let core = Core::new(
        Config::default(),
        Providers::new(None, None),
        rt.handle().clone(),
    );
    rt.block_on(ask_structured(
        &core,
        ask(fake, style),
        schema,
        Some("person".into()),
    ))
}

/// The answer `value` as the style's model gives it: a `structured_output` call for Anthropic
/// (what the forced tool produces), plain text elsewhere.
fn answer(style: &str, value: Value) -> Reply {
    match style {
        "anthropic" => Reply::tool_call("toolu_1", "structured_output", value),
        _ => Reply::text(value.to_string()),
    }
}

/// The text of the last message of a request body (the newest user turn).
fn last_text(style: &str, body: &Value) -> String {
    let last = match style {
        "gemini" => &body["contents"],
        _ => &body["messages"],
    }
    .as_array()
    .and_then(|a| a.last())
    .cloned()
    .expect("a last message");
    match style {
        "anthropic" => last["content"][0]["text"].as_str(),
        "openai" => last["content"].as_str(),
        _ => last["parts"][0]["text"].as_str(),
    }
    .expect("text")
    .to_string()
}

/// The request asks for structured output in the style's own way.
fn assert_asks_for_schema(style: &str, body: &Value) {
    match style {
        "anthropic" => {
            let tools = body["tools"].as_array().expect("tools");
            assert_eq!(
                tools.last().unwrap(),
                &json!({
                    "name": "structured_output",
                    "description": "Give your final answer by calling this tool with arguments that match the schema.",
                    "input_schema": schema(),
                })
            );
            assert_eq!(
                body["tool_choice"],
                json!({"type": "tool", "name": "structured_output"})
            );
        }
        "openai" => assert_eq!(
            body["response_format"],
            json!({"type": "json_schema",
                   "json_schema": {"name": "person", "schema": schema(), "strict": false}})
        ),
        _ => {
            assert_eq!(
                body["generationConfig"]["responseMimeType"],
                "application/json"
            );
            assert_eq!(body["generationConfig"]["responseJsonSchema"], schema());
        }
    }
}

#[test]
fn accepted_first_time() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(answer(style, json!({"name": "Ada Lovelace", "born": 1815})));
        let outcome = run(&fake, style, schema()).unwrap_or_else(|e| panic!("{style}: {e}"));
        assert_eq!(
            outcome.value,
            json!({"name": "Ada Lovelace", "born": 1815}),
            "{style}"
        );
        assert_eq!(outcome.attempts, 1, "{style}");
        assert_eq!(
            (outcome.usage.input, outcome.usage.output),
            (10, 5),
            "{style}"
        );
        let calls = model_calls(&fake);
        assert_eq!(calls.len(), 1, "{style}");
        assert_asks_for_schema(style, &calls[0]);
    }
}

#[test]
fn corrected_once() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(answer(
            style,
            json!({"name": "Ada Lovelace", "born": "1815"}),
        ));
        fake.push(answer(style, json!({"name": "Ada Lovelace", "born": 1815})));
        let outcome = run(&fake, style, schema()).unwrap_or_else(|e| panic!("{style}: {e}"));
        assert_eq!(outcome.value["born"], 1815, "{style}");
        assert_eq!(outcome.attempts, 2, "{style}");
        assert_eq!(
            (outcome.usage.input, outcome.usage.output),
            (20, 10),
            "{style}"
        );

        let calls = model_calls(&fake);
        assert_eq!(calls.len(), 2, "{style}");
        let correction = last_text(style, &calls[1]);
        assert!(
            correction.starts_with("Your answer did not match the required JSON schema:"),
            "{style}: {correction}"
        );
        assert!(
            correction.contains(r#"at /born: "1815" is not of type "integer""#),
            "{style}: {correction}"
        );
        assert!(
            correction.ends_with("Answer again with only JSON that matches the schema."),
            "{style}: {correction}"
        );
        // The failed answer went back as the assistant's text (for Anthropic, the forced call's
        // arguments), and the second request asks for the schema again.
        let second = calls[1].to_string();
        assert!(second.contains(r#"\"born\":\"1815\""#), "{style}: {second}");
        assert_asks_for_schema(style, &calls[1]);
    }
}

#[test]
fn refused_after_two_invalid_answers() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(answer(style, json!({"name": "Ada Lovelace"})));
        fake.push(answer(style, json!({"name": 1815, "born": 1815})));
        let err = run(&fake, style, schema()).expect_err(style);
        assert_eq!(err.kind(), "invalid_output", "{style}");
        let StructuredError::Invalid { message, text } = &err else {
            panic!("{style}: {err:?}");
        };
        assert!(
            message.contains(r#"at /name: 1815 is not of type "string""#),
            "{style}: {message}"
        );
        assert_eq!(
            serde_json::from_str::<Value>(text).unwrap(),
            json!({"name": 1815, "born": 1815}),
            "{style}"
        );
        // The first answer's finding was what the correction named.
        let calls = model_calls(&fake);
        assert_eq!(calls.len(), 2, "{style}");
        assert!(
            last_text(style, &calls[1]).contains(r#""born" is a required property"#),
            "{style}"
        );
    }
}

#[test]
fn prose_and_fences_around_the_json_are_tolerated() {
    let fake = FakeProvider::start();
    fake.push(Reply::text(
        "Here you are:\n```json\n{\"name\": \"Ada Lovelace\", \"born\": 1815}\n```",
    ));
    let outcome = run(&fake, "openai", schema()).unwrap();
    assert_eq!(outcome.attempts, 1);
    assert_eq!(outcome.value["name"], "Ada Lovelace");
}

#[test]
fn text_that_is_not_json_is_corrected() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("Ada Lovelace, born 1815."));
    fake.push(Reply::text(r#"{"name": "Ada Lovelace", "born": 1815}"#));
    let outcome = run(&fake, "gemini", schema()).unwrap();
    assert_eq!(outcome.attempts, 2);
    let calls = model_calls(&fake);
    assert!(last_text("gemini", &calls[1]).contains("the answer is not JSON"));
}

#[test]
fn a_schema_that_does_not_compile_asks_nothing() {
    let fake = FakeProvider::start();
    let err = run(&fake, "openai", json!({"type": "no-such-type"})).unwrap_err();
    assert_eq!(err.kind(), "schema");
    assert!(matches!(err, StructuredError::BadSchema(_)), "{err:?}");
    assert_eq!(fake.calls(), 0);
}

#[test]
fn provider_errors_keep_their_kind() {
    let fake = FakeProvider::start();
    fake.push(Reply::status(401));
    let err = run(&fake, "anthropic", schema()).unwrap_err();
    assert_eq!(err.kind(), "auth_error");
    assert!(matches!(err, StructuredError::Provider(_)), "{err:?}");
}

#[test]
fn array_schemas_work_through_the_anthropic_tool() {
    let fake = FakeProvider::start();
    // The tool's input must be an object, so the array travels as `value`.
    fake.push(Reply::tool_call(
        "toolu_1",
        "structured_output",
        json!({"value": ["Ada", "Charles"]}),
    ));
    let list = json!({"type": "array", "items": {"type": "string"}});
    let outcome = run(&fake, "anthropic", list.clone()).unwrap();
    assert_eq!(outcome.value, json!(["Ada", "Charles"]));
    let body = &model_calls(&fake)[0];
    assert_eq!(
        body["tools"][0]["input_schema"],
        json!({"type": "object", "properties": {"value": list}, "required": ["value"]})
    );
}

#[test]
fn without_a_schema_no_tool_is_added() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("Ada Lovelace."));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let core = Core::new(
        Config::default(),
        Providers::new(None, None),
        rt.handle().clone(),
    );
    let (req, ep) = core.prepare(ask(&fake, "anthropic")).unwrap();
    let inferred = rt.block_on(core.call_provider(&req, &ep, None)).unwrap();
    assert_eq!(inferred.text(), "Ada Lovelace.");
    let body = &model_calls(&fake)[0];
    assert!(body.get("tools").is_none(), "{body}");
    assert!(body.get("tool_choice").is_none(), "{body}");
}

/// A refusal or a filtered answer is said as such after the one call: it was asked for again
/// (a second, paid call refused the same way) and read "the answer is not JSON", the refusal's
/// words lost. An answer that says the model failed is that provider error.
#[test]
fn a_refusal_is_said_and_not_asked_again() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(Reply::text("I can't help with that.").stop("refusal"));
        let err = run(&fake, style, schema()).expect_err(style);
        assert_eq!(err.kind(), "invalid_output", "{style}");
        // OpenAI's wire and Gemini's have no refusal of their own: a filter stops them.
        let stop = if style == "anthropic" {
            "refusal"
        } else {
            "content_filter"
        };
        assert_eq!(
            err.to_string(),
            format!("the model did not answer (stop = {stop}): I can't help with that."),
            "{style}"
        );
        assert_eq!(model_calls(&fake).len(), 1, "{style}");
    }
    let fake = FakeProvider::start();
    fake.push(Reply::text("").stop("MALFORMED_FUNCTION_CALL"));
    let err = run(&fake, "gemini", schema()).expect_err("gemini");
    assert_eq!(err.kind(), "provider_error");
    assert_eq!(model_calls(&fake).len(), 1);
}
