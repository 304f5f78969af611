//! `@modelcontextprotocol/server-everything` (npm) over stdio and Streamable HTTP: every tool it
//! lists to a client declaring the same capabilities is listed by ours (it sends
//! `notifications/tools/list_changed` before its initialize result, which must not break the
//! handshake), and its echo and get-sum tools are called through a turn against the fake provider.

mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::mcp;
use support::model_calls;

/// The tool names the server lists to a bare client speaking raw JSON lines (roots declared, as
/// ours does), independent of the client under test.
fn listed_raw() -> BTreeSet<String> {
    let mut child = Command::new("node")
        .arg(mcp::everything())
        .arg("stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start server-everything");
    let mut stdin = child.stdin.take().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let send = |stdin: &mut std::process::ChildStdin, v: Value| {
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    };
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {"roots": {}},
            "clientInfo": {"name": "raw", "version": "0"}}}),
    );
    let mut names = BTreeSet::new();
    for line in out.lines() {
        let msg: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if msg["id"] == 1 {
            send(
                &mut stdin,
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            );
            send(
                &mut stdin,
                json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
            );
        } else if msg["id"] == 2 {
            for t in msg["result"]["tools"].as_array().unwrap() {
                names.insert(t["name"].as_str().unwrap().to_string());
            }
            break;
        } else if msg["method"] == "roots/list" {
            send(
                &mut stdin,
                json!({"jsonrpc": "2.0", "id": msg["id"], "result": {"roots": []}}),
            );
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    names
}

fn through_a_turn(server: &str) {
    let raw = listed_raw();
    assert!(raw.contains("echo") && raw.contains("get-sum"), "{raw:?}");
    let fake = FakeProvider::start();
    fake.push(Reply::tool_calls(vec![
        ("c1", "everything__echo", json!({"message": "hello there"})),
        ("c2", "everything__get-sum", json!({"a": 19, "b": 23})),
    ]));
    fake.push(Reply::text("Echoed and summed."));
    let sb = support::styled(&fake, "openai");
    sb.write("config.toml", "[use.general]\nprovider = \"openai\"\n");
    let script = format!(
        r#"local r = ai.take_turn{{ prompt = "go", mcp = {{ {server} }} }}
           print("reply", r.reply)
           print("server", r.servers[1].phase, r.servers[1].version, r.servers[1].error and r.servers[1].error.message or "-")
           for _, t in ipairs(r.servers[1].tools) do print("tool", t) end
           for _, e in ipairs(r.tool_events) do print("event", e.name, e.kind, e.outcome) end"#
    );
    let run = sb.lua(&script, &[]).ok();
    let lines = run.lines();
    assert_eq!(lines[0], "reply\tEchoed and summed.", "{}", run.stdout);
    assert_eq!(lines[1], "server\tready\t2025-11-25\t-");
    let ours: BTreeSet<String> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("tool\teverything__"))
        .map(String::from)
        .collect();
    assert_eq!(ours, raw, "every tool the server lists is offered");
    let events: Vec<&&str> = lines.iter().filter(|l| l.starts_with("event\t")).collect();
    assert_eq!(*events[0], "event\teverything__echo\tok\tEcho: hello there");
    assert!(
        events[1].starts_with("event\teverything__get-sum\tok\t"),
        "{}",
        events[1]
    );
    assert!(events[1].contains("42"), "{}", events[1]);
    let offered = model_calls(&fake)[0]["tools"].as_array().unwrap().len();
    assert_eq!(offered, raw.len());
}

#[test]
fn over_stdio() {
    let server = format!(
        r#"{{ name = "everything", command = "node", args = {{ "{}", "stdio" }} }}"#,
        mcp::everything().display()
    );
    through_a_turn(&server);
}

#[test]
fn over_streamable_http() {
    let http = mcp::everything_http(mcp::free_port());
    let server = format!(r#"{{ name = "everything", url = "{}" }}"#, http.url());
    through_a_turn(&server);
}

#[test]
fn a_typescript_server_restarted_answers_400_and_is_reinitialised() {
    let port = mcp::free_port();
    let mut first = mcp::everything_http(port);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let spec = colony::mcp::ServerSpec {
            name: "everything".into(),
            transport: colony::mcp::Transport::Http {
                url: first.url(),
                headers: Default::default(),
            },
            roots: Vec::new(),
            elicit: None,
            auth: None,
            resources: false,
            sampling: None,
        };
        let conn = colony::mcp::Connection::open(spec).await.unwrap();
        let long = std::time::Duration::from_secs(60);
        let out = conn
            .call("echo", json!({"message": "one"}), long)
            .await
            .unwrap();
        assert_eq!(out.text, "Echo: one");
        first.kill();
        let _second = mcp::everything_http(port);
        let out = conn
            .call("echo", json!({"message": "two"}), long)
            .await
            .unwrap();
        assert_eq!(out.text, "Echo: two");
    });
}

/// Its image tool's picture reaches the model as an image, in the provider's own form: inside
/// the Anthropic tool_result, not as JSON text.
#[test]
fn an_image_a_tool_returns_is_attached_to_its_result() {
    let raw = listed_raw();
    assert!(raw.contains("get-tiny-image"), "{raw:?}");
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call(
        "c1",
        "everything__get-tiny-image",
        json!({}),
    ));
    fake.push(Reply::text("A tiny image."));
    let sb = support::styled(&fake, "anthropic");
    sb.write(
        "config.toml",
        "[use.general]\nprovider = \"anthropic\"\nmodel = \"m\"\n",
    );
    let script = format!(
        r#"local r = ai.take_turn{{ prompt = "show me", mcp = {{ {{ name = "everything", command = "node", args = {{ "{}", "stdio" }} }} }} }}
           print(r.reply, r.tool_events[1].kind)
           local result = r.messages[3]
           print(result.files[1].kind, result.files[1].content_type)"#,
        mcp::everything().display()
    );
    let run = sb.lua(&script, &[]).ok();
    assert_eq!(
        run.lines(),
        ["A tiny image.\tok", "image\timage/png"],
        "{}",
        run.stderr
    );
    let calls = model_calls(&fake);
    let result = &calls[1]["messages"][2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    let blocks = result["content"].as_array().expect("text and the image");
    let image = blocks
        .iter()
        .find(|b| b["type"] == "image")
        .expect("an image block");
    assert_eq!(image["source"]["type"], "base64");
    assert_eq!(image["source"]["media_type"], "image/png");
    assert!(
        !calls[1].to_string().contains("\"mimeType\""),
        "not as JSON text"
    );
}
