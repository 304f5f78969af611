//! `tools/call` latency over loopback Streamable HTTP against the official Python SDK's server
//! (tests/support/mcp/server.py, its `echo` tool): p50 and p99 of colony's client, side by side
//! with the Python SDK's own client making the same calls on the same server, and their ratio.
//! Both sides call one after another on one session, after the same warm-up.
//!
//! Run: `cargo bench --bench mcp_call` (installs the Python SDK into the target dir on first run).

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use colony::mcp::{Connection, ServerSpec, Transport};
use serde_json::json;
use support::mcp;

const CALLS: usize = 2000;
const WARMUP: usize = 200;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn summary(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (percentile(&ms, 0.50), percentile(&ms, 0.99))
}

fn main() {
    let server = mcp::python_http(mcp::free_port(), &[]);
    let url = server.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let colony_ms: Vec<f64> = rt.block_on(async {
        let spec = ServerSpec {
            name: "bench".into(),
            transport: Transport::Http {
                url: url.clone(),
                headers: Default::default(),
            },
            roots: Vec::new(),
            elicit: None,
            auth: None,
            resources: false,
            sampling: None,
        };
        let conn = Connection::open(spec).await.expect("connect");
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
            assert!(!out.is_error);
        }
        conn.close().await;
        times
    });
    let out = Command::new(mcp::python())
        .arg(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/support/mcp/bench_client.py"),
        )
        .arg(&url)
        .arg(CALLS.to_string())
        .arg(WARMUP.to_string())
        .output()
        .expect("run the Python client");
    assert!(
        out.status.success(),
        "the Python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let python_ms: Vec<f64> =
        serde_json::from_slice(&out.stdout).expect("the Python client's latencies");
    let (c50, c99) = summary(colony_ms);
    let (p50, p99) = summary(python_ms);
    println!(
        "tools/call over loopback Streamable HTTP, Python SDK server, {CALLS} calls after {WARMUP} warm-up, one session"
    );
    println!("{:<22}{:>10}{:>10}", "client", "p50 ms", "p99 ms");
    println!("{:<22}{c50:>10.3}{c99:>10.3}", "colony (rmcp)");
    println!("{:<22}{p50:>10.3}{p99:>10.3}", "Python SDK client");
    println!(
        "{:<22}{:>10.2}{:>10.2}",
        "ratio colony/python",
        c50 / p50,
        c99 / p99
    );
}
