//! The memory a run takes when a provider (or a URL) answers an endless body: `colony run` on a
//! script that asks a model in every wire style, whole and streamed, and fetches the body with
//! `http.get`, each against a loopback server that never stops sending. Each call ends at its
//! limit (`max_response_bytes`, 64 MiB; `http`'s `max_bytes`, 32 MiB) with a `fetch_error`;
//! the figure is the process's peak RSS (VmHWM), printed, not asserted. Before the limits the
//! same run grew without bound (5 GB within seconds).
//!
//! Run: `cargo bench --bench body_limits` (or `cargo test --bench body_limits` on a debug build).

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::Uri;
use axum::response::Response;

/// Serves an endless 200 body on `127.0.0.1` (SSE comment lines when the request streams).
fn endless_server() -> String {
    let app = Router::new().fallback(|uri: Uri, body: Bytes| async move {
        let sse = String::from_utf8_lossy(&body).contains("\"stream\":true")
            || uri.path().contains("stream");
        let line = if sse {
            ": padding "
        } else {
            "{\"padding\": \""
        };
        let chunk = Bytes::from(format!(
            "{line}{}\n",
            "x".repeat(64 * 1024 - line.len() - 1)
        ));
        let body = Body::from_stream(futures::stream::repeat_with(move || {
            Ok::<_, std::io::Error>(chunk.clone())
        }));
        let mut resp = Response::new(body);
        let ct = if sse {
            "text/event-stream"
        } else {
            "application/json"
        };
        resp.headers_mut()
            .insert("content-type", ct.parse().unwrap());
        resp
    });
    support::serve(app)
}

/// The peak resident set of process `pid`, in kB (Linux's `VmHWM`).
fn peak_rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    let root = endless_server();
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut config = String::new();
    for (use_type, style, version) in [
        ("chat", "anthropic", "v1"),
        ("code", "openai", "v1"),
        ("general", "gemini", "v1beta"),
    ] {
        config.push_str(&format!(
            "[use.{use_type}]\nprovider = \"{style}\"\nmodel = \"m\"\nkey = \"bench-key-0123456789\"\n\
             base_url = \"{root}/{style}/{version}\"\n\n"
        ));
    }
    std::fs::write(dir.path().join("config.toml"), config).expect("config");
    let script = dir.path().join("endless.lua");
    std::fs::write(
        &script,
        format!(
            r#"for _, use in ipairs({{ "chat", "code", "general" }}) do
                 local _, err = ai.ask("hi", {{ use = use }})
                 print(use, "whole", err.kind, err.message)
                 _, err = ai.ask("hi", {{ use = use, stream = function() end }})
                 print(use, "streamed", err.kind, err.message)
               end
               local _, err = http.get("{root}/endless")
               print("http", err.kind, err.message)
               print("done")
               ai.sleep(60000)"#
        ),
    )
    .expect("script");
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_colony"))
        .arg("run")
        .arg(&script)
        .env("COLONY_CONFIG", dir.path().join("config.toml"))
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("colony runs");
    let pid = child.id();
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut calls = 0;
    for line in out.lines() {
        let line = line.expect("a line");
        if line == "done" {
            break;
        }
        println!("  {line}");
        calls += 1;
    }
    let elapsed = started.elapsed();
    let peak = peak_rss_kb(pid);
    let _ = child.kill();
    let _ = child.wait();
    match peak {
        Some(kb) => println!(
            "endless bodies: {calls} calls ended at their limits in {:.1} s; peak RSS {:.1} MiB",
            elapsed.as_secs_f64(),
            kb as f64 / 1024.0
        ),
        None => println!("endless bodies: {calls} calls; peak RSS not available (no /proc)"),
    }
}
