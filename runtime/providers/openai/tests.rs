//! The openai wire style through its codec: request bodies, whole answers and streams.

use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::providers::sse::assemble_bytes;
use crate::providers::{ToolsLevel, merge_extra};
use crate::vocab::{ToolChoice, ToolResult, ToolSpec};

const KEY: &str = "sk-test-0123456789abcdef";

fn endpoint(key: Option<&str>) -> Endpoint {
    Endpoint {
        reads: Default::default(),
        provider: "openai".into(),
        style: Style::Openai,
        base_url: "https://api.example.com/v1/".into(),
        key: key.map(str::to_string),
        tools_level: ToolsLevel::Native,
        timeout: Duration::from_secs(30),
        max_response_bytes: crate::providers::body::DEFAULT_MAX_RESPONSE_BYTES,
        max_concurrent_calls: crate::providers::DEFAULT_MAX_CONCURRENT_CALLS,
    }
}

fn request(req: &InferRequest) -> WireRequest {
    OpenAi.request(req, &endpoint(Some(KEY)), false)
}

fn base() -> InferRequest {
    InferRequest {
        model: "gpt-4o".into(),
        messages: vec![Message::user("Hi")],
        ..InferRequest::default()
    }
}

fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "Weather for a city".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    }
}

fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
        opaque: None,
    }
}

fn result(call_id: &str, content: &str, is_error: bool) -> Part {
    Part::ToolResult(ToolResult {
        call_id: call_id.into(),
        name: "get_weather".into(),
        content: content.into(),
        is_error,
    })
}

/// Runs data payloads through the assembler as an SSE stream.
fn stream(payloads: &[&str]) -> (Result<Inferred, ProviderError>, Vec<String>) {
    let sse: String = payloads.iter().map(|p| format!("data: {p}\n\n")).collect();
    assemble_bytes(sse.as_bytes(), OpenAi.assembler())
}

// --- outgoing ------------------------------------------------------------------------------

#[test]
fn url_and_key_header() {
    let wire = request(&base());
    assert_eq!(wire.url, "https://api.example.com/v1/chat/completions");
    assert_eq!(
        wire.headers,
        vec![("authorization".to_string(), format!("Bearer {KEY}"))]
    );
    assert!(
        !wire.json().to_string().contains(KEY),
        "the key is only a header"
    );
}

#[test]
fn no_key_no_header() {
    for key in [None, Some("")] {
        let wire = OpenAi.request(&base(), &endpoint(key), false);
        assert!(wire.headers.is_empty());
    }
}

#[test]
fn minimal_body_has_only_model_and_messages() {
    let wire = request(&base());
    assert_eq!(
        wire.json(),
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]})
    );
}

#[test]
fn response_schema_is_a_json_schema_response_format() {
    let schema = json!({"type": "object", "properties": {"age": {"type": "integer"}}});
    let req = InferRequest {
        response_schema: Some(ResponseSchema {
            name: "person".into(),
            schema: schema.clone(),
        }),
        ..base()
    };
    let body = request(&req).json();
    assert_eq!(
        body["response_format"],
        json!({"type": "json_schema",
               "json_schema": {"name": "person", "schema": schema, "strict": false}})
    );
    // Nothing else moves: the body without the field is the plain request's body.
    let mut rest = body.clone();
    rest.as_object_mut().unwrap().remove("response_format");
    assert_eq!(rest, request(&base()).json());
}

#[test]
fn response_schema_name_is_reshaped_to_the_wire_alphabet() {
    assert_eq!(schema_name("person"), "person");
    assert_eq!(schema_name("my schema.v2"), "my_schema_v2");
    assert_eq!(schema_name(""), "response");
    assert_eq!(schema_name(&"x".repeat(80)).len(), 64);
}

#[test]
fn no_response_schema_leaves_the_body_unchanged() {
    // A full request: every field that goes on the wire, and no structured output.
    let req = InferRequest {
        system: Some("Be brief.".into()),
        tools: vec![weather_tool()],
        temperature: Some(0.5),
        max_tokens: Some(100),
        stop_sequences: vec!["END".into()],
        ..base()
    };
    let body = request(&req).json();
    assert_eq!(
        body,
        json!({
            "model": "gpt-4o",
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Hi"}],
            "temperature": 0.5,
            "max_tokens": 100,
            "stop": ["END"],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
            "tool_choice": "auto",
        })
    );
}

#[test]
fn system_temperature_max_tokens_stop() {
    let req = InferRequest {
        system: Some("Be brief.".into()),
        temperature: Some(0.25),
        max_tokens: Some(512),
        stop_sequences: vec!["END".into(), "\n\n".into()],
        ..base()
    };
    let body = request(&req).json();
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(
        body["messages"][1],
        json!({"role": "user", "content": "Hi"})
    );
    assert_eq!(body["temperature"], json!(0.25));
    assert_eq!(body["max_tokens"], json!(512));
    assert_eq!(body["stop"], json!(["END", "\n\n"]));
    assert!(body.get("max_completion_tokens").is_none());
    assert!(body.get("tools").is_none() && body.get("tool_choice").is_none());
    assert!(body.get("stream").is_none() && body.get("stream_options").is_none());
}

#[test]
fn system_messages_stay_in_place() {
    let req = InferRequest {
        system: Some("First.".into()),
        messages: vec![
            Message::user("a"),
            Message::new(Role::System, vec![Part::text("Now in French.")]),
            Message::user("b"),
        ],
        ..base()
    };
    let roles: Vec<Value> = request(&req).json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| json!([m["role"], m["content"]]))
        .collect();
    assert_eq!(
        roles,
        vec![
            json!(["system", "First."]),
            json!(["user", "a"]),
            json!(["system", "Now in French."]),
            json!(["user", "b"]),
        ]
    );
}

#[test]
fn streaming_asks_for_usage() {
    let body = OpenAi.request(&base(), &endpoint(None), true).json();
    assert_eq!(body["stream"], json!(true));
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
}

#[test]
fn extra_is_merged_last() {
    let req = InferRequest {
        temperature: Some(0.5),
        max_tokens: Some(100),
        extra: Some(json!({
            "temperature": 1.0,
            "max_completion_tokens": 2000,
            "stream_options": {"continuous_usage_stats": true},
            "reasoning_effort": "low",
        })),
        ..base()
    };
    let body = OpenAi.request(&req, &endpoint(None), true).json();
    let mut expected = OpenAi
        .request(
            &InferRequest {
                extra: None,
                ..req.clone()
            },
            &endpoint(None),
            true,
        )
        .json();
    merge_extra(&mut expected, req.extra.as_ref());
    assert_eq!(body, expected);
    assert_eq!(body["temperature"], json!(1.0));
    assert_eq!(body["max_tokens"], json!(100));
    assert_eq!(body["max_completion_tokens"], json!(2000));
    assert_eq!(body["reasoning_effort"], json!("low"));
    assert_eq!(
        body["stream_options"],
        json!({"include_usage": true, "continuous_usage_stats": true})
    );
}

#[test]
fn tools_out() {
    let bare = ToolSpec {
        name: "now".into(),
        description: String::new(),
        parameters: Value::Null,
    };
    let req = InferRequest {
        tools: vec![weather_tool(), bare],
        ..base()
    };
    let body = request(&req).json();
    assert_eq!(
        body["tools"],
        json!([
            {"type": "function", "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            }},
            {"type": "function", "function": {
                "name": "now",
                "parameters": {"type": "object", "properties": {}},
            }},
        ])
    );
    assert_eq!(body["tool_choice"], json!("auto"));
}

#[test]
fn tool_choices() {
    let cases = [
        (ToolChoice::Auto, json!("auto")),
        (ToolChoice::None, json!("none")),
        (ToolChoice::Required, json!("required")),
        (
            ToolChoice::Tool("get_weather".into()),
            json!({"type": "function", "function": {"name": "get_weather"}}),
        ),
    ];
    for (choice, wire) in cases {
        let req = InferRequest {
            tools: vec![weather_tool()],
            tool_choice: choice.clone(),
            ..base()
        };
        assert_eq!(request(&req).json()["tool_choice"], wire, "{choice:?}");
    }
    // Without tools neither field goes out, whatever the choice.
    let req = InferRequest {
        tool_choice: ToolChoice::Required,
        ..base()
    };
    let body = request(&req).json();
    assert!(body.get("tools").is_none() && body.get("tool_choice").is_none());
}

#[test]
fn assistant_tool_calls_and_results() {
    let req = InferRequest {
        messages: vec![
            Message::user("Weather in Paris and the time?"),
            Message::new(
                Role::Assistant,
                vec![
                    Part::ToolCall(call("call_1", "get_weather", r#"{"city":"Paris"}"#)),
                    Part::ToolCall(call("call_2", "now", "")),
                ],
            ),
            Message::new(
                Role::Tool,
                vec![
                    result("call_1", "18C, cloudy", false),
                    result("call_2", "clock unavailable", true),
                ],
            ),
            Message::new(
                Role::Assistant,
                vec![
                    Part::text("Let me check again."),
                    Part::ToolCall(call("call_3", "now", "{}")),
                ],
            ),
            Message::new(
                Role::User,
                vec![result("call_3", "12:00", false), Part::text("Thanks")],
            ),
        ],
        ..base()
    };
    let messages = request(&req).json()["messages"].clone();
    assert_eq!(
        messages,
        json!([
            {"role": "user", "content": "Weather in Paris and the time?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "now", "arguments": "{}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C, cloudy"},
            {"role": "tool", "tool_call_id": "call_2", "content": "Error: clock unavailable"},
            {"role": "assistant", "content": "Let me check again.", "tool_calls": [
                {"id": "call_3", "type": "function",
                 "function": {"name": "now", "arguments": "{}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_3", "content": "12:00"},
            {"role": "user", "content": "Thanks"},
        ])
    );
}

/// Opaque data this style wrote.
fn ours(data: Value) -> Option<Opaque> {
    Some(Opaque {
        style: Style::Openai,
        data,
    })
}

#[test]
fn opaque_data_goes_back_only_to_this_style() {
    let theirs = Some(Opaque {
        style: Style::Anthropic,
        data: json!({"type": "thinking", "thinking": "...", "signature": "sig"}),
    });
    let mut signed = call("call_1", "get_weather", r#"{"city":"Paris"}"#);
    signed.opaque = ours(json!({"extra_content": {"google": {"thought_signature": "c2ln"}}}));
    let mut foreign = call("call_2", "get_weather", r#"{"city":"Rome"}"#);
    foreign.opaque = theirs.clone();
    let req = InferRequest {
        messages: vec![
            Message::user("Weather?"),
            Message::new(
                Role::Assistant,
                vec![
                    Part::Reasoning {
                        text: "The user wants weather.".into(),
                        opaque: ours(json!({"reasoning_content": "The user wants weather."})),
                    },
                    Part::Reasoning {
                        text: "hidden".into(),
                        opaque: theirs.clone(),
                    },
                    // Opaque data never overrides what colony itself sets.
                    Part::Text {
                        text: "Checking.".into(),
                        opaque: ours(json!({"content": "forged", "role": "user"})),
                    },
                    Part::ToolCall(signed),
                    Part::ToolCall(foreign),
                ],
            ),
        ],
        ..base()
    };
    let assistant = request(&req).json()["messages"][1].clone();
    assert_eq!(
        assistant,
        json!({
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                 "extra_content": {"google": {"thought_signature": "c2ln"}}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}},
            ],
            "reasoning_content": "The user wants weather.",
        })
    );
}

#[test]
fn an_opaque_field_two_parts_carry_is_written_once_the_first() {
    let req = InferRequest {
        messages: vec![
            Message::user("Hi"),
            Message::new(
                Role::Assistant,
                vec![
                    Part::Reasoning {
                        text: "first".into(),
                        opaque: ours(json!({"reasoning_content": "first"})),
                    },
                    Part::Text {
                        text: "Hello.".into(),
                        opaque: ours(json!({"reasoning_content": "second", "role": "user"})),
                    },
                ],
            ),
        ],
        ..base()
    };
    let wire = request(&req);
    // The bytes themselves: a JSON reader keeps one of two equal keys and would hide a repeat.
    let text = String::from_utf8(wire.body.clone()).unwrap();
    assert_eq!(text.matches("\"reasoning_content\"").count(), 1, "{text}");
    assert_eq!(text.matches("\"role\"").count(), 2, "{text}");
    assert_eq!(wire.json()["messages"][1]["reasoning_content"], "first");
}

#[test]
fn reasoning_round_trips_unchanged() {
    let body = br#"{"model":"deepseek-reasoner","choices":[{"index":0,"finish_reason":"tool_calls",
        "message":{"role":"assistant","content":"","reasoning_content":"Need the tool.",
        "tool_calls":[{"index":0,"id":"call_0","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]}}]}"#;
    let inferred = OpenAi.parse(body).unwrap();
    let req = InferRequest {
        messages: vec![Message::user("Weather in Oslo?"), inferred.message],
        ..base()
    };
    assert_eq!(
        request(&req).json()["messages"][1],
        json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{"id": "call_0", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}],
            "reasoning_content": "Need the tool.",
        })
    );
}

#[test]
fn models_endpoint() {
    let wire = OpenAi.models_request(&endpoint(Some(KEY)));
    assert_eq!(wire.url, "https://api.example.com/v1/models");
    assert_eq!(
        wire.headers,
        vec![("authorization".to_string(), format!("Bearer {KEY}"))]
    );
    let listing = json!({"object": "list", "data": [
        {"id": "gpt-4o", "object": "model", "owned_by": "system"},
        {"id": "llama3.2:latest", "object": "model"},
        {"object": "model"},
    ]});
    assert_eq!(
        OpenAi.parse_models(&listing).unwrap(),
        vec!["gpt-4o", "llama3.2:latest"]
    );
    // Another shape (a base URL that reaches something else) is not an empty list.
    assert_eq!(
        OpenAi.parse_models(&json!({"foo": 1})),
        Err("the answer has no \"data\" list of models".to_string())
    );
    assert!(OpenAi.parse_models(&json!({"data": "x"})).is_err());
    // Ollama with no model pulled: Go's nil slice.
    assert_eq!(
        OpenAi.parse_models(&json!({"object": "list", "data": null})),
        Ok(vec![])
    );
}

// --- incoming ------------------------------------------------------------------------------

#[test]
fn stop_reasons() {
    let cases = [
        ("\"stop\"", "", Stop::EndTurn),
        ("null", "", Stop::EndTurn),
        ("\"length\"", "", Stop::MaxTokens),
        ("\"content_filter\"", "", Stop::ContentFilter),
        ("\"tool_calls\"", TOOL, Stop::ToolUse),
        ("\"function_call\"", TOOL, Stop::ToolUse),
        // Kimi-style: calls with a plain stop, or no finish reason at all.
        ("\"stop\"", TOOL, Stop::ToolUse),
        ("null", TOOL, Stop::ToolUse),
        ("\"insufficient_system_resource\"", "", Stop::Error),
    ];
    const TOOL: &str =
        r#","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]"#;
    for (reason, calls, stop) in cases {
        let body = format!(
            r#"{{"choices":[{{"index":0,"finish_reason":{reason},"message":{{"role":"assistant","content":"x"{calls}}}}}]}}"#
        );
        assert_eq!(
            OpenAi.parse(body.as_bytes()).unwrap().stop,
            stop,
            "{reason} {calls}"
        );
    }
}

#[test]
fn refusal_is_text_and_stop() {
    let body = br#"{"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":null,"refusal":"I can't help with that."}}]}"#;
    let inferred = OpenAi.parse(body).unwrap();
    assert_eq!(inferred.text(), "I can't help with that.");
    assert_eq!(inferred.stop, Stop::Refusal);
}

#[test]
fn usage_mapping() {
    let body = br#"{"choices":[{"index":0,"finish_reason":"stop","message":{"content":"x"}}],
        "usage":{"prompt_tokens":100,"completion_tokens":50,"total_tokens":150,
        "prompt_tokens_details":{"cached_tokens":40,"cache_write_tokens":7},
        "completion_tokens_details":{"reasoning_tokens":30}}}"#;
    assert_eq!(
        OpenAi.parse(body).unwrap().usage,
        Usage {
            input: 100,
            output: 50,
            cache_read: 40,
            cache_write: 7,
            reasoning: 30,
        }
    );
    // DeepSeek and Kimi name their cache hits differently.
    let deepseek = json!({"prompt_tokens": 9, "prompt_cache_hit_tokens": 8});
    assert_eq!(read_usage(&deepseek).cache_read, 8);
    let kimi = json!({"prompt_tokens": 9, "cached_tokens": 6});
    assert_eq!(read_usage(&kimi).cache_read, 6);
    // Floats with an integer's value are counts; a count that is none makes the usage
    // unreadable (not reported, which a token budget does not pass), never 0 and the rest.
    assert_eq!(
        read_usage(&json!({"prompt_tokens": 100.0, "completion_tokens": 2})).input,
        100
    );
    for garbage in [json!(-100), json!(1e23), json!(1.5), json!("100")] {
        let usage = json!({"prompt_tokens": garbage, "completion_tokens": 1});
        assert_eq!(read_usage(&usage), Usage::default(), "{usage}");
    }
}

#[test]
fn error_bodies_and_garbage_are_errors() {
    let body = br#"{"error":{"message":"Invalid model","type":"invalid_request_error","code":"model_not_found"}}"#;
    let err = OpenAi.parse(body).unwrap_err();
    assert_eq!(err.kind(), "api_error");
    assert!(err.to_string().contains("Invalid model"));
    for bad in [
        &b"<html>502</html>"[..],
        br#"{"choices":[]}"#,
        br#"{"choices":{"0":{}}}"#,
        br#"{"choices":[{"index":0,"finish_reason":"stop"}]}"#,
        br#"{"choices":[{"index":0,"message":{"content":42}}]}"#,
        br#"{"choices":[{"index":0,"message":{"tool_calls":[{"id":"c","function":{"arguments":"{}"}}]}}]}"#,
    ] {
        let err = OpenAi.parse(bad).unwrap_err();
        assert_eq!(err.kind(), "parse_error", "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn arguments_split_anywhere_are_joined() {
    let open = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_9","type":"function","function":{"name":"note","arguments":""}}]},"finish_reason":null}]}"#;
    let fragments = [
        r#"{\"te"#,
        r#"xt\": \"a \\"#,
        r#"\"quoted\\\" w"#,
        r#"ord\"}"#,
    ];
    let mut payloads = vec![open.to_string()];
    for f in fragments {
        payloads.push(format!(
            r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":"{f}"}}}}]}},"finish_reason":null}}]}}"#
        ));
    }
    payloads.push(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#.into());
    payloads.push("[DONE]".into());
    let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
    let inferred = stream(&refs).0.unwrap();
    let calls = inferred.tool_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].arguments, r#"{"text": "a \"quoted\" word"}"#);
    assert_eq!(
        calls[0].decoded().unwrap(),
        json!({"text": "a \"quoted\" word"})
    );
    assert_eq!(inferred.stop, Stop::ToolUse);
}

#[test]
fn repeated_id_and_name_do_not_duplicate() {
    // Kimi-style: every delta repeats id and name; no tool_calls finish reason.
    let (result, deltas) = stream(&[
        r#"{"choices":[{"index":0,"delta":{"content":"Looking."}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"get_weather:0","type":"function","function":{"name":"get_weather","arguments":"{\"city\":"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"get_weather:0","type":"function","function":{"name":"get_weather","arguments":"\"Paris\"}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop","usage":{"prompt_tokens":30,"completion_tokens":12,"cached_tokens":10}}]}"#,
        "[DONE]",
    ]);
    let inferred = result.unwrap();
    assert_eq!(deltas, vec!["Looking."]);
    assert_eq!(
        inferred.tool_calls(),
        vec![call("get_weather:0", "get_weather", r#"{"city":"Paris"}"#)]
    );
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(
        (
            inferred.usage.input,
            inferred.usage.output,
            inferred.usage.cache_read
        ),
        (30, 12, 10)
    );
}

#[test]
fn calls_without_index_are_told_apart_by_id() {
    let (result, _) = stream(&[
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{\"x\""}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":":1}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"b","function":{"name":"g","arguments":"{}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        "[DONE]",
    ]);
    assert_eq!(
        result.unwrap().tool_calls(),
        vec![call("a", "f", r#"{"x":1}"#), call("b", "g", "{}")]
    );
}

#[test]
fn opaque_tool_call_fields_are_kept() {
    let (result, _) = stream(&[
        r#"{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"fc_1","type":"function","function":{"name":"f","arguments":"{}"},"extra_content":{"google":{"thought_signature":"c2ln"}}}]},"finish_reason":"tool_calls"}]}"#,
        "[DONE]",
    ]);
    let calls = result.unwrap().tool_calls();
    assert_eq!(
        calls[0].opaque,
        Some(Opaque {
            style: Style::Openai,
            data: json!({"extra_content": {"google": {"thought_signature": "c2ln"}}}),
        })
    );
}

#[test]
fn openrouter_reasoning_and_comments() {
    let sse = concat!(
        ": OPENROUTER PROCESSING\n\n",
        "data: {\"model\":\"x/y\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"reasoning\":\"Think\"}}]}\n\n",
        ": OPENROUTER PROCESSING\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\",\"reasoning\":\"ing.\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,\"completion_tokens_details\":{\"reasoning_tokens\":4}}}\n\n",
        "data: [DONE]\n\n",
    );
    let (result, deltas) = assemble_bytes(sse.as_bytes(), OpenAi.assembler());
    let inferred = result.unwrap();
    assert_eq!(deltas, vec!["Hello", "!"]);
    assert_eq!(
        inferred.message.parts,
        vec![
            Part::Reasoning {
                text: "Thinking.".into(),
                opaque: Some(Opaque {
                    style: Style::Openai,
                    data: json!({"reasoning": "Thinking."}),
                }),
            },
            Part::text("Hello!"),
        ]
    );
    assert_eq!(inferred.usage.reasoning, 4);
    assert_eq!(inferred.model.as_deref(), Some("x/y"));
}

#[test]
fn streamed_content_filter() {
    let (result, deltas) = stream(&[
        r#"{"choices":[{"index":0,"delta":{"content":"Once upon"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}"#,
        "[DONE]",
    ]);
    let inferred = result.unwrap();
    assert_eq!(deltas, vec!["Once upon"]);
    assert_eq!(inferred.stop, Stop::ContentFilter);
}

#[test]
fn mid_stream_error_is_an_error() {
    let (result, deltas) = stream(&[
        r#"{"choices":[{"index":0,"delta":{"content":"Partial"}}]}"#,
        r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","code":null}}"#,
        "[DONE]",
    ]);
    assert_eq!(deltas, vec!["Partial"]);
    let err = result.unwrap_err();
    assert_eq!(err.kind(), "provider_error");
    assert!(err.is_transient());
    assert!(err.to_string().contains("server had an error"));

    // OpenRouter sends the error beside a choice with finish_reason "error".
    let (result, _) = stream(&[
        r#"{"error":{"code":"invalid_prompt","message":"Prompt rejected"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}"#,
    ]);
    let err = result.unwrap_err();
    assert_eq!(err.kind(), "api_error");
    assert!(!err.is_transient());

    // A named error event.
    let sse = "event: error\ndata: {\"error\":{\"message\":\"Overloaded\",\"type\":\"overloaded_error\"}}\n\n";
    let err = assemble_bytes(sse.as_bytes(), OpenAi.assembler())
        .0
        .unwrap_err();
    assert!(err.is_transient());
}

#[test]
fn stream_end_without_done() {
    // Closed after the finishing chunk: accepted.
    let (result, _) =
        stream(&[r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}"#]);
    assert_eq!(result.unwrap().text(), "Hi");
    // Closed before any finish reason: cut off.
    let (result, deltas) = stream(&[r#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#]);
    assert_eq!(deltas, vec!["Hi"]);
    assert_eq!(
        result.unwrap_err(),
        ProviderError::Fetch("the stream ended before [DONE]".into())
    );
}

#[test]
fn garbage_in_a_stream_is_a_parse_error() {
    for payloads in [
        &["not json"][..],
        &[r#"{"choices":"nope"}"#][..],
        &[r#"{"choices":[{"index":0,"delta":{"tool_calls":{"index":0}}}]}"#][..],
        &[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}"#,
            "[DONE]",
        ][..],
    ] {
        let err = stream(payloads).0.unwrap_err();
        assert_eq!(err.kind(), "parse_error", "{payloads:?}");
    }
}

/// A model list gets 30 s, not the use-type's timeout (600 s by default, sized for a model's
/// answer): against a server that never answers, `colony models` sat silent for ten minutes.
// On a paused clock, which jumps to the timeout when nothing else is left to do.
#[tokio::test(start_paused = true)]
async fn a_model_list_from_a_server_that_never_answers_ends_at_30_s() {
    // Accepted by the kernel, never answered.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut ep = endpoint(Some(KEY));
    ep.base_url = format!("http://{}/v1/", server.local_addr().unwrap());
    ep.timeout = Duration::from_secs(600);
    let e = crate::providers::Providers::new(None, None)
        .models(&ep)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no model list within 30 s"), "{e}");
}

/// A stream that carries no choice at all is an answer of none, as a whole answer without
/// choices is (`parse_error`): it read as an empty reply, and `colony ask` printed nothing and
/// exited 0. A usage-only last chunk (`stream_options.include_usage`) after choices is normal.
#[test]
fn a_stream_of_no_choices_is_a_parse_error() {
    let (got, _) = stream(&[r#"{"id":"x","choices":[]}"#, "[DONE]"]);
    let err = got.unwrap_err();
    assert_eq!(err.kind(), "parse_error", "{err}");
    assert!(err.to_string().contains("carried no choices"), "{err}");
    let (got, _) = stream(&[
        r#"{"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}]}"#,
        r#"{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        r#"{"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
        "[DONE]",
    ]);
    assert_eq!(got.unwrap().text(), "hi");
}
