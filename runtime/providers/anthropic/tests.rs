//! The anthropic wire style through its codec: request bodies, whole answers and streams.

use std::time::Duration;

use super::*;
use crate::providers::ToolsLevel;
use crate::providers::sse::assemble_bytes;

const KEY: &str = "sk-ant-test-not-a-real-key";

fn endpoint(key: Option<&str>) -> Endpoint {
    Endpoint {
        reads: Default::default(),
        provider: "anthropic".into(),
        style: Style::Anthropic,
        base_url: "https://api.anthropic.com/v1".into(),
        key: key.map(str::to_string),
        tools_level: ToolsLevel::Native,
        timeout: Duration::from_secs(30),
        max_response_bytes: crate::providers::body::DEFAULT_MAX_RESPONSE_BYTES,
        max_concurrent_calls: crate::providers::DEFAULT_MAX_CONCURRENT_CALLS,
    }
}

fn body(req: &InferRequest) -> Value {
    Anthropic.request(req, &endpoint(Some(KEY)), false).json()
}

fn request(messages: Vec<Message>) -> InferRequest {
    InferRequest {
        model: "claude-sonnet-4-5".into(),
        messages,
        ..Default::default()
    }
}

fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "Weather for a city".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    }
}

fn call(id: &str, name: &str, arguments: &str) -> Part {
    Part::ToolCall(ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
        opaque: None,
    })
}

fn result(call_id: &str, content: &str, is_error: bool) -> Part {
    Part::ToolResult(ToolResult {
        call_id: call_id.into(),
        name: "get_weather".into(),
        content: content.into(),
        is_error,
    })
}

fn header<'a>(wire: &'a WireRequest, name: &str) -> Option<&'a str> {
    wire.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Wraps payloads as Anthropic SSE (`event:` named after the JSON `type`).
fn sse(payloads: &[Value]) -> Vec<u8> {
    let mut out = String::new();
    for p in payloads {
        let kind = p["type"].as_str().unwrap_or_default();
        out.push_str(&format!("event: {kind}\ndata: {p}\n\n"));
    }
    out.into_bytes()
}

fn message_start() -> Value {
    json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
        "model": "claude-test", "content": [], "stop_reason": null,
        "usage": {"input_tokens": 10, "output_tokens": 1}}})
}

// ---- outgoing ----

#[test]
fn url_and_headers() {
    let wire = Anthropic.request(
        &request(vec![Message::user("hi")]),
        &endpoint(Some(KEY)),
        false,
    );
    assert_eq!(wire.url, "https://api.anthropic.com/v1/messages");
    assert_eq!(header(&wire, "x-api-key"), Some(KEY));
    assert_eq!(header(&wire, "anthropic-version"), Some("2023-06-01"));
    assert_eq!(header(&wire, "content-type"), Some("application/json"));
    // The key travels in its header only, never in the body.
    assert!(!wire.json().to_string().contains(KEY));
}

#[test]
fn no_key_header_without_a_key_and_trailing_slash_tolerated() {
    let mut ep = endpoint(None);
    ep.base_url = "http://127.0.0.1:8080/v1/".into();
    let wire = Anthropic.request(&request(vec![Message::user("hi")]), &ep, false);
    assert_eq!(wire.url, "http://127.0.0.1:8080/v1/messages");
    assert_eq!(header(&wire, "x-api-key"), None);
    ep.key = Some(String::new());
    let wire = Anthropic.request(&request(vec![Message::user("hi")]), &ep, false);
    assert_eq!(header(&wire, "x-api-key"), None);
}

#[test]
fn plain_text_request() {
    let b = body(&request(vec![Message::user("Hello")]));
    assert_eq!(
        b,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 4096,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
        })
    );
}

#[test]
fn knobs_system_temperature_max_tokens_stop_sequences() {
    let mut req = request(vec![Message::user("Hello")]);
    req.system = Some("Be brief.".into());
    req.temperature = Some(0.25);
    req.max_tokens = Some(321);
    req.stop_sequences = vec!["END".into(), "\n\nHuman:".into()];
    let b = body(&req);
    assert_eq!(b["system"], "Be brief.");
    assert_eq!(b["temperature"], 0.25);
    assert_eq!(b["max_tokens"], 321);
    assert_eq!(b["stop_sequences"], json!(["END", "\n\nHuman:"]));
    assert!(b.get("stream").is_none());
    assert!(b.get("tools").is_none());
    assert!(b.get("tool_choice").is_none());
}

#[test]
fn system_messages_join_the_system_prompt() {
    let mut req = request(vec![
        Message::new(Role::System, vec![Part::text("Second rule.")]),
        Message::user("Hello"),
        Message::new(Role::System, vec![Part::text("Third rule.")]),
    ]);
    req.system = Some("First rule.".into());
    let b = body(&req);
    assert_eq!(b["system"], "First rule.\n\nSecond rule.\n\nThird rule.");
    assert_eq!(b["messages"].as_array().map(Vec::len), Some(1));
    assert_eq!(b["messages"][0]["role"], "user");
}

#[test]
fn streaming_flag() {
    let req = request(vec![Message::user("Hello")]);
    let wire = Anthropic.request(&req, &endpoint(Some(KEY)), true);
    assert_eq!(wire.json()["stream"], true);
}

#[test]
fn extra_is_merged_over_the_body_last() {
    let mut req = request(vec![Message::user("Hello")]);
    req.max_tokens = Some(100);
    req.extra = Some(json!({
        "max_tokens": 16000,
        "thinking": {"type": "enabled", "budget_tokens": 10000},
        "metadata": {"user_id": "u-1"},
    }));
    let b = body(&req);
    let mut expected = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
    });
    super::merge_extra(&mut expected, req.extra.as_ref());
    assert_eq!(b, expected);
    assert_eq!(b["max_tokens"], 16000);
    assert_eq!(b["thinking"]["budget_tokens"], 10000);
}

#[test]
fn tools_out() {
    let mut req = request(vec![Message::user("Weather?")]);
    req.tools = vec![weather_tool()];
    let b = body(&req);
    assert_eq!(
        b["tools"],
        json!([{
            "name": "get_weather",
            "description": "Weather for a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }])
    );
}

#[test]
fn a_tool_without_a_schema_takes_no_arguments() {
    let mut req = request(vec![Message::user("Ping?")]);
    req.tools = vec![ToolSpec {
        name: "ping".into(),
        description: String::new(),
        parameters: Value::Null,
    }];
    assert_eq!(
        body(&req)["tools"],
        json!([{"name": "ping", "description": "", "input_schema": {"type": "object", "properties": {}}}])
    );
}

#[test]
fn tool_choice_variants() {
    let choice = |choice: ToolChoice, tools: bool| {
        let mut req = request(vec![Message::user("Weather?")]);
        req.tool_choice = choice;
        if tools {
            req.tools = vec![weather_tool()];
        }
        body(&req).get("tool_choice").cloned()
    };
    assert_eq!(
        choice(ToolChoice::Auto, true),
        Some(json!({"type": "auto"}))
    );
    assert_eq!(
        choice(ToolChoice::None, true),
        Some(json!({"type": "none"}))
    );
    assert_eq!(
        choice(ToolChoice::Required, true),
        Some(json!({"type": "any"}))
    );
    assert_eq!(
        choice(ToolChoice::Tool("get_weather".into()), true),
        Some(json!({"type": "tool", "name": "get_weather"}))
    );
    assert_eq!(choice(ToolChoice::Auto, false), None);
    assert_eq!(choice(ToolChoice::None, false), None);
}

#[test]
fn assistant_tool_calls_go_out_as_tool_use_with_decoded_input() {
    let req = request(vec![
        Message::user("Weather in Paris and Rome?"),
        Message::new(
            Role::Assistant,
            vec![
                Part::text("Checking."),
                call("toolu_1", "get_weather", r#"{"city": "Paris"}"#),
                call("toolu_2", "get_weather", "{\"city\": \"Ro"),
                call("toolu_3", "list_cities", ""),
                call("toolu_4", "get_weather", "[1, 2]"),
            ],
        ),
    ]);
    let b = body(&req);
    assert_eq!(
        b["messages"][1],
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}},
            {"type": "tool_use", "id": "toolu_3", "name": "list_cities", "input": {}},
            {"type": "tool_use", "id": "toolu_4", "name": "get_weather", "input": {}},
        ]})
    );
}

#[test]
fn tool_results_go_back_in_one_user_message_before_its_text() {
    let req = request(vec![
        Message::user("Weather?"),
        Message::new(
            Role::Assistant,
            vec![
                call("toolu_1", "get_weather", r#"{"city":"Paris"}"#),
                call("toolu_2", "get_weather", r#"{"city":"Nowhere"}"#),
            ],
        ),
        Message::new(Role::Tool, vec![result("toolu_1", "18C, sunny", false)]),
        Message::new(Role::Tool, vec![result("toolu_2", "unknown city", true)]),
        Message::user("And tomorrow?"),
    ]);
    let b = body(&req);
    let messages = b["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(messages.len(), 3, "{messages:#?}");
    assert_eq!(
        messages[2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C, sunny"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "unknown city", "is_error": true},
            {"type": "text", "text": "And tomorrow?"},
        ]})
    );
}

#[test]
fn tool_results_lead_even_when_user_text_came_first() {
    let req = request(vec![
        Message::new(Role::Assistant, vec![call("toolu_1", "get_weather", "{}")]),
        Message::user("(note)"),
        Message::new(Role::Tool, vec![result("toolu_1", "", false)]),
    ]);
    let b = body(&req);
    assert_eq!(
        b["messages"][1]["content"],
        json!([
            {"type": "tool_result", "tool_use_id": "toolu_1"},
            {"type": "text", "text": "(note)"},
        ])
    );
}

#[test]
fn consecutive_same_role_messages_merge_and_empty_ones_vanish() {
    let req = request(vec![
        Message::user("one"),
        Message::user("two"),
        Message::assistant(""),
        Message::user("three"),
    ]);
    let b = body(&req);
    assert_eq!(
        b["messages"],
        json!([{"role": "user", "content": [
            {"type": "text", "text": "one"},
            {"type": "text", "text": "two"},
            {"type": "text", "text": "three"},
        ]}])
    );
}

#[test]
fn opaque_thinking_goes_back_verbatim_first_and_foreign_opaque_is_dropped() {
    let thinking =
        json!({"type": "thinking", "thinking": "Let me think.", "signature": "EqQBCgIYAh..."});
    let redacted = json!({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a..."});
    let req = request(vec![
        Message::user("Hi"),
        Message::new(
            Role::Assistant,
            vec![
                Part::Reasoning {
                    text: "Let me think.".into(),
                    opaque: Some(Opaque {
                        style: Style::Anthropic,
                        data: thinking.clone(),
                    }),
                },
                Part::Reasoning {
                    text: String::new(),
                    opaque: Some(Opaque {
                        style: Style::Anthropic,
                        data: redacted.clone(),
                    }),
                },
                Part::Reasoning {
                    text: "gemini thoughts".into(),
                    opaque: Some(Opaque {
                        style: Style::Gemini,
                        data: json!({"thoughtSignature": "abc"}),
                    }),
                },
                Part::Reasoning {
                    text: "bare reasoning".into(),
                    opaque: None,
                },
                Part::Text {
                    text: "Hello!".into(),
                    opaque: Some(Opaque {
                        style: Style::Openai,
                        data: json!({"reasoning_content": "x"}),
                    }),
                },
                Part::ToolCall(ToolCall {
                    id: "toolu_1".into(),
                    name: "get_weather".into(),
                    arguments: "{}".into(),
                    opaque: Some(Opaque {
                        style: Style::Gemini,
                        data: json!({"thoughtSignature": "sig"}),
                    }),
                }),
            ],
        ),
    ]);
    let b = body(&req);
    assert_eq!(
        b["messages"][1]["content"],
        json!([
            thinking,
            redacted,
            {"type": "text", "text": "Hello!"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
        ])
    );
    let text = b.to_string();
    assert!(!text.contains("gemini thoughts") && !text.contains("thoughtSignature"));
    assert!(!text.contains("bare reasoning") && !text.contains("reasoning_content"));
}

#[test]
fn thinking_kept_after_text_is_moved_first() {
    let thinking = json!({"type": "thinking", "thinking": "t", "signature": "s"});
    let req = request(vec![
        Message::user("Hi"),
        Message::new(
            Role::Assistant,
            vec![
                Part::text("Answer."),
                Part::Reasoning {
                    text: "t".into(),
                    opaque: Some(Opaque {
                        style: Style::Anthropic,
                        data: thinking.clone(),
                    }),
                },
            ],
        ),
    ]);
    assert_eq!(
        body(&req)["messages"][1]["content"],
        json!([thinking, {"type": "text", "text": "Answer."}])
    );
}

#[test]
fn models_request_and_ids() {
    let wire = Anthropic.models_request(&endpoint(Some(KEY)));
    assert_eq!(wire.url, "https://api.anthropic.com/v1/models?limit=1000");
    assert_eq!(wire.headers, headers(&endpoint(Some(KEY))));
    assert_eq!(header(&wire, "x-api-key"), Some(KEY));
    assert_eq!(header(&wire, "anthropic-version"), Some("2023-06-01"));
    let listing = json!({
        "data": [
            {"type": "model", "id": "claude-sonnet-4-5-20250929", "display_name": "Claude Sonnet 4.5"},
            {"type": "model", "id": "claude-haiku-4-5-20251001", "display_name": "Claude Haiku 4.5"},
            {"type": "model"},
        ],
        "has_more": false,
    });
    assert_eq!(
        Anthropic.parse_models(&listing).unwrap(),
        vec!["claude-sonnet-4-5-20250929", "claude-haiku-4-5-20251001"]
    );
    assert!(Anthropic.parse_models(&json!({})).is_err());
}

// ---- incoming ----

#[test]
fn stop_reason_table() {
    let cases = [
        ("end_turn", Stop::EndTurn),
        ("tool_use", Stop::ToolUse),
        ("max_tokens", Stop::MaxTokens),
        ("stop_sequence", Stop::StopSequence),
        ("refusal", Stop::Refusal),
        ("pause_turn", Stop::EndTurn),
        ("model_context_window_exceeded", Stop::MaxTokens),
        ("something_new", Stop::EndTurn),
    ];
    for (wire, stop) in cases {
        assert_eq!(stop_from_wire(Some(wire), false), stop, "{wire}");
    }
    assert_eq!(stop_from_wire(None, true), Stop::ToolUse);
    assert_eq!(stop_from_wire(None, false), Stop::EndTurn);
}

#[test]
fn whole_response_with_thinking_round_trips() {
    let thinking = json!({"type": "thinking", "thinking": "The user wants weather.", "signature": "WaUjzkypQ2mUEVM36O2TxuC06KN8xyfbJwyem2dw3URve/op91XWHOEBLLqIOMfFG/UvLEczmEsUjavL...."});
    let redacted = json!({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB5URj"});
    let response = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [thinking, redacted, {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 5, "output_tokens": 7, "cache_read_input_tokens": 3, "cache_creation_input_tokens": 2},
    });
    let inferred = Anthropic
        .parse(response.to_string().as_bytes())
        .expect("parses");
    assert_eq!(inferred.stop, Stop::ToolUse);
    assert_eq!(
        inferred.usage,
        Usage {
            // 5 uncached + 3 read from the cache + 2 written to it
            input: 10,
            output: 7,
            cache_read: 3,
            cache_write: 2,
            reasoning: 0
        }
    );
    assert_eq!(
        inferred.message.parts[0],
        Part::Reasoning {
            text: "The user wants weather.".into(),
            opaque: Some(Opaque {
                style: Style::Anthropic,
                data: thinking.clone()
            }),
        }
    );
    assert_eq!(inferred.tool_calls()[0].arguments, r#"{"city":"Paris"}"#);

    // Sent back on the next request, the assistant content is what came.
    let req = request(vec![Message::user("Weather?"), inferred.message.clone()]);
    assert_eq!(body(&req)["messages"][1]["content"], response["content"]);
}

#[test]
fn malformed_whole_responses_are_parse_errors() {
    let e = Anthropic.parse(b"not json").expect_err("not JSON");
    assert_eq!(e.kind(), "parse_error");
    let e = Anthropic
        .parse(br#"{"type":"message"}"#)
        .expect_err("no content");
    assert!(e.to_string().contains("content"), "{e}");
    let e = Anthropic
        .parse(br#"{"content":[{"type":"tool_use","name":"x","input":{}}]}"#)
        .expect_err("no id");
    assert!(e.to_string().contains("`id`"), "{e}");
}

#[test]
fn an_error_body_with_a_2xx_status_is_an_error() {
    let body = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    let e = Anthropic.parse(body).expect_err("error body");
    assert_eq!(e.kind(), "provider_error");
    assert!(e.is_transient());
}

#[test]
fn streamed_thinking_and_redacted_thinking_are_kept_whole() {
    let bytes = sse(&[
        message_start(),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Let me "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "think."}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "redacted_thinking", "data": "EmwKAhgB"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Hi"}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}}),
        json!({"type": "message_stop"}),
    ]);
    let (result, deltas) = assemble_bytes(&bytes, Anthropic.assembler());
    let inferred = result.expect("assembles");
    assert_eq!(deltas, vec!["Hi"], "thinking is not visible text");
    assert_eq!(
        inferred.message.parts,
        vec![
            Part::Reasoning {
                text: "Let me think.".into(),
                opaque: Some(Opaque {
                    style: Style::Anthropic,
                    data: json!({"type": "thinking", "thinking": "Let me think.", "signature": "EqQBCgIYAhIM"}),
                }),
            },
            Part::Reasoning {
                text: String::new(),
                opaque: Some(Opaque {
                    style: Style::Anthropic,
                    data: json!({"type": "redacted_thinking", "data": "EmwKAhgB"}),
                }),
            },
            Part::text("Hi"),
        ]
    );
    assert_eq!(inferred.usage.input, 10);
    assert_eq!(inferred.usage.output, 9);
    assert_eq!(inferred.model.as_deref(), Some("claude-test"));
}

/// A usage count that is no count makes the usage unreadable, whole or streamed (not reported,
/// which a token budget does not pass): `input_tokens: -100` was skipped and the output
/// counted, so a token budget saw a fraction of what was used.
#[test]
fn garbled_usage_is_not_counted() {
    for garbage in [json!(-100), json!(1.5), json!("100")] {
        let response = json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": garbage, "output_tokens": 7},
        });
        let inferred = Anthropic.parse(response.to_string().as_bytes()).unwrap();
        assert_eq!(inferred.usage, Usage::default(), "{garbage}");
        let bytes = sse(&[
            message_start(),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": garbage}}),
            json!({"type": "message_stop"}),
        ]);
        let (result, _) = assemble_bytes(&bytes, Anthropic.assembler());
        assert_eq!(result.unwrap().usage, Usage::default(), "{garbage}");
    }
}

#[test]
fn a_mid_stream_error_event_is_an_error_not_a_short_answer() {
    let bytes = sse(&[
        message_start(),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Par"}}),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]);
    let (result, deltas) = assemble_bytes(&bytes, Anthropic.assembler());
    let e = result.expect_err("error event");
    assert_eq!(deltas, vec!["Par"]);
    assert_eq!(e.kind(), "provider_error");
    assert!(e.is_transient());
    assert!(e.to_string().contains("Overloaded"), "{e}");

    let bytes = sse(&[
        message_start(),
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}),
    ]);
    let e = assemble_bytes(&bytes, Anthropic.assembler())
        .0
        .expect_err("error event");
    assert_eq!(e.kind(), "api_error");
    assert!(!e.is_transient());
}

#[test]
fn a_stream_cut_before_message_stop_is_a_fetch_error() {
    let bytes = sse(&[
        message_start(),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
    ]);
    let e = assemble_bytes(&bytes, Anthropic.assembler())
        .0
        .expect_err("cut");
    assert_eq!(
        e,
        ProviderError::Fetch("the stream ended before message_stop".into())
    );
    assert!(e.is_transient());
}

#[test]
fn malformed_stream_events_are_parse_errors() {
    let mut assembler = Anthropic.assembler();
    let e = assembler
        .event("message_start", "{not json", &mut |_| {})
        .expect_err("bad JSON");
    assert_eq!(e.kind(), "parse_error");

    let mut assembler = Anthropic.assembler();
    let e = assembler
        .event(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"x"}}"#,
            &mut |_| {},
        )
        .expect_err("unknown block");
    assert!(e.to_string().contains("never started"), "{e}");

    let mut assembler = Anthropic.assembler();
    let start = r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"n","input":{}}}"#;
    assembler
        .event("content_block_start", start, &mut |_| {})
        .expect("start");
    let e = assembler
        .event(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}"#,
            &mut |_| {},
        )
        .expect_err("mismatched delta");
    assert!(e.to_string().contains("text_delta"), "{e}");
}

#[test]
fn unknown_events_and_blocks_are_skipped() {
    let bytes = sse(&[
        message_start(),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "some_future_event"}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
        json!({"type": "message_stop"}),
    ]);
    let inferred = assemble_bytes(&bytes, Anthropic.assembler())
        .0
        .expect("assembles");
    assert!(inferred.message.parts.is_empty());
    assert_eq!(inferred.stop, Stop::EndTurn);
}
