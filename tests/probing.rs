//! The defects probing found (issue 13), each through the binary against servers on loopback:
//! endless bodies end at a limit, keys stay home on a redirect, absurd durations are errors and
//! not panics, both forms of Retry-After are waited, MCP `env` values are secrets, oversized
//! attachments and tool results are cut, and the same fault reads the same streamed or not.

mod support;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::json;
use support::fake::{FakeProvider, Reply};
use support::script::{Run, Sandbox};
use support::{STYLES, model_calls, serve, styled};

/// A body that never ends: the same 64 KiB chunk forever (SSE comment lines when `sse`).
fn endless(sse: bool) -> Body {
    let line = if sse {
        ": padding "
    } else {
        "{\"padding\": \""
    };
    let chunk = Bytes::from(format!(
        "{line}{}\n",
        "x".repeat(64 * 1024 - line.len() - 1)
    ));
    Body::from_stream(futures::stream::repeat_with(move || {
        Ok::<_, std::io::Error>(chunk.clone())
    }))
}

/// A server answering every request with an endless 200 body (SSE when the request streams).
fn endless_server() -> String {
    serve(Router::new().fallback(|uri: Uri, body: Bytes| async move {
        let text = String::from_utf8_lossy(&body);
        let sse = text.contains("\"stream\":true") || uri.path().contains("stream");
        let mut resp = Response::new(endless(sse));
        let ct = if sse {
            "text/event-stream"
        } else {
            "application/json"
        };
        resp.headers_mut()
            .insert("content-type", ct.parse().unwrap());
        resp
    }))
}

fn version(style: &str) -> &'static str {
    if style == "gemini" { "v1beta" } else { "v1" }
}

/// A sandbox whose `general` use-type is `style` at `root/<style>/<version>`, with a key.
fn pointed_at(root: &str, style: &str, extra: &str) -> Sandbox {
    let sb = Sandbox::new();
    sb.write(
        "config.toml",
        &format!(
            "[use.general]\nprovider = \"{style}\"\nmodel = \"m\"\nkey = \"planted-key-0123456789\"\n\
             base_url = \"{root}/{style}/{}\"\n{extra}",
            version(style)
        ),
    );
    sb
}

#[test]
fn an_endless_model_answer_ends_at_max_response_bytes_in_every_style_streamed_or_not() {
    let root = endless_server();
    for style in STYLES {
        let sb = pointed_at(&root, style, "max_response_bytes = 1048576\n");
        let run = sb
            .lua(
                r#"local r, err = ai.ask("hi")
                   print(err.kind, err.transient, err.message)
                   r, err = ai.ask("hi", { stream = function() end })
                   print(err.kind, err.transient, err.message)"#,
                &[],
            )
            .ok();
        // A setting to change, not a failure that passes: each try would read the limit's
        // worth again, and a resident would wait in an outage for good.
        let want = "config_error\tfalse\tthe answer is larger than the limit of 1048576 \
                    bytes (1 MiB); raise max_response_bytes in the use-type to read more";
        assert_eq!(run.lines(), [want, want], "{style}: {}", run.stderr);
    }
}

#[test]
fn an_endless_http_body_ends_at_max_bytes_or_32_mib() {
    let root = endless_server();
    let run = Sandbox::new()
        .lua(
            &format!(
                r#"local r, err = http.get("{root}/big", {{ max_bytes = 100000 }})
                   print(r, err.kind, err.message)
                   r, err = http.get("{root}/big")
                   print(r, err.kind, err.message)"#
            ),
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [
            format!(
                "nil\tfetch_error\tGET {root}/big: the answer is larger than the limit of 100000 \
                 bytes; pass max_bytes to read more"
            ),
            format!(
                "nil\tfetch_error\tGET {root}/big: the answer is larger than the limit of \
                 33554432 bytes (32 MiB); pass max_bytes to read more"
            )
        ]
    );
}

/// What a server saw: each request's path and headers.
type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

/// A server that records every request and answers `answer`.
fn recording(answer: &'static str) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let root = serve(Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push((uri.to_string(), headers));
            answer
        }
    }));
    (root, seen)
}

/// A server that answers every request with a 307 to `to` + the request's path and query.
fn redirecting(to: String) -> String {
    serve(Router::new().fallback(move |uri: Uri| {
        let to = to.clone();
        async move {
            let target = format!("{to}{}", uri.path_and_query().unwrap());
            Response::builder()
                .status(StatusCode::TEMPORARY_REDIRECT)
                .header("location", target)
                .body(Body::empty())
                .unwrap()
        }
    }))
}

#[test]
fn a_provider_redirect_to_another_host_carries_no_key_there() {
    let (other, seen) = recording("{}");
    let root = redirecting(other.clone());
    for style in STYLES {
        let run = pointed_at(&root, style, "")
            .lua(
                r#"local r, err = ai.ask("hi")
                   print(err.kind, err.transient, err.message)"#,
                &[],
            )
            .ok();
        let line = run.stdout.trim_end();
        // The base URL's to mend: trying again meets the same redirect.
        assert!(line.starts_with("config_error\tfalse\t"), "{style}: {line}");
        assert!(
            line.contains(&format!(
                "the provider redirected to another host ({other}/{style}/"
            )),
            "{style}: {line}"
        );
        assert!(!run.stdout.contains("planted-key"), "{style}");
    }
    assert!(seen.lock().unwrap().is_empty(), "the other host was called");
}

/// A 301 or 302 on the same host would have the call sent on as a GET without its body (which
/// the server answered 405, the redirect unsaid): refused, naming it and where it points.
#[test]
fn a_provider_redirect_that_would_drop_the_body_is_named_not_followed() {
    for status in [StatusCode::MOVED_PERMANENTLY, StatusCode::FOUND] {
        let seen: Seen = Arc::default();
        let log = seen.clone();
        let root = serve(Router::new().fallback(move |method: Method, uri: Uri| {
            let log = log.clone();
            async move {
                log.lock()
                    .unwrap()
                    .push((format!("{method} {uri}"), HeaderMap::new()));
                let target = format!("/moved{}", uri.path_and_query().unwrap());
                let moved = uri.path().starts_with("/moved");
                // Where it moved: a model list for a GET, nothing for a POST turned into one.
                let (answer, body) = match (moved, method == Method::GET) {
                    (true, true) => (StatusCode::OK, r#"{"data":[{"id":"moved-model"}]}"#),
                    (true, false) => (StatusCode::METHOD_NOT_ALLOWED, ""),
                    (false, _) => (status, ""),
                };
                Response::builder()
                    .status(answer)
                    .header("location", target)
                    .body(Body::from(body))
                    .unwrap()
            }
        }));
        let run = pointed_at(&root, "openai", "")
            .lua(
                r#"local r, err = ai.ask("hi")
                   print(err.kind, err.transient, err.message)"#,
                &[],
            )
            .ok();
        let line = run.stdout.trim_end();
        assert!(
            line.starts_with("config_error\tfalse\t"),
            "{status}: {line}"
        );
        assert!(
            line.contains(&format!(
                "the provider answered {status} to {root}/moved/openai/v1/chat/completions: a \
                 redirect that would send the call on as a GET without its body"
            )),
            "{status}: {line}"
        );
        {
            let seen = seen.lock().unwrap();
            assert!(
                seen.iter()
                    .all(|(request, _)| request.starts_with("POST /openai/")),
                "{status}: {:?}",
                seen.iter().map(|(r, _)| r).collect::<Vec<_>>()
            );
        }
        // A model list is a GET, which has no body to lose: its redirect is followed.
        let run = pointed_at(&root, "openai", "")
            .colony(&["models", "openai"])
            .ok();
        assert_eq!(run.stdout, "moved-model\n", "{status}: {}", run.stderr);
    }
}

#[test]
fn an_mcp_servers_headers_do_not_follow_a_redirect_to_another_host() {
    // The configured URL answers 307 to another host: the connection fails on the redirect, and
    // the server's token never reaches the other host.
    let (other, seen) = recording("{}");
    let root = redirecting(other.clone());
    let run = Sandbox::new()
        .lua(
            &format!(
                r#"local conn, err = mcp.connect{{ url = "{root}/mcp", headers = {{ Authorization = "Bearer planted-0123456789" }} }}
                   print(conn, err.kind)
                   print(err.message:find("redirect", 1, true) ~= nil, err.message:find("::", 1, true))"#
            ),
            &[],
        )
        .ok();
    // The cause as a person reads it: no Rust type names of the SDK's.
    assert_eq!(
        run.stdout, "nil\tconnect_error\ntrue\tnil\n",
        "{}",
        run.stderr
    );
    assert!(!run.stdout.contains("planted"));
    assert!(seen.lock().unwrap().is_empty(), "the other host was called");
}

#[test]
fn http_drops_the_scripts_headers_and_any_referer_when_a_redirect_leaves_the_origin() {
    let (other, seen) = recording("elsewhere");
    let root = redirecting(other.clone());
    let run = Sandbox::new()
        .lua(
            &format!(
                r#"local h = {{ ["X-Api-Key"] = "planted-0123456789", Authorization = "Bearer planted" }}
                   local r = assert(http.get("{root}/data?key=planted-query", {{ headers = h }}))
                   print(r.status, r.body)"#
            ),
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "200\telsewhere\n", "{}", run.stderr);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    let (path, headers) = &seen[0];
    assert_eq!(path, "/data?key=planted-query");
    for name in ["x-api-key", "authorization", "referer"] {
        assert!(headers.get(name).is_none(), "{name} reached the other host");
    }
}

#[test]
fn http_keeps_the_scripts_headers_on_a_redirect_within_the_origin() {
    // `/first` redirects to `/second` on the same server, which records what it got.
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let root = serve(Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let log = log.clone();
        async move {
            if uri.path() == "/first" {
                return Response::builder()
                    .status(StatusCode::TEMPORARY_REDIRECT)
                    .header("location", "/second")
                    .body(Body::empty())
                    .unwrap();
            }
            log.lock().unwrap().push((uri.to_string(), headers));
            Response::new(Body::from("here"))
        }
    }));
    let run = Sandbox::new()
        .lua(
            &format!(
                r#"local r = assert(http.get("{root}/first", {{ headers = {{ ["X-Api-Key"] = "k-0123456789" }} }}))
                   print(r.status, r.body)"#
            ),
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "200\there\n");
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].0, "/second");
    assert_eq!(
        seen[0].1.get("x-api-key").unwrap().to_str().unwrap(),
        "k-0123456789"
    );
}

#[test]
fn absurd_durations_are_clear_errors_not_panics() {
    let fake = FakeProvider::start();
    let root = fake.url();
    let script = format!(
        r#"local function try(what, f)
             local ok, e = pcall(f)
             print(what, ok, e)
           end
           try("ask", function() return ai.ask("hi", {{ timeout = math.huge }}) end)
           try("sleep", function() ai.sleep(math.huge) end)
           try("sleep_nan", function() ai.sleep(0/0) end)
           try("tool", function() return ai.tool{{ name = "t", parameters = {{}}, timeout = math.huge,
             handler = function() end }} end)
           try("http", function() return http.get("{root}/stats", {{ timeout = 1e300 }}) end)"#
    );
    let sb = styled(&fake, "openai");
    let at = sb.path("script.lua").display().to_string();
    let run = sb.lua(&script, &[]).ok();
    // A function that returns the call is a tail call: its line is `try`'s `pcall`, as in Lua.
    assert_eq!(
        run.lines(),
        [
            format!(
                "ask\tfalse\t{at}:2: ai.ask: timeout: inf is longer than the maximum of 365 days (31536000 s)"
            ),
            format!(
                "sleep\tfalse\t{at}:6: ai.sleep: ms: inf is longer than the maximum of 365 days (31536000 s)"
            ),
            format!("sleep_nan\tfalse\t{at}:7: ai.sleep: ms: NaN is not a duration"),
            format!(
                "tool\tfalse\t{at}:8: ai.tool: tool t: timeout: inf is longer than the maximum of 365 days (31536000 s)"
            ),
            format!(
                "http\tfalse\t{at}:2: http.get: timeout: 1e300 s is longer than the maximum of 365 days (31536000 s)"
            ),
        ],
        "{}",
        run.stderr
    );
    for (value, message) in [
        (
            "inf",
            "inf is longer than the maximum of 365 days (31536000 s)",
        ),
        (
            "1e300",
            "1e300 s is longer than the maximum of 365 days (31536000 s)",
        ),
        ("-1", "-1 s is negative; a duration is 0 or more"),
        // Read as "no timeout" by some, it ended every call at once.
        (
            "0",
            "must be more than 0 seconds (0 would end every call at once)",
        ),
    ] {
        // A config no call could use is refused when it is read, naming file, table and value,
        // by the program and by `colony ask` alike (never a panic, never a call).
        let sb = styled(&fake, "openai");
        let config = sb.write(
            "config.toml",
            &format!("[use.general]\nprovider = \"openai\"\ntimeout = {value}\n"),
        );
        let refusal = format!(
            "colony: {}: [use.general] timeout = {value}: {message}\n",
            config.display()
        );
        let run = sb.lua(r#"ai.ask("hi")"#, &[]);
        assert_eq!(run.code, 2, "{value}: {}", run.stderr);
        assert_eq!(run.stderr, refusal, "{value}");
        let ask = sb.colony(&["ask", "hi"]);
        assert_eq!(ask.code, 2, "{value}: {}", ask.stderr);
        assert_eq!(ask.stderr, refusal, "{value}");
    }
    assert_eq!(fake.calls(), 0);
}

/// `ai.models` refuses an option it does not know, as every other options table does: a
/// misspelt `bse_url` listed the configured server's models instead.
#[test]
fn ai_models_refuses_an_unknown_option() {
    let sb = support::script::Sandbox::new();
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            r#"print(select(2, pcall(ai.models, { provider = "openai", bse_url = "x" })))"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [format!(
            "{at}:1: ai.models: unknown field \"bse_url\" (fields: provider, key, base_url, use)"
        )]
    );
}

/// `ai.watch{ grace_ms = -1 }` says why as every other duration does ("must be a number of
/// milliseconds" it said of a number).
#[test]
fn a_negative_grace_is_named_as_other_durations_are() {
    let sb = support::script::Sandbox::new();
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            r#"print(select(2, pcall(ai.watch, { grace_ms = -1 })))"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [format!(
            "{at}:1: ai.watch: grace_ms: -1 ms is negative; a duration is 0 or more"
        )]
    );
}

#[test]
fn an_error_colony_raises_is_caught_as_a_string_as_lua_s_own_are() {
    let fake = FakeProvider::start();
    let script = r#"
      local ok, e = pcall(function() ai.sleep(-1) end)
      print("pcall", ok, type(e), e, e:find("negative", 1, true) ~= nil)
      print("xpcall", xpcall(function() ai.sleep(0 / 0) end, function(m)
        return type(m) .. " " .. m
      end))
      local co = coroutine.create(function() json.encode({ 1, 2, x = 3 }) end)
      local resumed, ce = coroutine.resume(co)
      print("coroutine", resumed, type(ce))
      print("own", pcall(error, "mine", 0))
      print("table", type(select(2, pcall(error, { code = 7 }))))"#;
    let sb = styled(&fake, "openai");
    let at = sb.path("script.lua").display().to_string();
    let run = sb.lua(script, &[]).ok();
    // Each with the script line that made the call, as Lua's own errors have theirs.
    assert_eq!(
        run.lines(),
        [
            format!("pcall\tfalse\tstring\t{at}:2: ai.sleep: ms: -1 ms is negative; a duration is 0 or more\ttrue").as_str(),
            &format!("xpcall\tfalse\tstring {at}:4: ai.sleep: ms: NaN is not a duration"),
            "coroutine\tfalse\tstring",
            "own\tfalse\tmine",
            "table\ttable",
        ],
        "{}",
        run.stderr
    );
}

/// Runs one resident whose first call meets a 429 with `header = value`, with retries that
/// wait only what the provider asks (`base_ms = 0`) up to `cap_ms`; returns the `wait_ms` the
/// retry logged and what was delivered.
fn retried_after(header: &str, value: &str, cap_ms: u64) -> (Vec<u64>, String) {
    let fake = FakeProvider::start();
    fake.push(Reply::status(429).header(header, value));
    fake.push(Reply::text("answered"));
    let run = styled(&fake, "openai")
        .env("RUST_LOG", "colony::infer=debug")
        .lua(
            &format!(
                r#"ai.spawn{{ name = "w", provider = "openai", model = "m",
                     middleware = {{ ai.with_retries{{ attempts = 2, base_ms = 0, cap_ms = {cap_ms} }} }},
                     deliver_to = function(reply) print(reply) ai.stop("done") end,
                     sources = {{ function(self) ai.mail{{ to = self, source = "t", content = "hi", hop = 0 }} end }} }}
                   print(ai.watch{{}})"#
            ),
            &[],
        )
        .ok();
    assert_eq!(fake.calls(), 2, "{}", run.stderr);
    let waits = run
        .stderr
        .lines()
        .filter(|l| l.contains("retrying after a transient failure"))
        .map(|l| {
            let at = l.find("wait_ms=").expect("wait_ms logged") + "wait_ms=".len();
            let digits: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().unwrap()
        })
        .collect();
    (waits, run.stdout)
}

#[test]
fn retry_after_in_seconds_is_waited() {
    let (waits, out) = retried_after("retry-after", "1", 60_000);
    assert_eq!(waits, [1000]);
    assert_eq!(out, "answered\ndone\n");
}

#[test]
fn a_long_retry_after_stays_transient_and_is_capped_by_the_middleware() {
    let (waits, out) = retried_after("retry-after", "300", 1000);
    assert_eq!(waits, [1000]);
    assert_eq!(out, "answered\ndone\n");
}

#[test]
fn retry_after_as_an_http_date_is_waited() {
    let when = std::time::SystemTime::now() + std::time::Duration::from_secs(3);
    let (waits, out) = retried_after("retry-after", &httpdate::fmt_http_date(when), 60_000);
    assert_eq!(waits.len(), 1);
    // The date has whole seconds: the wait is what was left of the three, so above zero.
    assert!((1..=3000).contains(&waits[0]), "{waits:?}");
    assert_eq!(out, "answered\ndone\n");
}

#[test]
fn a_retry_after_is_reported_on_the_error() {
    let fake = FakeProvider::start();
    fake.push(Reply::status(429).header("retry-after", "300"));
    let run = styled(&fake, "anthropic")
        .lua(
            r#"local r, err = ai.ask("hi", { provider = "anthropic" })
               print(err.kind, err.transient, err.retry_after)"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "provider_error\ttrue\t300.0\n");
}

#[test]
fn an_mcp_servers_env_values_appear_nowhere() {
    const TOKEN: &str = "planted-mcp-token-0123456789";
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call(
        "c1",
        "envy__echo",
        json!({"text": "hello"}),
    ));
    fake.push(Reply::text("done"));
    let sb = styled(&fake, "openai").env("RUST_LOG", "colony::mcp=info");
    sb.write(
        "config.toml",
        &format!(
            "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\n\n[mcp.envy]\ncommand = \"{}\"\n\
             args = [\"{}\", \"stdio\"]\nenv = {{ SECRET_TOKEN = \"{TOKEN}\", ECHO_ENV = \"SECRET_TOKEN\" }}\n",
            support::mcp::python().display(),
            support::mcp::server_script().display()
        ),
    );
    let cassette = sb.path("run.jsonl");
    let state = sb.path("state-dir");
    let run = sb
        .lua(
            r#"local r = ai.take_turn{ prompt = "go", mcp = { "envy" } }
               store.set("turn", r.messages)
               print(r.reply)"#,
            &[
                "--record",
                &cassette.display().to_string(),
                "--state",
                &state.display().to_string(),
            ],
        )
        .ok();
    assert_eq!(run.stdout, "done\n");
    // The server did log it, redacted.
    assert!(run.stderr.contains("token is [redacted]"), "{}", run.stderr);
    assert!(!run.stderr.contains(TOKEN), "{}", run.stderr);
    let mut files = vec![std::fs::read(&cassette).unwrap()];
    for entry in std::fs::read_dir(&state).unwrap() {
        files.push(std::fs::read(entry.unwrap().path()).unwrap_or_default());
    }
    for bytes in files {
        assert!(!String::from_utf8_lossy(&bytes).contains(TOKEN));
    }
    let sent = serde_json::to_string(&model_calls(&fake)).unwrap();
    assert!(!sent.contains(TOKEN));
}

/// Asks `style`'s model (config `config`) about the file `name` of `bytes`; the run and the
/// first request as sent, which must not hold the file (under 100 KB).
fn asked_with_a_file(style: &str, config: &str, name: &str, bytes: Vec<u8>) -> (Run, String) {
    let fake = FakeProvider::start();
    fake.push(Reply::text("read"));
    let sb = styled(&fake, style);
    sb.write("config.toml", config);
    std::fs::write(sb.path(name), &bytes).unwrap();
    let run = sb
        .lua(
            &format!(
                r#"local r, err = ai.ask({{ {{ role = "user", content = "look", files = {{ "{name}" }} }} }})
                   print(r or err.message)"#
            ),
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "read\n", "{}", run.stderr);
    let sent = serde_json::to_string(&model_calls(&fake)[0]).unwrap();
    assert!(
        sent.len() < 100_000,
        "{name} was sent: {} bytes",
        sent.len()
    );
    (run, sent)
}

#[test]
fn an_attachment_past_the_providers_size_becomes_a_note() {
    // 25 MB: under Anthropic's 32 MB request only before base64, so over what it takes.
    let mut pdf = b"%PDF-1.4\n".to_vec();
    pdf.resize(25_000_000, b' ');
    let (run, sent) = asked_with_a_file(
        "anthropic",
        "[use.general]\nprovider = \"anthropic\"\nmodel = \"m\"\n",
        "big.pdf",
        pdf,
    );
    assert!(
        sent.contains(
            "[file big.pdf (application/pdf, 25.0 MB): larger than this model's API takes \
             (24.0 MB for one file), so its content is absent]"
        ),
        "{sent}"
    );
    // Said on stderr too, as a file of a type the API cannot read is (it went without a word).
    assert!(
        run.stderr.contains(
            "big.pdf (application/pdf) is not sent: larger than this model's API takes (24.0 MB \
             for one file), so the model is told its content is absent"
        ),
        "{}",
        run.stderr
    );
}

/// OpenAI's 20 MB an image counts the base64 the wire carries: a raw 16 MB image is over it
/// (it went out as a 21 MB data URL).
#[test]
fn an_openai_image_past_20_mb_as_base64_becomes_a_note() {
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.resize(16_000_000, 0);
    let (_, sent) = asked_with_a_file(
        "openai",
        "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nimages = true\n",
        "big.png",
        png,
    );
    assert!(
        sent.contains("larger than this model's API takes (15.0 MB for one file)"),
        "{sent}"
    );
}

#[test]
fn a_long_tool_result_is_capped_for_the_model_and_whole_for_the_script() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "dump", json!({})));
    fake.push(Reply::text("seen"));
    let run = styled(&fake, "openai")
        .lua(
            r#"local dump = ai.tool{ name = "dump", parameters = {},
                 handler = function() return string.rep("y", 1000000) end }
               local r = ai.take_turn{ prompt = "go", tools = { dump }, provider = "openai", model = "m",
                 on_step = function(s) if s.results[1] then print("whole", #s.results[1].content) end end }
               print(r.reply)"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "whole\t1000000\nseen\n", "{}", run.stderr);
    let calls = model_calls(&fake);
    assert_eq!(calls.len(), 2);
    let sent = serde_json::to_string(&calls[1]).unwrap();
    assert!(sent.len() < 200_000, "{} bytes sent", sent.len());
    let result = calls[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(result.starts_with(&"y".repeat(100_000)));
    assert!(
        result.ends_with(
            "\n[colony: the result was cut here: 900000 of its 1000000 characters were left out \
             (a tool result is at most 100000 characters for the model)]"
        ),
        "{}",
        &result[100_000..]
    );
}

#[test]
fn a_truncated_body_and_an_error_in_a_200_classify_alike_streamed_or_not() {
    for style in STYLES {
        let fake = FakeProvider::start();
        // Cut: a whole body whose JSON stops half-way; a stream cut before its end.
        fake.push(Reply::malformed());
        fake.push(Reply::drop_mid_stream("Hello there, a long answer"));
        let overloaded = match style {
            "anthropic" => {
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
            }
            _ => {
                json!({"error": {"message": "Overloaded", "type": "overloaded_error", "code": "overloaded_error"}})
            }
        };
        fake.push(Reply::status(200).body(overloaded.to_string()));
        fake.push(Reply::stream_error("overloaded_error", "Overloaded"));
        let run = styled(&fake, style)
            .lua(
                &format!(
                    r#"local function show(r, err) print(err.kind, err.transient) end
                       show(ai.ask("a", {{ provider = "{style}" }}))
                       show(ai.ask("b", {{ provider = "{style}", stream = function() end }}))
                       show(ai.ask("c", {{ provider = "{style}" }}))
                       show(ai.ask("d", {{ provider = "{style}", stream = function() end }}))"#
                ),
                &[],
            )
            .ok();
        assert_eq!(
            run.lines(),
            [
                "fetch_error\ttrue",
                "fetch_error\ttrue",
                "provider_error\ttrue",
                "provider_error\ttrue"
            ],
            "{style}: {}",
            run.stderr
        );
    }
}

#[test]
fn a_streaming_timeout_says_it_timed_out() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("slow words come one by one").stream_delay(2000));
    let sb = styled(&fake, "openai");
    sb.write(
        "config.toml",
        "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\ntimeout = 0.5\n",
    );
    let run = sb
        .lua(
            r#"local r, err = ai.ask("hi", { stream = function() end })
               print(err.kind, err.message)"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.stdout,
        "fetch_error\trequest failed: timed out after 0.5 s (its use-type's timeout, or the call's own)\n"
    );
}

#[test]
fn fs_write_on_a_read_only_file_is_permission_denied() {
    let sb = Sandbox::new();
    let file = sb.write("locked.txt", "keep me");
    let mut perms = std::fs::metadata(&file).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&file, perms).unwrap();
    let run = sb
        .lua(
            r#"local ok, err = fs.write("locked.txt", "new")
               print(ok, err.kind)"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "nil\tpermission_denied\n");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

/// A model list of another shape (a base URL that reaches something else, a proxy's own JSON)
/// is a parse error naming the list it lacks: it listed nothing, status 0, as if the account
/// had no models. An empty list is said on stderr.
#[test]
fn a_model_list_of_another_shape_is_an_error_not_an_empty_list() {
    let (root, _) = recording(r#"{"foo": 1}"#);
    for (style, list) in [
        ("openai", "data"),
        ("anthropic", "data"),
        ("gemini", "models"),
    ] {
        let run = pointed_at(&root, style, "").colony(&["models", style]);
        assert_eq!(run.code, 1, "{style}: {}", run.stderr);
        assert!(
            run.stderr.contains(&format!(
                "model list: the answer has no \"{list}\" list of models (is the base URL the \
                 provider's?): {{\"foo\": 1}}"
            )),
            "{style}: {}",
            run.stderr
        );
    }
    let (root, _) = recording(r#"{"data": []}"#);
    let run = pointed_at(&root, "openai", "")
        .colony(&["models", "openai"])
        .ok();
    assert_eq!(run.stdout, "");
    assert!(
        run.stderr.contains("the provider lists no models"),
        "{}",
        run.stderr
    );
}
