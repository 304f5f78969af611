//! `ai.ask` from Lua scripts, through the binary, against the fake provider in each wire style:
//! text, tool calls and their results (the second request checked field by field against the
//! style's documented shape), parallel calls, streaming, each error class, the text fallback.

mod support;

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::{STYLES, model_calls};

/// A sandbox whose environment points `style`'s provider at the fake.
fn sandbox(fake: &FakeProvider, style: &str) -> Sandbox {
    support::styled(fake, style)
}

#[test]
fn text_answer_in_every_style() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(Reply::text("Hello from the fake."));
        let run = sandbox(&fake, style)
            .lua(
                &format!(
                    r#"local r, e = ai.ask("Say hello", {{ provider = "{style}", system = "Be brief.", max_tokens = 50 }})
                       assert(r, e)
                       print(r)"#
                ),
                &[],
            )
            .ok();
        assert_eq!(run.stdout.trim(), "Hello from the fake.", "{style}");
        let req = fake.requests().pop().expect("one request");
        let body = req.body.clone();
        match style {
            "anthropic" => {
                assert_eq!(
                    req.header("x-api-key"),
                    Some("test-key-anthropic-0123456789")
                );
                assert!(req.header("anthropic-version").is_some());
                assert_eq!(body["system"], "Be brief.");
                assert_eq!(body["max_tokens"], 50);
                assert_eq!(
                    body["messages"],
                    json!([{"role": "user", "content": [{"type": "text", "text": "Say hello"}]}])
                );
            }
            "openai" => {
                assert_eq!(
                    req.header("authorization"),
                    Some("Bearer test-key-openai-0123456789")
                );
                assert_eq!(body["max_tokens"], 50);
                assert_eq!(
                    body["messages"],
                    json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}])
                );
            }
            _ => {
                assert_eq!(
                    req.header("x-goog-api-key"),
                    Some("test-key-gemini-0123456789")
                );
                assert!(
                    !req.path.contains("key="),
                    "the key stays out of the URL: {}",
                    req.path
                );
                assert_eq!(
                    body["systemInstruction"],
                    json!({"parts": [{"text": "Be brief."}]})
                );
                assert_eq!(body["generationConfig"]["maxOutputTokens"], 50);
                assert_eq!(
                    body["contents"],
                    json!([{"role": "user", "parts": [{"text": "Say hello"}]}])
                );
            }
        }
    }
}

/// The quickstart's loop, written inline: ask, run the tool, answer, ask again.
const TOOL_LOOP: &str = r#"
local tool = { name = "weather.current", description = "Weather in a city",
               parameters = { type = "object", properties = { city = { type = "string" } }, required = { "city" } } }
local history = { { role = "user", content = "Weather in Paris?" } }
local opts = { provider = PROVIDER, tools = { tool } }
local reply, err, calls = ai.ask(history, opts)
assert(reply, err)
assert(calls, "expected tool calls")
history[#history + 1] = { role = "assistant", content = reply, tool_calls = calls }
for _, c in ipairs(calls) do
  print("call", c.id, c.name, c.arguments.city)
  history[#history + 1] = { role = "tool", tool_call_id = c.id, content = json.encode({ sky = "clear", city = c.arguments.city }) }
end
reply, err, calls = ai.ask(history, opts)
assert(reply, err)
assert(calls == nil)
print("final", reply)
"#;

#[test]
fn tool_call_round_trip_in_every_style() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(Reply::tool_call(
            "call_1",
            "weather_current",
            json!({"city": "Paris"}),
        ));
        fake.push(Reply::text("It is clear in Paris."));
        let script = TOOL_LOOP.replace("PROVIDER", &format!("{style:?}"));
        let run = sandbox(&fake, style).lua(&script, &[]).ok();
        let lines = run.lines();
        // The wire name `weather_current` maps back to the public `weather.current`.
        assert!(lines[0].starts_with("call\t"), "{style}: {lines:?}");
        let fields: Vec<&str> = lines[0].split('\t').collect();
        assert_eq!(fields[2..], ["weather.current", "Paris"], "{style}");
        let id = fields[1];
        assert_eq!(lines[1], "final\tIt is clear in Paris.", "{style}");
        let calls = model_calls(&fake);
        assert_eq!(calls.len(), 2);
        let second = &calls[1];
        let result_text = r#"{"city":"Paris","sky":"clear"}"#;
        match style {
            "anthropic" => {
                assert_eq!(second["tools"][0]["name"], "weather_current");
                assert_eq!(
                    second["tools"][0]["input_schema"]["required"],
                    json!(["city"])
                );
                let m = &second["messages"];
                assert_eq!(m.as_array().unwrap().len(), 3);
                assert_eq!(m[1]["role"], "assistant");
                let block = m[1]["content"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|b| b["type"] == "tool_use")
                    .unwrap();
                assert_eq!(block["id"], id);
                assert_eq!(block["name"], "weather_current");
                assert_eq!(block["input"], json!({"city": "Paris"}));
                assert_eq!(m[2]["role"], "user");
                assert_eq!(m[2]["content"][0]["type"], "tool_result");
                assert_eq!(m[2]["content"][0]["tool_use_id"], id);
                assert_eq!(m[2]["content"][0]["content"], result_text);
                assert!(
                    m[2]["content"][0]
                        .get("is_error")
                        .is_none_or(|v| v == false)
                );
            }
            "openai" => {
                assert_eq!(second["tools"][0]["type"], "function");
                assert_eq!(second["tools"][0]["function"]["name"], "weather_current");
                let m = &second["messages"];
                assert_eq!(m.as_array().unwrap().len(), 3);
                assert_eq!(m[1]["role"], "assistant");
                let call = &m[1]["tool_calls"][0];
                assert_eq!(call["id"], id);
                assert_eq!(call["type"], "function");
                assert_eq!(call["function"]["name"], "weather_current");
                let args: Value =
                    serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
                assert_eq!(args, json!({"city": "Paris"}));
                assert_eq!(
                    m[2],
                    json!({"role": "tool", "tool_call_id": id, "content": result_text})
                );
            }
            _ => {
                assert_eq!(
                    second["tools"][0]["functionDeclarations"][0]["name"],
                    "weather_current"
                );
                let c = &second["contents"];
                assert_eq!(c.as_array().unwrap().len(), 3);
                assert_eq!(c[1]["role"], "model");
                assert_eq!(c[1]["parts"][0]["functionCall"]["name"], "weather_current");
                assert_eq!(
                    c[1]["parts"][0]["functionCall"]["args"],
                    json!({"city": "Paris"})
                );
                assert_eq!(c[2]["role"], "user");
                let response = &c[2]["parts"][0]["functionResponse"];
                assert_eq!(response["name"], "weather_current");
                assert_eq!(
                    response["response"]["result"],
                    json!({"city": "Paris", "sky": "clear"})
                );
            }
        }
    }
}

#[test]
fn parallel_calls_in_one_answer() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(Reply::tool_calls(vec![
            ("call_a", "weather_current", json!({"city": "Paris"})),
            ("call_b", "weather_current", json!({"city": "Oslo"})),
        ]));
        fake.push(Reply::text("Both clear."));
        let script = TOOL_LOOP.replace("PROVIDER", &format!("{style:?}"));
        let run = sandbox(&fake, style).lua(&script, &[]).ok();
        let cities: Vec<&str> = run
            .lines()
            .iter()
            .filter(|l| l.starts_with("call\t"))
            .map(|l| l.rsplit('\t').next().unwrap())
            .collect();
        assert_eq!(cities, ["Paris", "Oslo"], "{style}");
        let second = &model_calls(&fake)[1];
        match style {
            "anthropic" => {
                let results = second["messages"][2]["content"].as_array().unwrap();
                assert_eq!(results.len(), 2, "both results in one user message");
            }
            "openai" => {
                let m = second["messages"].as_array().unwrap();
                assert_eq!(m.len(), 4, "one tool message per result");
                assert_eq!(m[1]["tool_calls"].as_array().unwrap().len(), 2);
            }
            _ => {
                let parts = second["contents"][2]["parts"].as_array().unwrap();
                assert_eq!(parts.len(), 2, "both responses in one content");
            }
        }
    }
}

#[test]
fn streaming_hands_deltas_over_in_order() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(Reply::text("one two three four five"));
        let run = sandbox(&fake, style)
            .lua(
                &format!(
                    r#"local seen = {{}}
                       local r, e = ai.ask("count", {{ provider = "{style}", stream = function(d) seen[#seen + 1] = d end }})
                       assert(r, e)
                       print(#seen > 1, table.concat(seen) == r, r)"#
                ),
                &[],
            )
            .ok();
        assert_eq!(
            run.stdout.trim(),
            "true\ttrue\tone two three four five",
            "{style}"
        );
        let body = &model_calls(&fake)[0];
        if style == "gemini" {
            assert!(
                fake.requests()[0]
                    .path
                    .contains(":streamGenerateContent?alt=sse")
            );
        } else {
            assert_eq!(body["stream"], true, "{style}");
        }
    }
}

#[test]
fn streamed_tool_calls_assemble_from_fragments() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(Reply::tool_call(
            "call_1",
            "weather_current",
            json!({"city": "Paris \"centre\"", "days": 3}),
        ));
        let run = sandbox(&fake, style)
            .lua(
                &format!(
                    r#"local r, e, calls = ai.ask("w", {{ provider = "{style}", stream = true,
                         tools = {{ {{ name = "weather.current" }} }} }})
                       assert(r, e)
                       print(calls[1].name, calls[1].arguments.city, calls[1].arguments.days)"#
                ),
                &[],
            )
            .ok();
        assert_eq!(
            run.stdout.trim(),
            "weather.current\tParis \"centre\"\t3",
            "{style}"
        );
    }
}

/// Runs one ask against a scripted fault and returns what the script printed about the error.
fn error_of(style: &str, reply: Reply, stream: bool) -> String {
    let fake = FakeProvider::start();
    fake.push(reply);
    let run = sandbox(&fake, style)
        .lua(
            &format!(
                r#"local r, e = ai.ask("hi", {{ provider = "{style}", stream = {stream} }})
                   assert(r == nil, "expected a failure")
                   print(e.kind, e.transient, e.retry_after, e.status, tostring(e))"#
            ),
            &[],
        )
        .ok();
    run.stdout.trim().to_string()
}

#[test]
fn each_error_class() {
    for style in STYLES {
        let auth = error_of(style, Reply::status(401), false);
        assert!(
            auth.starts_with("auth_error\tfalse\tnil\t401"),
            "{style}: {auth}"
        );
        let bad = error_of(style, Reply::status(400), false);
        assert!(
            bad.starts_with("api_error\tfalse\tnil\t400"),
            "{style}: {bad}"
        );
        let limited = error_of(style, Reply::status(429).header("retry-after", "2"), false);
        assert!(
            limited.starts_with("provider_error\ttrue\t2.0\t429"),
            "{style}: {limited}"
        );
        let overloaded = error_of(style, Reply::status(503), false);
        assert!(
            overloaded.starts_with("provider_error\ttrue\tnil\t503"),
            "{style}: {overloaded}"
        );
        // A whole body whose JSON stops half-way was cut off, as a stream that ends early is.
        let malformed = error_of(style, Reply::malformed(), false);
        assert!(
            malformed.starts_with("fetch_error\ttrue"),
            "{style}: {malformed}"
        );
        let dropped = error_of(style, Reply::drop_mid_stream("partial answer here"), true);
        assert!(
            dropped.starts_with("fetch_error\ttrue"),
            "{style}: {dropped}"
        );
        let mid = error_of(
            style,
            Reply::stream_error("overloaded_error", "Overloaded"),
            true,
        );
        assert!(mid.starts_with("provider_error\ttrue"), "{style}: {mid}");
        assert!(mid.contains("mid-stream"), "{style}: {mid}");
    }
}

#[test]
fn quota_and_retry_hints_from_bodies() {
    let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
    let e = error_of("openai", Reply::status(429).body(quota), false);
    assert!(e.starts_with("provider_error\tfalse\tnil\t429"), "{e}");
    let e = error_of(
        "openai",
        Reply::status(429).header("retry-after-ms", "1500"),
        false,
    );
    assert!(e.starts_with("provider_error\ttrue\t1.5\t429"), "{e}");
    let gemini = r#"{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"47s"}]}}"#;
    let e = error_of("gemini", Reply::status(429).body(gemini), false);
    assert!(e.starts_with("provider_error\ttrue\t47.0\t429"), "{e}");
    let e = error_of("anthropic", Reply::status(529), false);
    assert!(e.starts_with("provider_error\ttrue\tnil\t529"), "{e}");
}

#[test]
fn an_unreachable_base_url_is_a_fetch_error() {
    let run = Sandbox::new()
        .env("OPENAI_API_KEY", "test-key-openai-0123456789")
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .lua(
            r#"local r, e = ai.ask("hi", { provider = "openai" }) print(e.kind, e.transient)"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout.trim(), "fetch_error\ttrue");
}

/// `ai.ask{ prompt = ..., provider = ... }` (the shape of `ai.run`) puts the options where the
/// history goes. It used to read as no messages and no options, and failed as "no provider for
/// use-type general" though a provider was given; an empty list reached the provider as a
/// request with no messages.
#[test]
fn options_in_the_history_s_place_are_named() {
    let fake = FakeProvider::start();
    let sandbox = sandbox(&fake, "openai");
    let run = sandbox
        .lua(
            r#"ai.ask{ prompt = "hi", provider = "openai", model = "m" }"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr.contains(
            "ai.ask: history must be a string or a list of messages, not a table with keys \
             model, prompt, provider: the prompt goes first and the options second"
        ),
        "{}",
        run.stderr
    );
    let run = sandbox
        .lua(r#"ai.ask({}, { provider = "openai" })"#, &[])
        .failed();
    assert!(
        run.stderr
            .contains("ai.ask: the history is empty: give a prompt or a list of messages"),
        "{}",
        run.stderr
    );
    // The same mistake in `ai.run`'s `messages` is named too.
    let run = sandbox
        .lua(
            r#"ai.run{ provider = "openai", messages = { role = "user", content = "hi" } }"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr.contains(
            "ai.run: history must be a string or a list of messages, not a table with keys \
             content, role"
        ),
        "{}",
        run.stderr
    );
    assert!(fake.requests().is_empty(), "nothing reached the provider");
}

#[test]
fn a_misspelt_field_of_a_history_entry_or_a_file_is_named() {
    // `file = ...` for `files`, `contnet_type`: the file was dropped without a word.
    let fake = FakeProvider::start();
    let sandbox = sandbox(&fake, "openai");
    sandbox.write("a.txt", "attached");
    let cases = [
        (
            r#"ai.ask({ { role = "user", content = "hi", file = { "a.txt" } } }, { provider = "openai" })"#,
            "script.lua:1: ai.ask: history[1]: unknown field \"file\" (fields: role, content, \
             files, tool_calls, tool_call_id, name, is_error)",
        ),
        (
            r#"ai.run{ provider = "openai", prompt = "hi", files = { { path = "a.txt", contnet_type = "text/plain" } } }"#,
            "script.lua:1: ai.run: files[1]: unknown field \"contnet_type\" (fields: path, data, \
             ref, name, content_type, kind, size, sha256, shed, text)",
        ),
    ];
    for (source, expected) in cases {
        let run = sandbox.lua(source, &[]).failed();
        assert!(run.stderr.contains(expected), "{source}\n{}", run.stderr);
    }
    assert!(fake.requests().is_empty(), "nothing reached the provider");
    // What a turn gives back, files included, goes back as it is.
    fake.push(Reply::text("seen"));
    fake.push(Reply::text("again"));
    let run = sandbox
        .lua(
            r#"local t = ai.take_turn{ provider = "openai", messages = {
                 { role = "user", content = "look", files = { "a.txt" } } } }
               local f = ai.view_file(t.messages[1].files[1].ref)
               local again = ai.ask({ { role = "user", content = "and", files = { f } } },
                 { provider = "openai" })
               print(t.messages[2].content, again)"#,
            &[],
        )
        .ok();
    assert_eq!(run.lines(), ["seen\tagain"], "{}", run.stderr);
}

#[test]
fn keys_are_redacted_from_error_messages() {
    let fake = FakeProvider::start();
    let body = r#"{"error":{"message":"Incorrect API key provided: test-key-openai-0123456789","type":"invalid_request_error","code":"invalid_api_key"}}"#;
    fake.push(Reply::status(401).body(body));
    let run = sandbox(&fake, "openai")
        .lua(
            r#"local r, e = ai.ask("hi", { provider = "openai" }) print(tostring(e))"#,
            &[],
        )
        .ok();
    assert!(
        run.stdout
            .contains("Incorrect API key provided: [redacted]"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("0123456789"));
}

/// A key the provider's answer quotes is taken out wherever the answer puts it: a page answered
/// with 200 (its title is summarised), an error event mid-stream. Only error bodies with an
/// error status were redacted, and these printed the key in the error, the log and the CLI.
#[test]
fn keys_are_redacted_from_a_page_answered_with_200_and_a_mid_stream_error() {
    let fake = FakeProvider::start();
    let key = "test-key-openai-0123456789";
    fake.push(
        Reply::status(200)
            .header("content-type", "text/html")
            .body(format!(
                "<html><head><title>Login for {key}</title></head></html>"
            )),
    );
    fake.push(Reply::stream_error("api_error", format!("key {key} revoked")).with_text("x"));
    let run = sandbox(&fake, "openai")
        .lua(
            r#"for _, stream in ipairs{ false, true } do
                 local r, e = ai.ask("hi", { provider = "openai", stream = stream })
                 print(e.kind, e.message)
               end"#,
            &[],
        )
        .ok();
    let lines = run.lines();
    assert_eq!(lines.len(), 2, "{}", run.stdout);
    assert!(lines[0].contains("Login for [redacted]"), "{}", lines[0]);
    assert!(lines[1].contains("key [redacted] revoked"), "{}", lines[1]);
    assert!(!run.stdout.contains(key), "{}", run.stdout);
    assert!(!run.stderr.contains(key), "{}", run.stderr);
}

#[test]
fn text_fallback_describes_tools_and_parses_the_block_back() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake, "openai");
    let config = "[use.general]\nprovider = \"openai\"\ntools = \"text\"\n";
    std::fs::write(sb.path("config.toml"), config).unwrap();
    fake.push(Reply::text(
        "I will look.\n```json\n{\"tool\": \"weather.current\", \"arguments\": {\"city\": \"Rome\"}}\n```",
    ));
    fake.push(Reply::text(
        "```json\n{\"tool\": \"weather.current\", \"arguments\": {\"city\": \n```",
    ));
    let run = sb
        .lua(
            r#"local tools = { { name = "weather.current", description = "Weather in a city" } }
               local r, e, calls = ai.ask("Weather in Rome?", { tools = tools })
               assert(r, e)
               print(r, calls[1].name, calls[1].arguments.city)
               r, e, calls = ai.ask("again", { tools = tools })
               print(calls == nil, r:sub(1, 7))"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        ["I will look.\tweather.current\tRome", "true\t```json"]
    );
    let first = &model_calls(&fake)[0];
    assert!(
        first.get("tools").is_none(),
        "no native tools on the wire: {first}"
    );
    let system = first["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("weather.current: Weather in a city"),
        "{system}"
    );
    assert!(system.contains("```json"), "{system}");
}

#[test]
fn tool_choice_and_extra_reach_the_wire() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("ok"));
    sandbox(&fake, "openai")
        .lua(
            r#"assert(ai.ask("hi", { provider = "openai", tools = { { name = "a" } }, tool_choice = "a",
                 temperature = 0.5, stop = { "END" }, extra = { seed = 7, stream_options = { include_usage = false } } }))"#,
            &[],
        )
        .ok();
    let body = &model_calls(&fake)[0];
    assert_eq!(
        body["tool_choice"],
        json!({"type": "function", "function": {"name": "a"}})
    );
    assert_eq!(body["temperature"], 0.5);
    assert_eq!(body["stop"], json!(["END"]));
    assert_eq!(body["seed"], 7);
}

#[test]
fn anthropic_needs_max_tokens_and_gets_4096() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("ok"));
    sandbox(&fake, "anthropic")
        .lua(r#"assert(ai.ask("hi", { provider = "anthropic" }))"#, &[])
        .ok();
    assert_eq!(model_calls(&fake)[0]["max_tokens"], 4096);
}

#[test]
fn ask_simple_and_aliases() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("one"));
    fake.push(Reply::text("two"));
    let run = sandbox(&fake, "gemini")
        .lua(
            r#"print(ai.ask_simple("a", { provider = "gemini" }))
               print(ai.askSimple("b", { provider = "gemini" }))
               print(ai.fetchModels == ai.models)"#,
            &[],
        )
        .ok();
    assert_eq!(run.lines(), ["one", "two", "true"]);
}

#[test]
fn models_are_listed_over_the_network() {
    let fake = FakeProvider::start();
    for style in STYLES {
        let run = sandbox(&fake, style).colony(&["models", style]).ok();
        assert!(run.lines().len() >= 2, "{style}: {}", run.stdout);
        let lua = sandbox(&fake, style)
            .lua(&format!(r#"local m = assert(ai.models{{ provider = "{style}" }}) print(#m >= 2, m[1] ~= nil)"#), &[])
            .ok();
        assert_eq!(lua.stdout.trim(), "true\ttrue");
    }
}

/// Reasoning and signatures ride through a script's hand-written tool loop (on the calls list it
/// hands back) and reach the next request in the style's own shape.
#[test]
fn opaque_reasoning_travels_back_through_lua() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(
            Reply::tool_call("call_1", "weather_current", json!({"city": "Paris"}))
                .reasoning("The user wants weather.", "sig-0123456789"),
        );
        fake.push(Reply::text("Clear."));
        let script = TOOL_LOOP.replace("PROVIDER", &format!("{style:?}"));
        sandbox(&fake, style).lua(&script, &[]).ok();
        let second = &model_calls(&fake)[1];
        match style {
            "anthropic" => {
                let first_block = &second["messages"][1]["content"][0];
                assert_eq!(first_block["type"], "thinking", "{second}");
                assert_eq!(first_block["thinking"], "The user wants weather.");
                assert_eq!(first_block["signature"], "sig-0123456789");
            }
            "openai" => {
                assert_eq!(
                    second["messages"][1]["reasoning_content"], "The user wants weather.",
                    "{second}"
                );
            }
            _ => {
                let parts = second["contents"][1]["parts"].as_array().unwrap();
                let call = parts
                    .iter()
                    .find(|p| p.get("functionCall").is_some())
                    .unwrap();
                assert_eq!(call["thoughtSignature"], "sig-0123456789", "{second}");
            }
        }
    }
}

#[test]
fn json_cut_short_within_its_announced_length_is_named_as_the_server_s() {
    // All the bytes the server announced came: it was not cut off on the way, as the message
    // said. Still transient (a proxy whose upstream failed mid-answer may do better next time).
    let fake = FakeProvider::start();
    fake.push(Reply::status(200).body(r#"{"id": "x", "choices": [ {"#));
    let run = sandbox(&fake, "openai")
        .lua(
            r#"local r, e = ai.ask("hi", { provider = "openai" }) print(e.kind, e.transient, e.message)"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [
            "fetch_error\ttrue\trequest failed: the answer's JSON stops half-way (26 bytes, all the server \
          announced: it sent an unfinished answer)"
        ],
        "{}",
        run.stderr
    );
}

/// A streamed call answered 200 with something that is not a stream of events: a proxy's
/// sign-in page is an `api_error` naming the page (it was "the stream ended before [DONE]", a
/// failure that passes, so it was tried again); a gateway's error in a 200 is that error; a
/// server that ignores `stream: true` and answers whole has its answer read, its text handed
/// over as one delta.
#[test]
fn a_streamed_call_answered_with_a_page_or_a_whole_answer_reads_it_as_what_it_is() {
    let page = "<!DOCTYPE html><html><head><title>Sign in to Corporate Proxy</title></head>\n\
                <body><form>...</form></body></html>";
    let html = error_of(
        "openai",
        Reply::status(200)
            .body(page)
            .header("content-type", "text/html; charset=utf-8"),
        true,
    );
    assert!(html.starts_with("api_error\tfalse\tnil\t200"), "{html}");
    assert!(
        html.contains("not a stream of events") && html.contains("Sign in to Corporate Proxy"),
        "{html}"
    );
    let gateway = error_of(
        "openai",
        Reply::status(200)
            .body(r#"{"error":{"message":"model overloaded","type":"server_error"}}"#),
        true,
    );
    assert!(gateway.starts_with("provider_error\ttrue"), "{gateway}");
    assert!(
        gateway.contains("in a 200 answer: model overloaded"),
        "{gateway}"
    );

    let fake = FakeProvider::start();
    fake.push(
        Reply::status(200).body(
            json!({
                "id": "c1", "object": "chat.completion", "model": "m",
                "choices": [{ "index": 0, "finish_reason": "stop",
                              "message": { "role": "assistant", "content": "Paris." } }],
                "usage": { "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5 }
            })
            .to_string(),
        ),
    );
    let run = sandbox(&fake, "openai")
        .lua(
            r#"local seen = {}
               local r, e = ai.ask("hi", { provider = "openai",
                 stream = function(d) seen[#seen + 1] = d end })
               print(r, e, table.concat(seen, "|"))"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout.trim(), "Paris.\tnil\tParis.");
}

/// `colony models PROVIDER` finds the provider's key and base URL in the use-type set to it:
/// only `[use.general]` was read, so a key kept under `[use.chat]` was "missing", and the
/// error sent the user to put it in a table for another provider.
#[test]
fn models_finds_the_key_of_the_use_type_set_to_the_provider() {
    let fake = FakeProvider::start();
    let sb = support::script::Sandbox::new();
    std::fs::write(
        sb.path("config.toml"),
        format!(
            "[use.general]\nprovider = \"openai\"\n\n[use.chat]\nprovider = \"anthropic\"\n\
             key = \"chat-key-0123456789\"\nbase_url = \"{}\"\n",
            fake.base_url("anthropic")
        ),
    )
    .unwrap();
    let run = sb.colony(&["models", "anthropic"]).ok();
    assert!(run.lines().len() >= 2, "{}", run.stdout);
    let asked = fake.requests();
    let key = asked
        .last()
        .unwrap()
        .headers
        .iter()
        .find(|(k, _)| k == "x-api-key");
    assert_eq!(key.map(|(_, v)| v.as_str()), Some("chat-key-0123456789"));
    // Named outright, the same.
    sb.colony(&["models", "anthropic", "--use", "chat"]).ok();
    let run = sb
        .colony(&["models", "anthropic", "--use", "general"])
        .failed();
    assert!(
        run.stderr.contains("missing key for anthropic"),
        "{}",
        run.stderr
    );
    // Not told to put it in general's table, whose provider is openai.
    assert!(
        run.stderr.contains(
            "(or key_env / key in a use-type set to anthropic, named with --use or use =, in "
        ),
        "{}",
        run.stderr
    );
}
