//! Tests of the fake model provider itself, with plain reqwest: the other integration tests
//! trust its wire output, so it is checked here against the shapes of the recorded traffic.

mod support;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};

/// One client for all tests: building one costs ~50 ms (TLS roots). Sharing it across the tests'
/// runtimes is safe because every test talks to its own fake, on its own port, so no pooled
/// connection is reused by another runtime.
fn client() -> reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(reqwest::Client::new).clone()
}

/// POSTs a JSON body with the style's key header.
async fn post(fake: &FakeProvider, style: &str, path: &str, body: Value) -> reqwest::Response {
    let url = format!("{}{path}", fake.base_url(style));
    let req = client().post(url).json(&body);
    let req = match style {
        "anthropic" => req.header("x-api-key", "sk-ant-test"),
        "openai" => req.header("authorization", "Bearer sk-test"),
        _ => req.header("x-goog-api-key", "g-test"),
    };
    req.send().await.unwrap()
}

/// `(event name, data)` pairs of an SSE body; LF or CRLF.
fn sse(text: &str) -> Vec<(String, String)> {
    text.replace("\r\n", "\n")
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = String::new();
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = d.to_string();
                }
            }
            (name, data)
        })
        .collect()
}

fn datas(text: &str) -> Vec<Value> {
    sse(text)
        .into_iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| serde_json::from_str(&d).unwrap())
        .collect()
}

#[tokio::test]
async fn anthropic_text_not_streamed() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("Hello there").usage(12, 3));
    let resp = post(
        &fake,
        "anthropic",
        "/messages",
        json!({"model": "claude-x", "messages": []}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(v["model"], "claude-x");
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": "Hello there"}])
    );
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"]["input_tokens"], 12);
    assert_eq!(v["usage"]["output_tokens"], 3);
}

#[tokio::test]
async fn anthropic_stream_with_thinking_text_and_tool_call() {
    let fake = FakeProvider::start();
    let args = json!({"city": "Paris \"FR\"", "days": 2});
    fake.push(
        Reply::tool_call("toolu_01A", "get_weather", args.clone())
            .with_text("Let me check the weather")
            .reasoning("I should call it", "sig-1"),
    );
    let body = json!({"model": "claude-x", "stream": true, "messages": []});
    let resp = post(&fake, "anthropic", "/messages", body).await;
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = sse(&resp.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"]);
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
    for (name, data) in &events {
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["type"], name.as_str(), "event name is the data type");
    }
    let v: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    let deltas = |kind: &str, field: &str| -> Vec<String> {
        v.iter()
            .filter(|e| e["delta"]["type"] == kind)
            .map(|e| e["delta"][field].as_str().unwrap().to_string())
            .collect()
    };
    let text = deltas("text_delta", "text");
    assert!(text.len() > 1);
    assert_eq!(text.concat(), "Let me check the weather");
    assert_eq!(
        deltas("thinking_delta", "thinking").concat(),
        "I should call it"
    );
    assert_eq!(deltas("signature_delta", "signature"), ["sig-1"]);
    let json_parts = deltas("input_json_delta", "partial_json");
    assert!(json_parts.len() > 2);
    assert_eq!(
        serde_json::from_str::<Value>(&json_parts.concat()).unwrap(),
        args
    );
    let tool = v
        .iter()
        .find(|e| e["content_block"]["type"] == "tool_use")
        .unwrap();
    assert_eq!(tool["index"], 2);
    assert_eq!(tool["content_block"]["id"], "toolu_01A");
    let delta = v.iter().find(|e| e["type"] == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta["usage"]["output_tokens"], 5);
}

#[tokio::test]
async fn openai_stream_text_with_usage_chunk() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("one two three").usage(7, 3).stop("max_tokens"));
    let body = json!({"model": "gpt-x", "stream": true, "stream_options": {"include_usage": true}});
    let text = post(&fake, "openai", "/chat/completions", body)
        .await
        .text()
        .await
        .unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"));
    let chunks = datas(&text);
    assert!(
        chunks
            .iter()
            .all(|c| c["id"].as_str().unwrap().starts_with("chatcmpl-"))
    );
    let deltas: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(deltas, ["one", " two", " three"]);
    let finish: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, [&json!("length")]);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["total_tokens"], 10);
}

#[tokio::test]
async fn openai_parallel_tool_calls_streamed_and_not() {
    let fake = FakeProvider::start();
    let calls = vec![
        ("call_1", "a", json!({"x": 1})),
        ("", "b", json!({"y": "two words"})),
    ];
    fake.push(Reply::tool_calls(calls.clone()));
    fake.push(Reply::tool_calls(calls));
    let v: Value = post(&fake, "openai", "/chat/completions", json!({"model": "m"}))
        .await
        .json()
        .await
        .unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    let tc = &choice["message"]["tool_calls"];
    assert_eq!(tc[0]["id"], "call_1");
    assert!(
        tc[1]["id"].as_str().unwrap().starts_with("call_"),
        "empty id is invented"
    );
    assert_eq!(tc[1]["function"]["arguments"], r#"{"y":"two words"}"#);
    assert_eq!(v["usage"]["prompt_tokens"], 10);

    let body = json!({"model": "m", "stream": true});
    let text = post(&fake, "openai", "/chat/completions", body)
        .await
        .text()
        .await
        .unwrap();
    let chunks = datas(&text);
    assert!(
        chunks.iter().all(|c| c.get("usage").is_none()),
        "no usage unless asked"
    );
    let mut args = [String::new(), String::new()];
    let mut fragments = 0;
    for c in &chunks {
        for t in c["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = t["index"].as_u64().unwrap() as usize;
            if let Some(id) = t["id"].as_str() {
                assert_eq!(
                    t["function"]["arguments"], "",
                    "a call opens with empty arguments"
                );
                assert!(id.starts_with("call_"));
            } else {
                fragments += 1;
            }
            args[i] += t["function"]["arguments"].as_str().unwrap();
        }
    }
    assert!(fragments >= 4);
    assert_eq!(
        serde_json::from_str::<Value>(&args[1]).unwrap(),
        json!({"y": "two words"})
    );
}

#[tokio::test]
async fn gemini_stream_calls_with_thought_signature() {
    let fake = FakeProvider::start();
    let calls = vec![("c1", "get", json!({"q": 1})), ("", "put", json!({}))];
    fake.push(
        Reply::tool_calls(calls)
            .reasoning("pondering", "sig-g")
            .usage(20, 8),
    );
    let path = "/models/gemini-x:streamGenerateContent?alt=sse";
    let resp = post(&fake, "gemini", path, json!({"contents": []})).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("}\r\n\r\ndata: "), "CRLF separated events");
    let events = datas(&text);
    let parts: Vec<&Value> = events
        .iter()
        .flat_map(|e| e["candidates"][0]["content"]["parts"].as_array().unwrap())
        .collect();
    assert_eq!(parts[0], &json!({"text": "pondering", "thought": true}));
    assert_eq!(
        parts[1]["functionCall"],
        json!({"name": "get", "args": {"q": 1}, "id": "c1"})
    );
    assert_eq!(parts[1]["thoughtSignature"], "sig-g");
    assert_eq!(
        parts[2]["functionCall"],
        json!({"name": "put", "args": {}}),
        "no id when empty"
    );
    assert!(parts[2].get("thoughtSignature").is_none());
    let last = events.last().unwrap();
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    assert_eq!(last["modelVersion"], "gemini-x");
    assert_eq!(last["usageMetadata"]["candidatesTokenCount"], 8);
    assert_eq!(last["usageMetadata"]["totalTokenCount"], 28);
}

#[tokio::test]
async fn gemini_text_not_streamed_and_streamed_as_array() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("Bonjour le monde"));
    fake.push(Reply::text("Bonjour le monde").stop("max_tokens"));
    fake.push(
        Reply::tool_call("", "f", json!({}))
            .with_text("Hm")
            .reasoning("t", "s"),
    );
    let v: Value = post(&fake, "gemini", "/models/g:generateContent", json!({}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        v["candidates"][0]["content"]["parts"],
        json!([{"text": "Bonjour le monde"}])
    );
    assert_eq!(v["candidates"][0]["content"]["role"], "model");
    assert_eq!(v["usageMetadata"]["promptTokenCount"], 10);
    // Without alt=sse a Gemini stream is one JSON array.
    let v: Value = post(
        &fake,
        "gemini",
        "/models/g:streamGenerateContent",
        json!({}),
    )
    .await
    .json()
    .await
    .unwrap();
    let events = v.as_array().unwrap();
    assert_eq!(events.len(), 4);
    assert_eq!(events[3]["candidates"][0]["finishReason"], "MAX_TOKENS");
    // The signature goes on the first call even after text.
    let v: Value = post(&fake, "gemini", "/models/g:generateContent", json!({}))
        .await
        .json()
        .await
        .unwrap();
    let parts = &v["candidates"][0]["content"]["parts"];
    assert_eq!(parts[0], json!({"text": "t", "thought": true}));
    assert_eq!(parts[1], json!({"text": "Hm"}));
    assert_eq!(parts[2]["thoughtSignature"], "s");
}

#[tokio::test]
async fn status_fault_with_retry_after_in_each_style() {
    let fake = FakeProvider::start();
    for _ in 0..3 {
        fake.push(Reply::status(429).header("retry-after", "2"));
    }
    let resp = post(&fake, "anthropic", "/messages", json!({})).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "2");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error");

    let v: Value = post(&fake, "openai", "/chat/completions", json!({}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");

    let v: Value = post(&fake, "gemini", "/models/g:generateContent", json!({}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["error"]["status"], "RESOURCE_EXHAUSTED");
    assert_eq!(v["error"]["details"][0]["retryDelay"], "2s");

    fake.push(Reply::status(529).body("{\"custom\":true}").delay(50));
    let t = Instant::now();
    let resp = post(&fake, "anthropic", "/messages", json!({})).await;
    assert!(t.elapsed() >= Duration::from_millis(50));
    assert_eq!(resp.status().as_u16(), 529);
    assert_eq!(resp.text().await.unwrap(), "{\"custom\":true}");
}

#[tokio::test]
async fn drop_mid_stream_breaks_the_body() {
    let fake = FakeProvider::start();
    fake.push(Reply::drop_mid_stream("a b c d e f g h"));
    fake.push(Reply::drop_mid_stream("a b c d e f g h"));
    let body = json!({"stream": true});
    let resp = post(&fake, "anthropic", "/messages", body).await;
    assert_eq!(resp.status(), 200);
    let mut got = Vec::new();
    let mut stream = resp.bytes_stream();
    let mut failed = false;
    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
        match chunk {
            Ok(b) => got.extend_from_slice(&b),
            Err(_) => failed = true,
        }
    }
    assert!(failed, "the body must end in an error");
    let text = String::from_utf8(got).unwrap();
    assert!(text.contains("text_delta"));
    assert!(!text.contains("message_stop"));

    let resp = post(&fake, "openai", "/chat/completions", json!({})).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.bytes().await.is_err(), "short body must fail");
}

#[tokio::test]
async fn stream_error_and_malformed() {
    let fake = FakeProvider::start();
    fake.push(Reply::stream_error("overloaded_error", "Overloaded").with_text("partial answer"));
    fake.push(Reply::stream_error("overloaded_error", "Overloaded"));
    fake.push(Reply::stream_error("overloaded_error", "Overloaded"));
    fake.push(Reply::malformed());
    fake.push(Reply::malformed());

    let text = post(&fake, "anthropic", "/messages", json!({"stream": true}))
        .await
        .text()
        .await
        .unwrap();
    let events = sse(&text);
    assert!(events.iter().any(|(_, d)| d.contains("partial")));
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "error");
    let v: Value = serde_json::from_str(data).unwrap();
    assert_eq!(
        v["error"],
        json!({"type": "overloaded_error", "message": "Overloaded"})
    );

    let text = post(
        &fake,
        "openai",
        "/chat/completions",
        json!({"stream": true}),
    )
    .await
    .text()
    .await
    .unwrap();
    let last = datas(&text).pop().unwrap();
    assert_eq!(last["error"]["message"], "Overloaded");
    assert!(last.get("choices").is_none());
    assert!(!text.contains("[DONE]"));

    let path = "/models/g:streamGenerateContent?alt=sse";
    let text = post(&fake, "gemini", path, json!({}))
        .await
        .text()
        .await
        .unwrap();
    let last = datas(&text).pop().unwrap();
    assert_eq!(last["error"]["code"], 503);
    assert_eq!(last["error"]["status"], "UNAVAILABLE");

    let resp = post(&fake, "openai", "/chat/completions", json!({})).await;
    assert_eq!(resp.status(), 200);
    assert!(serde_json::from_str::<Value>(&resp.text().await.unwrap()).is_err());

    let text = post(&fake, "anthropic", "/messages", json!({"stream": true}))
        .await
        .text()
        .await
        .unwrap();
    let bad = sse(&text)
        .into_iter()
        .filter(|(_, d)| serde_json::from_str::<Value>(d).is_err());
    assert_eq!(bad.count(), 1);
}

#[tokio::test]
async fn keys_models_empty_queue_stats_and_recording() {
    let fake = FakeProvider::start();
    let no_key = client()
        .get(format!("{}/models", fake.base_url("openai")))
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), 401);
    let v: Value = no_key.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("authorization")
    );

    let get = |url: String, k: &'static str, v: &'static str| client().get(url).header(k, v).send();
    let v: Value = get(fake.base_url("anthropic") + "/models", "x-api-key", "k")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["data"][0]["type"], "model");
    assert_eq!(v["has_more"], false);
    let v: Value = get(
        fake.base_url("openai") + "/models",
        "Authorization",
        "Bearer k",
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][1]["object"], "model");
    let v: Value = get(
        fake.base_url("gemini") + "/models?pageSize=50",
        "x-goog-api-key",
        "k",
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert!(
        v["models"][0]["name"]
            .as_str()
            .unwrap()
            .starts_with("models/")
    );

    let resp = post(&fake, "anthropic", "/messages", json!({"model": "m"})).await;
    assert_eq!(resp.status(), 500);
    assert!(
        resp.text()
            .await
            .unwrap()
            .contains("fake provider: no scripted reply left")
    );

    fake.set_default(Reply::text("default"));
    fake.set_responder(|body, style| {
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or_default();
        if last["role"] == "tool" {
            Reply::text(format!("{style} done"))
        } else {
            Reply::tool_call("call_9", "look", json!({}))
        }
    });
    fake.push(Reply::text("queued"));
    let read = |r: reqwest::Response| async {
        r.json::<Value>().await.unwrap()["choices"][0]["message"].clone()
    };
    let m = read(
        post(
            &fake,
            "openai",
            "/chat/completions",
            json!({"messages": []}),
        )
        .await,
    )
    .await;
    assert_eq!(m["content"], "queued");
    let m = read(
        post(
            &fake,
            "openai",
            "/chat/completions",
            json!({"messages": [{"role": "user"}]}),
        )
        .await,
    )
    .await;
    assert_eq!(m["tool_calls"][0]["function"]["name"], "look");
    let m = read(
        post(
            &fake,
            "openai",
            "/chat/completions",
            json!({"messages": [{"role": "tool"}]}),
        )
        .await,
    )
    .await;
    assert_eq!(m["content"], "openai done");

    let stats: Value = client()
        .get(fake.url() + "/stats")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats, json!({"calls": 4}));
    assert_eq!(fake.calls(), 4);
    assert_eq!(fake.pending(), 0);

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 8);
    assert_eq!(reqs[0].style, "openai");
    assert_eq!(reqs[0].body, Value::Null);
    assert_eq!(reqs[3].path, "/gemini/v1beta/models?pageSize=50");
    let last = fake.last_request().unwrap();
    assert_eq!(last.method, "POST");
    assert_eq!(last.path, "/openai/v1/chat/completions");
    assert_eq!(last.header("Authorization"), Some("Bearer sk-test"));
    assert_eq!(last.body["messages"][0]["role"], "tool");
    assert_eq!(fake.take_requests().len(), 8);
    assert!(fake.requests().is_empty());
}

#[test]
fn works_from_a_plain_test_and_stops_on_drop() {
    let fake = FakeProvider::start();
    let addr = fake.addr();
    assert!(fake.base_url("gemini").ends_with("/gemini/v1beta"));
    std::net::TcpStream::connect(addr).unwrap();
    drop(fake);
    assert!(std::net::TcpStream::connect(addr).is_err());
}
