//! A hostile provider, through the binary: a server on loopback that answers every model call
//! with invalid UTF-8, JSON nested 100,000 deep, a stream that never ends, or an SSE line that
//! never ends. Each must end the call with a typed error (`ai.ask` answers `nil, err`), within
//! the call's timeout and the response limit, never a hang or a crash. The run carries
//! `--max-time` only as a guard against hanging: the tests assert it did not fire.
//!
//! The planted key: a key `sk-PLANTED-...` in the environment and the config, and a token in an
//! MCP server's headers, never appear in what colony writes (trace-level logs, the cassette it
//! records, the store, the audit, error messages, stdout), nor in what `colony serve` answers
//! (the API, the event stream, the metrics, the dashboard, MCP over HTTP).

mod support;

use support::fake::{FakeProvider, Reply};
use support::hostile::{self, Hostility};
use support::script::Sandbox;
use support::serve::Served;

/// Longer than any of these runs needs; a run still going then is a hang.
const GUARD: &str = "90";

/// `ai.ask` streamed and not, against `how`; each answer's error kind and message, one line each.
fn ask_hostile(how: Hostility) -> Vec<String> {
    let url = hostile::provider(how);
    let sb = Sandbox::new()
        .env("OPENAI_API_KEY", "test-key-hostile-0123456789")
        .env("OPENAI_BASE_URL", &url);
    sb.write(
        "config.toml",
        "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\ntimeout = 5\nmax_response_bytes = 4000000\n",
    );
    let run = sb.lua(
        r#"
for _, stream in ipairs{ false, true } do
  local opts = { provider = "openai" }
  if stream then opts.stream = function() end end
  local reply, err = ai.ask("hi", opts)
  print(("%s reply=%s kind=%s: %s"):format(stream and "streamed" or "whole", tostring(reply),
    err and err.kind or "-", err and tostring(err.message or err):sub(1, 160) or "-"))
end
"#,
        &["--max-time", GUARD],
    );
    assert_eq!(
        run.code, 0,
        "{how:?}: stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    run.lines().iter().map(|l| l.to_string()).collect()
}

#[track_caller]
fn assert_typed(lines: &[String], kinds: &[&str]) {
    assert_eq!(lines.len(), 2, "{lines:?}");
    for line in lines {
        assert!(line.contains(" reply=nil "), "{line}");
        assert!(
            kinds.iter().any(|k| line.contains(&format!(" kind={k}: "))),
            "expected one of {kinds:?}: {line}"
        );
    }
}

#[test]
fn invalid_utf8_from_the_provider_is_a_typed_error() {
    let lines = ask_hostile(Hostility::InvalidUtf8);
    assert_typed(&lines, &["parse_error"]);
}

#[test]
fn json_nested_100000_deep_is_a_typed_error() {
    let lines = ask_hostile(Hostility::Deep);
    assert_typed(&lines, &["parse_error"]);
}

#[test]
fn a_stream_that_never_ends_is_cut_at_the_limit_or_the_timeout() {
    let lines = ask_hostile(Hostility::EndlessStream);
    // Past max_response_bytes: a config_error (trying again would read as much again).
    assert_typed(&lines, &["config_error", "timeout"]);
}

#[test]
fn an_sse_line_that_never_ends_is_cut_at_the_limit_or_the_timeout() {
    let lines = ask_hostile(Hostility::EndlessLine);
    assert_typed(&lines, &["config_error", "timeout", "parse_error"]);
}

/// The planted key and token.
const PLANTED: &str = "sk-PLANTED-4f1c9e2a7b3d8e6f";
const PLANTED_CONFIG: &str = "sk-PLANTED-config-9a8b7c6d5e";
const PLANTED_HEADER: &str = "sk-PLANTED-header-1029384756";

/// Every file in the sandbox but the config the user wrote (the cassette, the state directory's
/// store and journal, the tool cache), with its bytes.
fn files_written(sb: &Sandbox) -> Vec<(String, Vec<u8>)> {
    let mut written = Vec::new();
    let mut stack = vec![sb.path("")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n != "config.toml") {
                written.push((path.display().to_string(), std::fs::read(&path).unwrap()));
            }
        }
    }
    written
}

/// No planted key (nor the word PLANTED) in any of `written`.
#[track_caller]
fn assert_no_planted_key(written: &[(String, Vec<u8>)]) {
    for (name, bytes) in written {
        for secret in [PLANTED, PLANTED_CONFIG, PLANTED_HEADER, "PLANTED"] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{secret} appears in {name}:\n{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}

#[test]
fn a_planted_key_never_appears_in_what_colony_writes() {
    let fake = FakeProvider::start();
    // A tool call that fails, naming nothing secret; then a reply; then an error answer that
    // echoes what a careless server might (the request's key).
    fake.push(Reply::tool_call(
        "c1",
        "lookup",
        serde_json::json!({ "q": "x" }),
    ));
    fake.push(Reply::text("done"));
    fake.set_default(Reply::status(401));
    let sb = Sandbox::new()
        .env("OPENAI_API_KEY", PLANTED)
        .env("OPENAI_BASE_URL", &fake.base_url("openai"))
        .env("RUST_LOG", "trace");
    sb.write(
        "config.toml",
        &format!(
            "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\n\n\
             [use.code]\nprovider = \"openai\"\nkey = \"{PLANTED_CONFIG}\"\n\n\
             [mcp.docs]\nurl = \"http://127.0.0.1:9/mcp\"\nheaders = {{ Authorization = \"Bearer {PLANTED_HEADER}\" }}\n"
        ),
    );
    let state = sb.path("state-dir").display().to_string();
    let cassette = sb.path("recorded.jsonl").display().to_string();
    let run = sb.lua(
        r#"
local lookup = ai.tool{ name = "lookup", parameters = { q = "string" },
  handler = function(args) error("lookup failed for " .. args.q .. " with " .. tostring(os.getenv("OPENAI_API_KEY"))) end }
local r = ai.take_turn{ prompt = "find x", tools = { lookup } }
print("reply", r.reply)
store.set("seen", { key_env = "OPENAI_API_KEY" })
local reply, err = ai.ask("again")
print("refused", err and err.kind, err and tostring(err.message))
local reply2, err2 = ai.ask("code", { use = "code" })
print("code", err2 and err2.kind, err2 and tostring(err2.message))
local ok, e = pcall(mcp.connect, "docs")
print("mcp", ok, tostring(e))
"#,
        &["--state", &state, "--record", &cassette, "--max-time", GUARD],
    );
    assert_ne!(run.code, 124, "the guard fired:\n{}", run.stderr);
    assert!(
        run.stdout.contains("reply\tdone"),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    // The key did reach the provider (the test would prove nothing otherwise).
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.header("authorization") == Some(&format!("Bearer {PLANTED}"))),
        "the fake never saw the planted key"
    );
    let script = sb.path("script.lua").display().to_string();
    let audit = sb.colony(&["audit", "--state", &state, &script]);
    let conversations = sb.colony(&[
        "conversations",
        "--state",
        &state,
        &script,
        "export",
        "script",
    ]);
    let usage = sb.colony(&["usage", "--state", &state, &script]);
    // The tool cache, with the server whose headers hold a key (it is dead: the refresh says so).
    let refresh = sb.colony(&["tools", "refresh"]);
    assert!(
        refresh.stdout.contains("docs") || refresh.stderr.contains("docs"),
        "{}{}",
        refresh.stdout,
        refresh.stderr
    );
    let mut written: Vec<(String, Vec<u8>)> = vec![
        (
            "colony tools refresh".into(),
            [refresh.stdout.as_bytes(), refresh.stderr.as_bytes()].concat(),
        ),
        ("stdout".into(), run.stdout.clone().into_bytes()),
        (
            "stderr (trace logs, error messages)".into(),
            run.stderr.clone().into_bytes(),
        ),
        ("colony audit".into(), audit.stdout.into_bytes()),
        (
            "colony conversations".into(),
            conversations.stdout.into_bytes(),
        ),
        ("colony usage".into(), usage.stdout.into_bytes()),
    ];
    // Every file colony wrote: the cassette, the state directory (the store's database and its
    // journal), anything else in the sandbox but the config the user wrote.
    written.extend(files_written(&sb));
    assert!(
        written
            .iter()
            .any(|(name, _)| name.ends_with("recorded.jsonl")),
        "no cassette was written"
    );
    assert!(
        run.stderr.contains("TRACE") || run.stderr.contains("trace"),
        "no trace-level log:\n{}",
        run.stderr
    );
    assert_no_planted_key(&written);
}

/// One JSON-RPC message POSTed to `/mcp`: the answer's session id and text (JSON or SSE).
fn mcp_post(
    served: &Served,
    session: Option<&str>,
    message: serde_json::Value,
) -> (Option<String>, String) {
    let mut r = served
        .client()
        .post(format!("{}/mcp", served.url))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&message);
    if let Some(s) = session {
        r = r.header("mcp-session-id", s);
    }
    let answer = served.send(r);
    let session = answer
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (session, answer.text)
}

#[test]
fn a_planted_key_never_appears_in_what_colony_serve_answers() {
    let fake = FakeProvider::start();
    // The first mail: a tool call whose handler fails quoting the key, then a reply. The second
    // mail: a 401 whose body echoes the key in full, as a careless server might.
    fake.push(Reply::tool_call(
        "c1",
        "lookup",
        serde_json::json!({ "q": "x" }),
    ));
    fake.push(Reply::text("done"));
    fake.set_default(Reply::status(401).body(format!(
        r#"{{"error":{{"message":"Incorrect API key provided: {PLANTED}","type":"invalid_request_error","code":"invalid_api_key"}}}}"#
    )));
    let sb = Sandbox::new()
        .env("OPENAI_API_KEY", PLANTED)
        .env("RUST_LOG", "trace");
    sb.write(
        "config.toml",
        &format!(
            "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"{}\"\n\n\
             [use.code]\nprovider = \"openai\"\nkey = \"{PLANTED_CONFIG}\"\n\n\
             [mcp.docs]\nurl = \"http://127.0.0.1:9/mcp\"\nheaders = {{ Authorization = \"Bearer {PLANTED_HEADER}\" }}\n",
            fake.base_url("openai")
        ),
    );
    let program = sb.write(
        "leaky.lua",
        r#"
local lookup = ai.tool{ name = "lookup", description = "Looks a thing up", exportable = true,
  parameters = { q = "string" },
  handler = function(args) error("lookup failed for " .. args.q .. " with " .. tostring(os.getenv("OPENAI_API_KEY"))) end }
ai.spawn{ name = "desk", system = "You look things up.", tools = { lookup },
  persist_conversation = true, deliver_to = "host" }
ai.watch{}
"#,
    );
    let program = program.display().to_string();
    let mut served = Served::start(&sb, &["--allow-env", &program]);
    let events = served.events(None);
    let ready = || served.get("/api/programs/leaky/residents/desk").status == 200;
    support::serve::eventually("the desk never came up", ready);
    assert_eq!(
        served
            .mail(
                "leaky",
                serde_json::json!({ "to": "desk", "content": "find x" })
            )
            .status,
        202
    );
    let (delivery, mut seen) = events.until("the desk's reply", |e| e.kind == "delivery");
    assert_eq!(delivery.data["text"], "done", "{delivery:?}");
    assert_eq!(
        served
            .mail(
                "leaky",
                serde_json::json!({ "to": "desk", "content": "again" })
            )
            .status,
        202
    );
    let (blocked, passed) = events.until("the desk blocked", |e| e.kind == "blocked");
    // The echoing answer reached what is shown (so the key would have, but for redaction).
    assert!(
        blocked
            .data
            .to_string()
            .contains("Incorrect API key provided"),
        "{blocked:?}"
    );
    seen.push(delivery);
    seen.extend(passed);
    seen.push(blocked);
    // The key did reach the provider, and the handler did quote it (the test would prove
    // nothing otherwise).
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.header("authorization") == Some(&format!("Bearer {PLANTED}"))),
        "the fake never saw the planted key"
    );
    // The exported tool over MCP, failing the same way.
    let init = serde_json::json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
    let (session, init_text) = mcp_post(&served, None, init);
    let session = session.unwrap_or_else(|| panic!("no MCP session: {init_text}"));
    mcp_post(
        &served,
        Some(&session),
        serde_json::json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    );
    let (_, call_text) = mcp_post(
        &served,
        Some(&session),
        serde_json::json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"lookup","arguments":{"q":"y"}}}),
    );
    assert!(
        call_text.contains("lookup failed for y with"),
        "{call_text}"
    );

    let mut written: Vec<(String, Vec<u8>)> = vec![
        ("an MCP tools/call answer".into(), call_text.into_bytes()),
        ("the MCP initialize answer".into(), init_text.into_bytes()),
    ];
    for path in [
        "/",
        "/api/programs",
        "/api/programs/leaky",
        "/api/programs/leaky/residents",
        "/api/programs/leaky/residents/desk",
        "/api/programs/leaky/residents/desk/conversation",
        "/metrics",
    ] {
        let answer = served.get(path);
        assert_eq!(answer.status, 200, "{path}: {}", answer.text);
        written.push((format!("GET {path}"), answer.text.into_bytes()));
    }
    let desk = served.get("/api/programs/leaky/residents/desk").json;
    assert_eq!(desk["state"], "blocked", "{desk}");
    for e in &seen {
        written.push((
            format!("the {} event", e.kind),
            e.data.to_string().into_bytes(),
        ));
    }
    served.signal("TERM");
    assert_eq!(served.wait(), Some(0), "{}", served.stderr());
    written.push(("colony serve's stdout".into(), served.stdout().into_bytes()));
    written.push((
        "colony serve's stderr (trace logs)".into(),
        served.stderr().into_bytes(),
    ));
    assert!(
        served.stderr().contains("TRACE") || served.stderr().contains("trace"),
        "no trace-level log"
    );
    let audit = sb.colony(&["audit", &program]);
    assert_eq!(audit.code, 0, "{}", audit.stderr);
    assert!(audit.stdout.contains("lookup"), "{}", audit.stdout);
    written.push(("colony audit".into(), audit.stdout.into_bytes()));
    // Every file colony wrote: the program's state directory and anything else in the sandbox
    // but the config the user wrote.
    written.extend(files_written(&sb));
    assert_no_planted_key(&written);
}

/// A proxy that compresses what colony did not ask to be compressed (it sends no
/// `Accept-Encoding`): named for what it is, streamed or not, where the bytes were read as a
/// page ("the server answered with a page: ^_M-oM-?...") or as a stream ("bad SSE: UTF8 error").
#[test]
fn an_answer_compressed_unasked_is_named() {
    let fake = FakeProvider::start();
    let gzipped = || {
        Reply::status(200)
            .header("content-encoding", "gzip")
            .body("\u{1f}\u{8b}\u{8}\u{0}not really gzip")
    };
    fake.push(gzipped());
    fake.push(gzipped());
    let sb = support::styled(&fake, "openai");
    let run = sb
        .lua(
            r#"for _, stream in ipairs{ false, true } do
                 local opts = {}
                 if stream then opts.stream = function() end end
                 local reply, err = ai.ask("hi", opts)
                 print(err.kind, err.message)
               end"#,
            &[],
        )
        .ok();
    let lines = run.lines();
    assert_eq!(lines.len(), 2, "{}", run.stdout);
    for line in lines {
        assert!(
            line.starts_with(
                "api_error\tAPI error 200: the server sent its answer compressed \
                 (Content-Encoding: gzip), which colony does not ask for and does not read"
            ),
            "{line}"
        );
    }
}
