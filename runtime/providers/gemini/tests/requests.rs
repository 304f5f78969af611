//! What goes out: the URL, the key header, the body.

use super::*;

#[test]
fn response_schema_goes_out_as_json_schema_unchanged() {
    // Keywords the OpenAPI subset lacks stay: `responseJsonSchema` takes JSON Schema.
    let schema = json!({
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}}},
        "$defs": {"tag": {"type": "string"}},
        "additionalProperties": false,
    });
    let req = InferRequest {
        temperature: Some(0.2),
        response_schema: Some(ResponseSchema {
            name: "tagged".into(),
            schema: schema.clone(),
        }),
        ..simple()
    };
    let body = wire_body(&req);
    assert_eq!(
        body["generationConfig"],
        json!({"temperature": 0.2, "responseMimeType": "application/json",
               "responseJsonSchema": schema})
    );
    assert!(body["generationConfig"].get("responseSchema").is_none());
    let mut rest = body.clone();
    rest.as_object_mut().unwrap().remove("generationConfig");
    let mut plain = wire_body(&simple());
    plain.as_object_mut().unwrap().remove("generationConfig");
    assert_eq!(rest, plain);
}

#[test]
fn no_response_schema_leaves_the_body_unchanged() {
    let req = InferRequest {
        system: Some("Be brief.".into()),
        tools: vec![weather_tool()],
        temperature: Some(0.5),
        max_tokens: Some(100),
        stop_sequences: vec!["END".into()],
        ..simple()
    };
    assert_eq!(
        wire_body(&req),
        json!({
            "contents": [{"role": "user", "parts": [{"text": "hello"}]}],
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
            "generationConfig": {"temperature": 0.5, "maxOutputTokens": 100,
                                 "stopSequences": ["END"]},
            "tools": [{"functionDeclarations": [{"name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}]}],
            "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
        })
    );
    assert!(wire_body(&simple()).get("generationConfig").is_none());
}

#[test]
fn url_and_key_header() {
    let wire = request(&simple());
    assert_eq!(
        wire.url,
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
    );
    assert_eq!(
        wire.headers,
        vec![("x-goog-api-key".to_string(), KEY.to_string())]
    );
    assert!(!wire.url.contains(KEY), "the key never goes in the URL");
    assert!(!wire.json().to_string().contains(KEY));
}

#[test]
fn streaming_url() {
    let wire = Gemini.request(&simple(), &endpoint(), true);
    assert_eq!(
        wire.url,
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
}

#[test]
fn model_prefix_is_not_doubled_and_trailing_slash_is_dropped() {
    let mut ep = endpoint();
    ep.base_url.push('/');
    let req = InferRequest {
        model: "models/gemini-2.5-pro".into(),
        ..simple()
    };
    let wire = Gemini.request(&req, &ep, false);
    assert_eq!(
        wire.url,
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:generateContent"
    );
}

#[test]
fn no_key_no_header() {
    let mut ep = endpoint();
    ep.key = None;
    assert!(Gemini.request(&simple(), &ep, false).headers.is_empty());
}

#[test]
fn plain_text_request() {
    assert_eq!(
        wire_body(&simple()),
        json!({"contents": [{"role": "user", "parts": [{"text": "hello"}]}]})
    );
}

#[test]
fn system_prompt_and_system_messages() {
    let req = InferRequest {
        system: Some("be brief".into()),
        messages: vec![
            Message::new(Role::System, vec![Part::text("answer in French")]),
            Message::user("hello"),
        ],
        ..simple()
    };
    let body = wire_body(&req);
    assert_eq!(
        body["systemInstruction"],
        json!({"parts": [{"text": "be brief"}, {"text": "answer in French"}]})
    );
    assert_eq!(
        body["contents"],
        json!([{"role": "user", "parts": [{"text": "hello"}]}])
    );
}

#[test]
fn generation_config_fields() {
    let req = InferRequest {
        temperature: Some(0.25),
        max_tokens: Some(512),
        stop_sequences: vec!["END".into(), "STOP".into()],
        ..simple()
    };
    let body = wire_body(&req);
    assert_eq!(
        body["generationConfig"],
        json!({"temperature": 0.25, "maxOutputTokens": 512, "stopSequences": ["END", "STOP"]})
    );
    assert!(wire_body(&simple()).get("generationConfig").is_none());
}

#[test]
fn extra_is_merged_last() {
    let req = InferRequest {
        temperature: Some(0.5),
        extra: Some(json!({
            "generationConfig": {"temperature": 1.0, "thinkingConfig": {"includeThoughts": true}},
            "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
        })),
        ..simple()
    };
    let body = wire_body(&req);
    assert_eq!(
        body["generationConfig"],
        json!({"temperature": 1.0, "thinkingConfig": {"includeThoughts": true}})
    );
    assert_eq!(body["safetySettings"][0]["threshold"], "BLOCK_NONE");
    assert_eq!(body["contents"][0]["parts"][0]["text"], "hello");
}

#[test]
fn tools_go_out_as_function_declarations() {
    let mut no_params = weather_tool();
    no_params.name = "now".into();
    no_params.description = String::new();
    no_params.parameters = json!({"type": "object", "properties": {}});
    let req = InferRequest {
        tools: vec![weather_tool(), no_params],
        ..simple()
    };
    let body = wire_body(&req);
    assert_eq!(
        body["tools"],
        json!([{"functionDeclarations": [
            {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
            {"name": "now"},
        ]}])
    );
    assert_eq!(
        body["toolConfig"],
        json!({"functionCallingConfig": {"mode": "AUTO"}})
    );
}

#[test]
fn tool_choice_modes() {
    let config = |choice: ToolChoice| {
        let req = InferRequest {
            tools: vec![weather_tool()],
            tool_choice: choice,
            ..simple()
        };
        wire_body(&req)["toolConfig"]["functionCallingConfig"].clone()
    };
    assert_eq!(config(ToolChoice::Auto), json!({"mode": "AUTO"}));
    assert_eq!(config(ToolChoice::None), json!({"mode": "NONE"}));
    assert_eq!(config(ToolChoice::Required), json!({"mode": "ANY"}));
    assert_eq!(
        config(ToolChoice::Tool("get_weather".into())),
        json!({"mode": "ANY", "allowedFunctionNames": ["get_weather"]})
    );
    assert!(wire_body(&simple()).get("toolConfig").is_none());
}

#[test]
fn assistant_tool_calls_and_results_go_back() {
    let assistant = Message::new(
        Role::Assistant,
        vec![
            Part::text("Let me check."),
            Part::ToolCall(gemini_call(
                "fc1",
                "get_weather",
                r#"{"city":"Paris"}"#,
                json!({"thoughtSignature": "SIG1"}),
            )),
            Part::ToolCall(gemini_call(
                "gemini_1_2",
                "get_weather",
                r#"{"city":"Tokyo"}"#,
                json!({"syntheticId": true}),
            )),
        ],
    );
    let tool = Message::new(
        Role::Tool,
        vec![
            result("fc1", "get_weather", r#"{"temp": 21}"#, false),
            result("gemini_1_2", "", "city not found", true),
        ],
    );
    let req = InferRequest {
        messages: vec![Message::user("weather?"), assistant, tool],
        ..simple()
    };
    let body = wire_body(&req);
    assert_eq!(
        body["contents"],
        json!([
            {"role": "user", "parts": [{"text": "weather?"}]},
            {"role": "model", "parts": [
                {"text": "Let me check."},
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}, "id": "fc1"}, "thoughtSignature": "SIG1"},
                {"functionCall": {"name": "get_weather", "args": {"city": "Tokyo"}}},
            ]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "get_weather", "response": {"result": {"temp": 21}}, "id": "fc1"}},
                {"functionResponse": {"name": "get_weather", "response": {"error": "city not found"}}},
            ]},
        ])
    );
}

#[test]
fn results_of_one_step_share_one_content_even_across_messages() {
    let call = |id: &str| Part::ToolCall(gemini_call(id, "f", "", json!({})));
    let req = InferRequest {
        messages: vec![
            Message::user("go"),
            Message::new(Role::Assistant, vec![call("a"), call("b")]),
            Message::new(Role::Tool, vec![result("a", "f", "1", false)]),
            Message::new(Role::Tool, vec![result("b", "f", "plain text", false)]),
            Message::user("thanks"),
        ],
        ..simple()
    };
    let contents = wire_body(&req)["contents"].clone();
    assert_eq!(contents.as_array().map(Vec::len), Some(3));
    assert_eq!(contents[1]["parts"][0]["functionCall"]["args"], json!({}));
    assert_eq!(
        contents[2]["parts"],
        json!([
            {"functionResponse": {"name": "f", "response": {"result": 1}, "id": "a"}},
            {"functionResponse": {"name": "f", "response": {"result": "plain text"}, "id": "b"}},
            {"text": "thanks"},
        ])
    );
}

#[test]
fn opaque_goes_back_unchanged_and_only_to_gemini() {
    let foreign = Opaque {
        style: Style::Anthropic,
        data: json!({"type": "thinking", "signature": "ANTHROPIC"}),
    };
    let assistant = Message::new(
        Role::Assistant,
        vec![
            Part::Reasoning {
                text: "thinking...".into(),
                opaque: Some(Opaque {
                    style: Style::Gemini,
                    data: json!({"thought": true}),
                }),
            },
            Part::Reasoning {
                text: "foreign thoughts".into(),
                opaque: Some(foreign.clone()),
            },
            Part::Text {
                text: "answer".into(),
                opaque: Some(Opaque {
                    style: Style::Gemini,
                    data: json!({"thoughtSignature": "TEXT/SIG+=="}),
                }),
            },
            Part::Text {
                text: "more".into(),
                opaque: Some(foreign.clone()),
            },
            Part::ToolCall(ToolCall {
                id: "toolu_01".into(),
                name: "f".into(),
                arguments: r#"{"a":1}"#.into(),
                opaque: Some(foreign),
            }),
        ],
    );
    let req = InferRequest {
        messages: vec![Message::user("hi"), assistant],
        ..simple()
    };
    assert_eq!(
        wire_body(&req)["contents"][1]["parts"],
        json!([
            {"text": "thinking...", "thought": true},
            {"text": "answer", "thoughtSignature": "TEXT/SIG+=="},
            {"text": "more"},
            {"functionCall": {"name": "f", "args": {"a": 1}}},
        ])
    );
}

#[test]
fn odd_arguments_still_make_an_object() {
    assert_eq!(args_object(""), json!({}));
    assert_eq!(args_object("[1,2]"), json!({"value": [1, 2]}));
    assert_eq!(args_object("{not json"), json!({"raw": "{not json"}));
}

#[test]
fn gemini3_unsigned_steps_get_the_placeholder_in_the_current_turn_only() {
    let unsigned = |id: &str| {
        Part::ToolCall(ToolCall {
            id: id.into(),
            name: "f".into(),
            arguments: "{}".into(),
            opaque: None,
        })
    };
    let messages = vec![
        Message::user("first"),
        Message::new(Role::Assistant, vec![unsigned("old")]),
        Message::new(Role::Tool, vec![result("old", "f", "1", false)]),
        Message::user("second"),
        Message::new(Role::Assistant, vec![unsigned("a"), unsigned("b")]),
        Message::new(Role::Tool, vec![result("a", "f", "1", false)]),
    ];
    let req = InferRequest {
        model: "gemini-3-pro-preview".into(),
        messages: messages.clone(),
        ..simple()
    };
    let contents = wire_body(&req)["contents"].clone();
    // user, model (old turn), user (result + "second"), model (current turn), user.
    assert_eq!(contents.as_array().map(Vec::len), Some(5));
    assert_eq!(contents[1]["parts"][0].get(SIGNATURE), None);
    assert_eq!(contents[3]["parts"][0][SIGNATURE], SKIP_SIGNATURE);
    assert_eq!(contents[3]["parts"][1].get(SIGNATURE), None);

    let older = InferRequest {
        model: "gemini-2.5-flash".into(),
        messages,
        ..simple()
    };
    assert!(!wire_body(&older).to_string().contains(SKIP_SIGNATURE));
    assert!(validates_signatures("models/gemini-3.1-pro-preview"));
    assert!(!validates_signatures("gemma-3-27b-it"));
}

#[test]
fn models_endpoint() {
    let wire = Gemini.models_request(&endpoint());
    assert_eq!(
        wire.url,
        "https://generativelanguage.googleapis.com/v1beta/models?pageSize=1000"
    );
    assert_eq!(
        wire.headers,
        vec![("x-goog-api-key".to_string(), KEY.to_string())]
    );
    let listed = json!({"models": [
        {"name": "models/gemini-2.5-flash", "supportedGenerationMethods": ["generateContent", "countTokens"]},
        {"name": "models/text-embedding-004", "supportedGenerationMethods": ["embedContent"]},
        {"name": "models/gemini-3-pro-preview"},
    ], "nextPageToken": "x"});
    assert_eq!(
        Gemini.parse_models(&listed).unwrap(),
        vec!["gemini-2.5-flash", "gemini-3-pro-preview"]
    );
    assert_eq!(Gemini.parse_models(&json!({"models": []})), Ok(vec![]));
    assert_eq!(
        Gemini.parse_models(&json!({})),
        Err("the answer has no \"models\" list of models".to_string())
    );
}
