//! colony as an MCP server: `tools/call` latency over loopback Streamable HTTP against `/mcp` on
//! `colony serve` (a Lua `echo` tool marked exportable), next to the same call against the
//! official Python SDK's server (tests/support/mcp/server.py, its `echo` tool), from one client
//! (colony's own, one call after another on one session, after the same warm-up): p50, p99 and
//! the ratio. Then calls per second against colony's server with 50 sessions at once.
//!
//! Run: `cargo bench --bench mcp_server` (installs the Python SDK into the target dir on first run).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use colony::mcp::{Connection, ServerSpec, Transport};
use serde_json::json;
use support::mcp;
use support::script::Sandbox;
use support::serve::Served;

const CALLS: usize = 2000;
const WARMUP: usize = 200;
const SESSIONS: usize = 50;
const CALLS_PER_SESSION: usize = 100;

const PROGRAM: &str = r#"
ai.tool{ name = "echo", description = "Echo the text back", exportable = true,
  parameters = { text = "string" }, handler = function(args) return args.text end }
"#;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn summary(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (percentile(&ms, 0.50), percentile(&ms, 0.99))
}

fn spec(url: &str) -> ServerSpec {
    ServerSpec {
        name: "bench".into(),
        transport: Transport::Http {
            url: url.into(),
            headers: Default::default(),
        },
        roots: Vec::new(),
        elicit: None,
        auth: None,
        resources: false,
        sampling: None,
    }
}

async fn latencies(url: &str) -> Vec<f64> {
    let conn = Connection::open(spec(url)).await.expect("connect");
    let deadline = Duration::from_secs(30);
    for _ in 0..WARMUP {
        conn.call("echo", json!({"text": "warm"}), deadline)
            .await
            .expect("call");
    }
    let mut times = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let start = Instant::now();
        let out = conn
            .call("echo", json!({"text": format!("call {i}")}), deadline)
            .await
            .expect("call");
        times.push(start.elapsed().as_secs_f64() * 1000.0);
        assert!(!out.is_error, "{out:?}");
    }
    conn.close().await;
    times
}

fn main() {
    let sb = Sandbox::new();
    let file = sb.write("echo.lua", PROGRAM).display().to_string();
    let served = Served::start(&sb, &[&file]);
    let colony_url = format!("{}/mcp", served.url);
    let python = mcp::python_http(mcp::free_port(), &[]);
    let python_url = python.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (colony_ms, python_ms) =
        rt.block_on(async { (latencies(&colony_url).await, latencies(&python_url).await) });
    let (c50, c99) = summary(colony_ms);
    let (p50, p99) = summary(python_ms);
    println!(
        "mcp_server: tools/call over loopback HTTP, {CALLS} calls after {WARMUP} warm-up, one client (colony's)"
    );
    println!("  colony serve /mcp (Lua echo):  p50 {c50:.3} ms  p99 {c99:.3} ms");
    println!("  Python SDK server (echo):      p50 {p50:.3} ms  p99 {p99:.3} ms");
    println!(
        "  ratio (python / colony):       p50 {:.2}x  p99 {:.2}x",
        p50 / c50,
        p99 / c99
    );

    let started = Instant::now();
    let done: usize = rt.block_on(async {
        let tasks = (0..SESSIONS).map(|s| {
            let url = colony_url.clone();
            tokio::spawn(async move {
                let conn = Connection::open(spec(&url)).await.expect("connect");
                for i in 0..CALLS_PER_SESSION {
                    let out = conn
                        .call(
                            "echo",
                            json!({"text": format!("{s}/{i}")}),
                            Duration::from_secs(60),
                        )
                        .await
                        .expect("call");
                    assert!(!out.is_error);
                }
                conn.close().await;
                CALLS_PER_SESSION
            })
        });
        futures::future::join_all(tasks)
            .await
            .into_iter()
            .map(|r| r.expect("a session"))
            .sum()
    });
    let secs = started.elapsed().as_secs_f64();
    println!(
        "  {SESSIONS} sessions at once against colony: {done} calls in {secs:.2} s = {:.0} calls/s",
        done as f64 / secs
    );
    drop(served);
}
