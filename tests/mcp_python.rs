//! The MCP client against the official Python SDK's server (tests/support/mcp/server.py), over
//! stdio and Streamable HTTP on 127.0.0.1: the handshake, listing (paged), structured and
//! `isError` results, roots, a deadline that cancels the call on the server, a session expired by
//! a server restart, a child that dies, and servers that cannot be reached.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use colony::mcp::{Connection, McpError, ServerSpec, Transport};
use serde_json::json;
use support::mcp;

fn stdio(env: &[(&str, &str)], roots: &[&str]) -> ServerSpec {
    ServerSpec {
        name: "py".into(),
        transport: Transport::Stdio {
            command: mcp::python().display().to_string(),
            args: vec![mcp::server_script().display().to_string(), "stdio".into()],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: None,
        },
        roots: roots.iter().map(|r| r.to_string()).collect(),
        elicit: None,
        auth: None,
        resources: false,
        sampling: None,
    }
}

fn http(url: &str) -> ServerSpec {
    ServerSpec {
        name: "py".into(),
        transport: Transport::Http {
            url: url.into(),
            headers: BTreeMap::from([("Authorization".into(), "Bearer t0ken".into())]),
        },
        roots: Vec::new(),
        elicit: None,
        auth: None,
        resources: false,
        sampling: None,
    }
}

const LONG: Duration = Duration::from_secs(60);

/// The handshake, the list, a structured result, an `isError` result and roots, on one server.
async fn the_basics(conn: &Connection, roots: &str) {
    assert_eq!(conn.version().await.as_deref(), Some("2025-11-25"));
    let tools = conn.list_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    for want in ["echo", "add", "fail", "sleep", "roots", "die", "meet"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let add = tools.iter().find(|t| t.name == "add").unwrap();
    assert_eq!(add.input_schema["properties"]["a"]["type"], "number");

    let out = conn
        .call("add", json!({"a": 2, "b": 3.5}), LONG)
        .await
        .unwrap();
    assert_eq!(out.structured, Some(json!({"sum": 5.5})));
    assert_eq!(out.text, r#"{"sum":5.5}"#);
    assert!(!out.is_error);

    let out = conn
        .call("fail", json!({"message": "it broke"}), LONG)
        .await
        .unwrap();
    assert!(out.is_error, "{out:?}");
    assert!(out.text.contains("it broke"), "{}", out.text);

    let out = conn.call("roots", json!({}), LONG).await.unwrap();
    assert!(out.text.contains(roots), "{}", out.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn stdio_handshake_list_call_error_and_roots() {
    let conn = Connection::open(stdio(&[], &["file:///tmp/project"]))
        .await
        .unwrap();
    the_basics(&conn, "file:///tmp/project").await;
    conn.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_handshake_list_call_error_and_roots() {
    let server = mcp::python_http(mcp::free_port(), &[]);
    let conn = Connection::open(http(&server.url())).await.unwrap();
    the_basics(&conn, "none").await;
    conn.close().await;
}

/// Waits up to 20 s for `path` to hold `text` (the server writes it after our cancel lands).
fn wait_for(path: &PathBuf, text: &str) -> String {
    let start = Instant::now();
    loop {
        let got = std::fs::read_to_string(path).unwrap_or_default();
        if got.contains(text) || start.elapsed() > Duration::from_secs(20) {
            return got;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn deadline_cancels(conn: &Connection, log: &PathBuf) {
    let e = conn
        .call("sleep", json!({"seconds": 60}), Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(matches!(e, McpError::Timeout { .. }), "{e}");
    assert_eq!(e.kind(), "timeout");
    assert_eq!(
        wait_for(log, "cancelled"),
        "cancelled\n",
        "the server never saw notifications/cancelled"
    );
    // The session is still good.
    let out = conn
        .call("echo", json!({"text": "after"}), LONG)
        .await
        .unwrap();
    assert!(out.text.contains("after"), "{}", out.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_past_its_deadline_is_cancelled_on_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("cancel.log");
    let log_s = log.display().to_string();
    let conn = Connection::open(stdio(&[("CANCEL_LOG", &log_s)], &[]))
        .await
        .unwrap();
    deadline_cancels(&conn, &log).await;
    conn.close().await;

    let log = dir.path().join("cancel-http.log");
    let log_s = log.display().to_string();
    let server = mcp::python_http(mcp::free_port(), &[("CANCEL_LOG", &log_s)]);
    let conn = Connection::open(http(&server.url())).await.unwrap();
    deadline_cancels(&conn, &log).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_expired_by_a_restart_is_reinitialised() {
    let port = mcp::free_port();
    let mut server = mcp::python_http(port, &[]);
    let conn = Connection::open(http(&server.url())).await.unwrap();
    let out = conn
        .call("echo", json!({"text": "one"}), LONG)
        .await
        .unwrap();
    assert!(out.text.contains("one"));
    server.kill();
    let _again = mcp::python_http(port, &[]);
    // The new server does not know our session: it answers 404 and we initialise again.
    let out = conn
        .call("echo", json!({"text": "two"}), LONG)
        .await
        .unwrap();
    assert!(out.text.contains("two"), "{}", out.text);
    assert_eq!(conn.list_tools().await.unwrap().len(), 7);
}

#[tokio::test(flavor = "multi_thread")]
async fn paging_follows_next_cursor() {
    let env = [("FILLER_TOOLS", "120"), ("PAGE_SIZE", "7")];
    let conn = Connection::open(stdio(&env, &[])).await.unwrap();
    let tools = conn.list_tools().await.unwrap();
    assert_eq!(tools.len(), 127, "7 tools and 120 fillers, 7 a page");
    assert!(tools.iter().any(|t| t.name == "filler_119"));
    conn.close().await;

    // More pages than the cap: the first 50 pages are kept.
    let env = [("FILLER_TOOLS", "200"), ("PAGE_SIZE", "2")];
    let conn = Connection::open(stdio(&env, &[])).await.unwrap();
    assert_eq!(conn.list_tools().await.unwrap().len(), 100);
    conn.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_that_dies_is_reported_and_restarted_on_next_use() {
    let conn = Connection::open(stdio(&[], &[])).await.unwrap();
    let e = conn.call("die", json!({}), LONG).await.unwrap_err();
    assert_eq!(e.kind(), "closed", "{e}");
    let out = conn
        .call("echo", json!({"text": "back"}), LONG)
        .await
        .unwrap();
    assert!(out.text.contains("back"), "{}", out.text);
    conn.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn servers_that_cannot_be_reached_fail_with_connect_errors() {
    let port = mcp::free_port();
    let e = Connection::open(http(&format!("http://127.0.0.1:{port}/mcp")))
        .await
        .err()
        .unwrap();
    assert_eq!(e.kind(), "connect_error", "{e}");
    let spec = ServerSpec {
        name: "gone".into(),
        transport: Transport::Stdio {
            command: "sh".into(),
            args: vec!["-c".into(), "exit 1".into()],
            env: BTreeMap::new(),
            cwd: None,
        },
        roots: Vec::new(),
        elicit: None,
        auth: None,
        resources: false,
        sampling: None,
    };
    let e = Connection::open(spec).await.err().unwrap();
    assert_eq!(e.kind(), "connect_error", "{e}");
    assert!(e.to_string().starts_with("gone: "), "{e}");
    let spec = ServerSpec {
        name: "missing".into(),
        transport: Transport::Stdio {
            command: "/nonexistent/colony-mcp".into(),
            args: vec![],
            env: BTreeMap::new(),
            cwd: None,
        },
        roots: Vec::new(),
        elicit: None,
        auth: None,
        resources: false,
        sampling: None,
    };
    let e = Connection::open(spec).await.err().unwrap();
    assert!(e.to_string().contains("cannot start"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn close_waits_for_answers_in_flight_before_closing_stdin() {
    // The Python SDK's server drops requests still running when its stdin closes: a close that
    // did not wait would fail this call.
    let conn = std::sync::Arc::new(Connection::open(stdio(&[], &[])).await.unwrap());
    let calling = {
        let conn = conn.clone();
        tokio::spawn(async move { conn.call("sleep", json!({"seconds": 1}), LONG).await })
    };
    // Wait until the call is in flight: close must then wait for its answer.
    while conn.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    conn.close().await;
    let out = calling.await.unwrap().unwrap();
    assert!(out.text.contains("slept"), "{}", out.text);
    // A closed connection refuses calls instead of starting the server again.
    let again = conn.call("echo", json!({"text": "x"}), LONG).await;
    assert!(
        again
            .as_ref()
            .is_err_and(|e| e.to_string().contains("closed")),
        "{again:?}"
    );
}

fn raw(version: &str) -> ServerSpec {
    ServerSpec {
        name: "raw".into(),
        transport: Transport::Stdio {
            command: "python3".into(),
            args: vec![
                mcp::server_script()
                    .with_file_name("raw_server.py")
                    .display()
                    .to_string(),
            ],
            env: BTreeMap::from([("ANSWER_VERSION".into(), version.into())]),
            cwd: None,
        },
        roots: vec!["file:///srv/here".into()],
        elicit: None,
        auth: None,
        resources: false,
        sampling: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_wire_with_a_hand_written_server() {
    // Notifications and stray progress before the initialize result do not break the handshake;
    // an older revision the server answers is spoken.
    let conn = Connection::open(raw("2025-03-26")).await.unwrap();
    assert_eq!(conn.version().await.as_deref(), Some("2025-03-26"));
    let tools = conn.list_tools().await.unwrap();
    assert_eq!(tools[0].name, "received");
    let out = conn.call("received", json!({}), LONG).await.unwrap();
    let sent: Vec<serde_json::Value> = serde_json::from_str(&out.text).unwrap();
    assert_eq!(sent[0]["method"], "initialize");
    assert_eq!(
        sent[0]["params"]["protocolVersion"], "2025-11-25",
        "we ask for the newest"
    );
    assert_eq!(sent[1]["method"], "notifications/initialized");
    let answer = |id: serde_json::Value| {
        sent.iter()
            .find(|m| m["id"] == id && m.get("method").is_none())
            .unwrap_or_else(|| panic!("no answer to {id} in {sent:?}"))
            .clone()
    };
    assert_eq!(
        answer(json!(0))["result"],
        json!({"roots": [{"uri": "file:///srv/here"}]})
    );
    assert_eq!(answer(json!("server-ping"))["result"], json!({}));
    conn.close().await;

    // A server that gives the same next cursor again is asked for it once, not fifty times.
    let mut looping = raw("2025-03-26");
    if let Transport::Stdio { env, .. } = &mut looping.transport {
        env.insert("CURSOR_AGAIN".into(), "1".into());
    }
    let conn = Connection::open(looping).await.unwrap();
    let tools = conn.list_tools().await.unwrap();
    assert_eq!(tools.len(), 2, "the first page and the page 'again'");
    assert_eq!(conn.list_resources().await.unwrap().len(), 2);
    let out = conn.call("received", json!({}), LONG).await.unwrap();
    let sent: Vec<serde_json::Value> = serde_json::from_str(&out.text).unwrap();
    let asked = |method: &str| sent.iter().filter(|m| m["method"] == method).count();
    assert_eq!(asked("tools/list"), 2);
    assert_eq!(asked("resources/list"), 2);
    conn.close().await;

    // A revision we do not speak is refused.
    let e = Connection::open(raw("2024-11-05")).await.err().unwrap();
    assert_eq!(e.kind(), "unsupported_version", "{e}");
    assert!(e.to_string().contains("2024-11-05"), "{e}");
}
