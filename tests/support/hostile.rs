//! Hostile servers on loopback, for tests/hostile.rs, tests/hostile_mcp.rs and benches/hostile.rs:
//! a model provider (OpenAI's wire) or an MCP server (Streamable HTTP) whose every answer that
//! matters is invalid UTF-8, JSON nested 100,000 deep, a stream that never ends, or an SSE line
//! that never ends. Plain threads and sockets, so nothing about the answer is tidied up by an
//! HTTP library on the way out.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};

use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hostility {
    InvalidUtf8,
    Deep,
    EndlessStream,
    EndlessLine,
}

impl Hostility {
    pub const ALL: [Hostility; 4] = [
        Hostility::InvalidUtf8,
        Hostility::Deep,
        Hostility::EndlessStream,
        Hostility::EndlessLine,
    ];
}

/// A model provider answering every request as `how`; its base URL (`http://127.0.0.1:P/v1`).
pub fn provider(how: Hostility) -> String {
    listen(move |conn| provider_answer(conn, how), "/v1")
}

/// An MCP server over Streamable HTTP that initialises and lists one tool (`echo`) as a server
/// should, then answers every `tools/call` as `how`; its endpoint (`http://127.0.0.1:P/mcp`).
pub fn mcp_server(how: Hostility) -> String {
    listen(move |conn| mcp_answer(conn, how), "/mcp")
}

fn listen(answer: impl Fn(TcpStream) + Send + Sync + Copy + 'static, path: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let url = format!("http://{}{path}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            std::thread::spawn(move || answer(conn));
        }
    });
    url
}

/// One request: its method line and body (by `Content-Length`); `None` once the peer is gone.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(String, Vec<u8>)> {
    let mut first = String::new();
    if reader.read_line(&mut first).ok()? == 0 {
        return None;
    }
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    Some((first, body))
}

fn provider_answer(mut conn: TcpStream, how: Hostility) {
    let mut reader = BufReader::new(conn.try_clone().expect("a second handle"));
    let Some((_, body)) = read_request(&mut reader) else {
        return;
    };
    let streamed = String::from_utf8_lossy(&body).contains("\"stream\":true");
    let payload = |how| match how {
        Hostility::InvalidUtf8 => {
            let mut p = br#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"bad "#.to_vec();
            p.extend_from_slice(b"\xff\xfe\xc3\x28");
            p.extend_from_slice(br#""},"finish_reason":"stop"}]}"#);
            p
        }
        _ => [&b"{\"choices\":"[..], &b"[".repeat(100_000)].concat(),
    };
    let delta = br#"{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"more "}}]}"#;
    let line_start: &[u8] = if streamed {
        b"data: {\"choices\":\""
    } else {
        b"{\"choices\":\""
    };
    hostile_answer(&mut conn, how, streamed, payload, delta, line_start);
}

/// Writes the answer `how`: `payload` whole (as an SSE event when `streamed`), `event` forever,
/// or `line_start` and then one line forever.
fn hostile_answer(
    conn: &mut TcpStream,
    how: Hostility,
    streamed: bool,
    payload: impl Fn(Hostility) -> Vec<u8>,
    event: &[u8],
    line_start: &[u8],
) {
    let kind = if streamed {
        "text/event-stream"
    } else {
        "application/json"
    };
    let frame = |payload: &[u8]| -> Vec<u8> {
        if streamed {
            [b"data: ", payload, b"\n\n"].concat()
        } else {
            payload.to_vec()
        }
    };
    match how {
        Hostility::InvalidUtf8 | Hostility::Deep => {
            let body = frame(&payload(how));
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body);
        }
        Hostility::EndlessStream => {
            let head =
                format!("HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\nconnection: close\r\n\r\n");
            let _ = conn.write_all(head.as_bytes());
            let chunk = frame(event).repeat(64);
            while conn.write_all(&chunk).is_ok() {}
        }
        Hostility::EndlessLine => {
            let head =
                format!("HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\nconnection: close\r\n\r\n");
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(line_start);
            let chunk = b"a".repeat(16 * 1024);
            while conn.write_all(&chunk).is_ok() {}
        }
    }
}

fn mcp_answer(mut conn: TcpStream, how: Hostility) {
    let mut reader = BufReader::new(conn.try_clone().expect("a second handle"));
    // Keep-alive: a client may send several requests on one connection.
    while let Some((first, body)) = read_request(&mut reader) {
        if !first.starts_with("POST ") {
            // No stream of the server's own (GET) and no session to end (DELETE).
            let _ = conn.write_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n");
            continue;
        }
        let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let id = message["id"].clone();
        let ok = |result: Value| json!({ "jsonrpc": "2.0", "id": id, "result": result });
        let answer = match message["method"].as_str().unwrap_or("") {
            "initialize" => ok(json!({
                "protocolVersion": message["params"]["protocolVersion"].as_str().unwrap_or("2025-06-18"),
                "capabilities": { "tools": {} },
                "serverInfo": { "name": "hostile", "version": "1" },
            })),
            "tools/list" => ok(json!({ "tools": [{
                "name": "echo",
                "description": "Echoes",
                "inputSchema": { "type": "object", "properties": {} },
            }]})),
            "tools/call" => {
                let prefix = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":"#);
                let payload = |how| match how {
                    Hostility::InvalidUtf8 => {
                        let mut p = format!(r#"{prefix}{{"content":[{{"type":"text","text":"bad "#)
                            .into_bytes();
                        p.extend_from_slice(b"\xff\xfe\xc3\x28");
                        p.extend_from_slice(br#""}]}}"#);
                        p
                    }
                    _ => [prefix.as_bytes(), &b"[".repeat(100_000)].concat(),
                };
                let event = br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"more"}}"#;
                let line_start = format!(r#"data: {prefix}{{"content":[{{"type":"text","text":""#);
                // The whole answers as JSON; the endless ones as a stream (an endless JSON body
                // would be the same as the provider's).
                let streamed = matches!(how, Hostility::EndlessStream | Hostility::EndlessLine);
                hostile_answer(
                    &mut conn,
                    how,
                    streamed,
                    payload,
                    event,
                    line_start.as_bytes(),
                );
                return;
            }
            _ if message.get("id").is_none() => {
                let _ = conn.write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n");
                continue;
            }
            _ => {
                json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -32601, "message": "no such method" } })
            }
        };
        let body = answer.to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if conn.write_all(head.as_bytes()).is_err() || conn.write_all(body.as_bytes()).is_err() {
            return;
        }
    }
}
