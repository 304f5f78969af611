//! What an answer reads as, whole or streamed, and how errors are classified.

use super::*;

#[test]
fn stop_reasons() {
    let stop = |reason: &str| parse(answer(json!([{"text": "x"}]), reason)).map(|i| i.stop);
    assert_eq!(stop("STOP"), Ok(Stop::EndTurn));
    assert_eq!(stop("MAX_TOKENS"), Ok(Stop::MaxTokens));
    for filtered in [
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
    ] {
        assert_eq!(stop(filtered), Ok(Stop::ContentFilter), "{filtered}");
    }
    assert_eq!(stop("OTHER"), Ok(Stop::Error));
    let call = json!([{"functionCall": {"name": "f", "args": {}}}]);
    assert_eq!(
        parse(answer(call, "STOP")).map(|i| i.stop),
        Ok(Stop::ToolUse)
    );
}

#[test]
fn malformed_function_call_is_an_error_answer() {
    let body = json!({"candidates": [{
        "content": {"parts": []},
        "finishReason": "MALFORMED_FUNCTION_CALL",
        "finishMessage": "Malformed function call: print(default_api.f(x=))",
    }]});
    let inferred = parse(body).expect("an answer");
    assert_eq!(inferred.stop, Stop::Error);
    assert_eq!(
        inferred.text(),
        "MALFORMED_FUNCTION_CALL: Malformed function call: print(default_api.f(x=))"
    );
    assert!(inferred.tool_calls().is_empty());
}

#[test]
fn blocked_prompt_is_content_filter_with_no_text() {
    let body = json!({
        "promptFeedback": {"blockReason": "SAFETY", "safetyRatings": []},
        "usageMetadata": {"promptTokenCount": 7, "totalTokenCount": 7},
    });
    let inferred = parse(body.clone()).expect("an answer");
    assert_eq!(inferred.stop, Stop::ContentFilter);
    assert_eq!(inferred.text(), "");
    assert_eq!(inferred.usage.input, 7);
    let (streamed, deltas) = stream(&[body]);
    assert_eq!(streamed.map(|i| i.stop), Ok(Stop::ContentFilter));
    assert!(deltas.is_empty());
}

#[test]
fn usage_mapping() {
    let body = json!({
        "candidates": [{"content": {"parts": [{"text": "hi"}]}, "finishReason": "STOP"}],
        "usageMetadata": {
            "promptTokenCount": 100, "cachedContentTokenCount": 60, "toolUsePromptTokenCount": 5,
            "candidatesTokenCount": 20, "thoughtsTokenCount": 30, "totalTokenCount": 155,
        },
        "modelVersion": "gemini-2.5-pro",
    });
    let inferred = parse(body).expect("an answer");
    assert_eq!(
        inferred.usage,
        Usage {
            input: 105,
            output: 50,
            cache_read: 60,
            cache_write: 0,
            reasoning: 30
        }
    );
    assert_eq!(inferred.model.as_deref(), Some("gemini-2.5-pro"));
    // A count that is no count makes the usage unreadable (not reported, which a token budget
    // does not pass): it was read as 0 and the rest counted.
    for garbage in [json!(-100), json!(1.5), json!("100")] {
        let body = json!({
            "candidates": [{"content": {"parts": [{"text": "hi"}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": garbage, "candidatesTokenCount": 20},
        });
        assert_eq!(parse(body).unwrap().usage, Usage::default(), "{garbage}");
    }
    let body = json!({
        "candidates": [{"content": {"parts": [{"text": "hi"}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 100.0, "candidatesTokenCount": 20},
    });
    assert_eq!(parse(body).unwrap().usage.input, 100);
}

#[test]
fn array_body_is_concatenated() {
    let body = json!([
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}}]},
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "lo"}]}, "finishReason": "STOP"}],
         "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2}},
    ]);
    let inferred = parse(body).expect("an answer");
    assert_eq!(inferred.message.parts, vec![Part::text("Hello")]);
    assert_eq!(inferred.usage.output, 2);
}

#[test]
fn thought_parts_become_reasoning_and_signatures_close_runs() {
    let parts = json!([
        {"text": "plan ", "thought": true},
        {"text": "more", "thought": true},
        {"text": "", "thought": true, "thoughtSignature": "T1"},
        {"text": "Hi"},
        {"text": " there", "thoughtSignature": "S1"},
        {"text": "again"},
    ]);
    let inferred = parse(answer(parts, "STOP")).expect("an answer");
    let gemini = |data: Value| {
        Some(Opaque {
            style: Style::Gemini,
            data,
        })
    };
    assert_eq!(
        inferred.message.parts,
        vec![
            Part::Reasoning {
                text: "plan more".into(),
                opaque: gemini(json!({"thought": true, "thoughtSignature": "T1"})),
            },
            Part::Text {
                text: "Hi there".into(),
                opaque: gemini(json!({"thoughtSignature": "S1"})),
            },
            Part::text("again"),
        ]
    );
}

#[test]
fn function_call_ids_given_or_made_up() {
    let parts = json!([
        {"functionCall": {"name": "a", "args": {"x": 1}, "id": "given"}, "thoughtSignature": "S"},
        {"functionCall": {"name": "b"}},
    ]);
    let inferred = parse(answer(parts, "STOP")).expect("an answer");
    let calls = inferred.tool_calls();
    assert_eq!(calls[0].id, "given");
    assert_eq!(calls[0].arguments, r#"{"x":1}"#);
    assert_eq!(
        calls[0].opaque.as_ref().map(|o| &o.data),
        Some(&json!({"thoughtSignature": "S"}))
    );
    assert!(!calls[1].id.is_empty());
    assert_ne!(calls[1].id, calls[0].id);
    assert_eq!(calls[1].arguments, "{}");
    assert_eq!(
        calls[1].opaque.as_ref().map(|o| &o.data),
        Some(&json!({"syntheticId": true}))
    );
    // Sent back: the given id goes, the made-up one does not.
    let req = InferRequest {
        messages: vec![Message::user("go"), inferred.message],
        ..simple()
    };
    let parts = wire_body(&req)["contents"][1]["parts"].clone();
    assert_eq!(parts[0]["functionCall"]["id"], "given");
    assert_eq!(parts[0][SIGNATURE], "S");
    assert_eq!(parts[1], json!({"functionCall": {"name": "b", "args": {}}}));
}

#[test]
fn streamed_text_deltas_and_latest_usage() {
    let events = [
        json!({"candidates": [{"content": {"parts": [{"text": "thinking", "thought": true}]}}],
               "usageMetadata": {"promptTokenCount": 4, "thoughtsTokenCount": 9}}),
        json!({"candidates": [{"content": {"parts": [{"text": "Hel"}]}}],
               "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 1, "thoughtsTokenCount": 9}}),
        json!({"candidates": [{"content": {"parts": [{"text": "lo"}]}, "finishReason": "STOP"}],
               "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 2, "thoughtsTokenCount": 9}}),
    ];
    let (inferred, deltas) = stream(&events);
    let inferred = inferred.expect("an answer");
    assert_eq!(deltas, vec!["Hel", "lo"]);
    assert_eq!(inferred.text(), "Hello");
    assert_eq!(inferred.usage.output, 11);
    assert_eq!(inferred.usage.reasoning, 9);
}

#[test]
fn stream_without_finish_reason_is_a_fetch_error() {
    let (result, deltas) =
        stream(&[json!({"candidates": [{"content": {"parts": [{"text": "partial"}]}}]})]);
    assert_eq!(deltas, vec!["partial"]);
    assert_eq!(
        result,
        Err(ProviderError::Fetch(
            "the stream ended before a finishReason".into()
        ))
    );
}

#[test]
fn mid_stream_error_is_an_error() {
    let (result, _) = stream(&[
        json!({"candidates": [{"content": {"parts": [{"text": "par"}]}}]}),
        json!({"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}),
    ]);
    let err = result.expect_err("an error");
    assert_eq!(err.kind(), "provider_error");
    assert!(err.is_transient());

    let (result, _) =
        stream(&[json!({"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}})]);
    assert_eq!(result.expect_err("an error").kind(), "api_error");
}

#[test]
fn malformed_input_is_a_parse_error() {
    let bad = [
        json!({"candidates": {"not": "an array"}}),
        json!({"candidates": [{"content": {"parts": "nope"}}]}),
        json!({"candidates": [{"content": {"parts": [{"text": 5}]}}]}),
        json!({"candidates": [{"content": {"parts": [{"functionCall": {"name": 1}}]}}]}),
        json!({"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": [1]}}]}}]}),
        json!({"candidates": [{"content": {"parts": [{"functionCall": {"partialArgs": []}}]}}]}),
        json!("just a string"),
    ];
    for body in bad {
        assert_eq!(
            parse(body.clone()).map_err(|e| e.kind()),
            Err("parse_error"),
            "{body}"
        );
    }
    assert_eq!(
        Gemini.parse(b"{oops").map_err(|e| e.kind()),
        Err("parse_error")
    );
    assert_eq!(
        Gemini.parse(b"{}").map_err(|e| e.kind()),
        Err("parse_error")
    );
    let (result, _) = assemble_bytes(b"data: not json\r\n\r\n", Gemini.assembler());
    assert_eq!(result.map_err(|e| e.kind()), Err("parse_error"));
}

#[test]
fn streamed_partial_arguments_with_nested_paths() {
    let fc =
        |call: Value| json!({"candidates": [{"content": {"parts": [{"functionCall": call}]}}]});
    let events = [
        fc(json!({"name": "cook", "willContinue": true})),
        fc(json!({"partialArgs": [
            {"jsonPath": "$.recipe.name", "stringValue": "Lasa", "willContinue": true}
        ], "willContinue": true})),
        fc(json!({"partialArgs": [
            {"jsonPath": "$.recipe.name", "stringValue": "gna \"x\""},
            {"jsonPath": "$.recipe.ingredients[1]", "stringValue": "cheese"},
            {"jsonPath": "$.recipe.ingredients[0]", "stringValue": "pasta"},
            {"jsonPath": "$.servings", "numberValue": 4},
            {"jsonPath": "$.vegan", "boolValue": false},
            {"jsonPath": "$['odd.key']", "nullValue": null},
        ], "willContinue": true})),
        fc(json!({})),
        json!({"candidates": [{"content": {"parts": [{"text": ""}]}, "finishReason": "STOP"}]}),
    ];
    let (inferred, deltas) = stream(&events);
    let inferred = inferred.expect("an answer");
    assert!(deltas.is_empty());
    assert_eq!(inferred.stop, Stop::ToolUse);
    let calls = inferred.tool_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].decoded().expect("JSON"),
        json!({
            "recipe": {"name": "Lasagna \"x\"", "ingredients": ["pasta", "cheese"]},
            "servings": 4, "vegan": false, "odd.key": null,
        })
    );
}

#[test]
fn an_open_streamed_call_is_closed_at_the_end() {
    let events = [json!({"candidates": [{"content": {"parts": [
        {"functionCall": {"name": "f", "willContinue": true}},
        {"functionCall": {"partialArgs": [{"jsonPath": "$.q", "stringValue": "x"}], "willContinue": true}},
    ]}, "finishReason": "MAX_TOKENS"}]})];
    let (inferred, _) = stream(&events);
    let inferred = inferred.expect("an answer");
    assert_eq!(inferred.stop, Stop::MaxTokens);
    assert_eq!(inferred.tool_calls()[0].arguments, r#"{"q":"x"}"#);
}

#[test]
fn json_paths() {
    assert_eq!(
        json_path("$.a[2]['b.c']").ok(),
        Some(vec![
            Step::Key("a".into()),
            Step::Index(2),
            Step::Key("b.c".into())
        ])
    );
    for bad in ["", "$", "a.b", "$..a", "$[x]", "$[1"] {
        assert!(json_path(bad).is_err(), "{bad}");
    }
    let mut root = json!({});
    let huge = json_path("$.a[99999999]").expect("a path");
    assert!(slot(&mut root, &huge).is_err());
}

#[test]
fn per_day_quota_is_not_transient() {
    let body = json!({"error": {
        "code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED",
        "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
             "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "20s"},
        ],
    }});
    let err = errors::classify(429, &Default::default(), &body.to_string());
    assert_eq!(err.kind(), "provider_error");
    assert!(!err.is_transient());
}
