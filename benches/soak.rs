//! The long run: does a program of many residents stay bounded for as long as it runs?
//!
//! `colony run benches/soak.lua` (a child process, the way an operator runs a program) hosts
//! 1,000 residents, each with a `note` tool its model calls in every turn, and one source mailing
//! them round robin. The model is a fake OpenAI-compatible provider on loopback, in this process:
//! every tenth call is answered `529` with `retry-after: 1`; a mail's first request is answered
//! with a call of `note`, the request with its result with a short reply, a compaction request
//! with a summary. It runs once per usage mode:
//!
//! - `realistic`: every answer reports `prompt_tokens` as a quarter of the request's bytes;
//! - `none`: no usage at all, as some servers do when streaming (`fixed` reports
//!   `prompt_tokens = 11` on every answer instead).
//!
//! Every SOAK_SAMPLE_SECS it prints the child's resident set size (`/proc/<pid>/status`), the
//! sockets it holds (its HTTP/1.1 connections to the provider, each with its buffers: one per
//! call in flight, at most `max_concurrent_calls`, plus the few the pool opens while another is
//! being handed back, kept idle for 90 s, at most 100), the mail sent, accepted, served and waiting,
//! the deepest mailbox, outages and recoveries. It fails
//! (exit code 1) when the RSS of any later sample is more than 10 % above the first sample taken
//! after the first minute, or when a mail the program had accepted is not accounted for at the
//! end: served (by colony's count and, separately, by the provider's: the mail in the requests it
//! answered), dropped by the outage bound, or still waiting.
//!
//! Run: `cargo bench --bench soak` (ten minutes per mode). Settings, from the environment:
//! `SOAK_SECS` (600), `SOAK_SAMPLE_SECS` (30), `SOAK_RESIDENTS` (1000), `SOAK_RATE` (mails a
//! second, 100), `SOAK_MODES` (`realistic,none`; also `fixed`), `SOAK_MAX_CALLS` (the use-type's
//! `max_concurrent_calls`; unset, colony's default). Each process runs its modes one after the
//! other; two processes with one mode each run them at once.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// What the provider reports as usage.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Usage {
    Realistic,
    None,
    Fixed,
}

impl Usage {
    fn parse(s: &str) -> Usage {
        match s {
            "realistic" => Usage::Realistic,
            "none" => Usage::None,
            "fixed" => Usage::Fixed,
            other => panic!("SOAK_MODES: unknown usage mode {other:?} (realistic, none, fixed)"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Usage::Realistic => "realistic",
            Usage::None => "none",
            Usage::Fixed => "fixed",
        }
    }
}

/// The fake provider's counters.
struct Provider {
    usage: Usage,
    calls: AtomicU64,
    overloaded: AtomicU64,
    compactions: AtomicU64,
    /// Mail turns in the requests it answered with 200 (the arrivals each request serves).
    served: AtomicU64,
}

const COMPACT_PROMPT: &str = "Summarise this conversation";

async fn chat(State(p): State<Arc<Provider>>, body: Bytes) -> Response {
    let n = p.calls.fetch_add(1, Ordering::Relaxed) + 1;
    if n.is_multiple_of(10) {
        p.overloaded.fetch_add(1, Ordering::Relaxed);
        return (
            StatusCode::from_u16(529).expect("a status"),
            [
                (header::RETRY_AFTER, "1"),
                (header::CONTENT_TYPE, "application/json"),
            ],
            r#"{"error":{"message":"Overloaded","type":"overloaded_error","code":"overloaded"}}"#,
        )
            .into_response();
    }
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let messages = req["messages"].as_array().cloned().unwrap_or_default();
    let content = |m: &Value| m["content"].as_str().unwrap_or("").to_string();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    let compacting = last["role"] == "user" && content(&last).starts_with(COMPACT_PROMPT);
    // The mail this request serves: the mail turns at its end (before a compaction prompt).
    let tail = if compacting {
        &messages[..messages.len() - 1]
    } else {
        &messages[..]
    };
    let mails = tail
        .iter()
        .rev()
        .take_while(|m| m["role"] == "user")
        .filter(|m| content(m).starts_with("[mail from "))
        .count() as u64;
    p.served.fetch_add(mails, Ordering::Relaxed);
    let message = if compacting {
        p.compactions.fetch_add(1, Ordering::Relaxed);
        json!({ "role": "assistant", "content": format!(
            "Summary: the harbour log so far holds {} messages; every mail was noted. {}",
            messages.len(),
            "Ships, cargo and berths were logged as they came. ".repeat(6)
        ) })
    } else if last["role"] == "tool" {
        json!({ "role": "assistant", "content": "Logged. The note is in the harbour log." })
    } else {
        json!({ "role": "assistant", "content": null, "tool_calls": [{
            "id": format!("call_{n}"), "type": "function",
            "function": { "name": "note", "arguments": json!({
                "text": "A ship came in and its cargo was unloaded at the berth. ".repeat(5)
            }).to_string() }
        }] })
    };
    let out_bytes = message.to_string().len() as u64;
    let mut answer = json!({
        "id": format!("chatcmpl-{n}"), "object": "chat.completion", "model": "soak",
        "choices": [{ "index": 0, "message": message,
                      "finish_reason": if message["tool_calls"].is_null() { "stop" } else { "tool_calls" } }],
    });
    match p.usage {
        Usage::Realistic => {
            answer["usage"] = json!({ "prompt_tokens": body.len() as u64 / 4,
                                      "completion_tokens": out_bytes / 4,
                                      "total_tokens": (body.len() as u64 + out_bytes) / 4 })
        }
        Usage::Fixed => {
            answer["usage"] =
                json!({ "prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16 })
        }
        Usage::None => {}
    }
    (
        [(header::CONTENT_TYPE, "application/json")],
        answer.to_string(),
    )
        .into_response()
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

/// The resident set size of process `pid`, in kB.
fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// How many sockets process `pid` holds open (its connections to the provider, mostly): each
/// keeps buffers, so the pool's growth shows in the RSS.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| {
        dir.filter_map(Result::ok)
            .filter(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
            })
            .count()
    })
}

/// `key=value` fields of a line the program printed.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

struct Settings {
    secs: u64,
    sample: u64,
    residents: u64,
    rate: u64,
    max_calls: Option<u64>,
}

/// One run in one usage mode: the failures it found.
fn soak(rt: &tokio::runtime::Runtime, usage: Usage, s: &Settings) -> Vec<String> {
    let provider = Arc::new(Provider {
        usage,
        calls: AtomicU64::new(0),
        overloaded: AtomicU64::new(0),
        compactions: AtomicU64::new(0),
        served: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(provider.clone());
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("a loopback port");
    let addr: SocketAddr = listener.local_addr().expect("its address");
    let server = rt.spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().expect("a temp dir");
    let config = dir.path().join("config.toml");
    let mut use_type = "[use.general]\nprovider = \"openai\"\nmodel = \"soak\"\n".to_string();
    if let Some(n) = s.max_calls {
        use_type.push_str(&format!("max_concurrent_calls = {n}\n"));
    }
    std::fs::write(&config, use_type).expect("the config");
    let program = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/soak.lua");
    let mut child = Command::new(env!("CARGO_BIN_EXE_colony"))
        .args(["run", "--state"])
        .arg(dir.path().join("state"))
        .arg(program)
        .args([
            s.residents.to_string(),
            s.secs.to_string(),
            s.rate.to_string(),
            s.sample.to_string(),
        ])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir.path())
        .env("COLONY_CONFIG", &config)
        .env("XDG_STATE_HOME", dir.path().join("xdg"))
        .env("OPENAI_API_KEY", "soak-key-0123456789")
        .env("OPENAI_BASE_URL", format!("http://{addr}/v1"))
        .stdout(Stdio::piped())
        // One warning per outage: the counts are in the samples.
        .stderr(Stdio::null())
        .spawn()
        .expect("colony run");
    let pid = child.id();
    let started = Instant::now();
    println!(
        "soak [{}]: {} residents, {} s, {} mails/s, a sample every {} s, max_concurrent_calls {} (pid {pid})",
        usage.name(),
        s.residents,
        s.secs,
        s.rate,
        s.sample,
        s.max_calls
            .map_or_else(|| "colony's default".to_string(), |n| n.to_string()),
    );
    let mut failures = Vec::new();
    let mut baseline: Option<(u64, u64)> = None;
    let mut peak_after = 0u64;
    let mut last_final = None;
    let stdout = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("a line from the program");
        let Some(kind) = ["sample", "final"]
            .into_iter()
            .find(|k| line.starts_with(k))
        else {
            println!("  program: {line}");
            continue;
        };
        let rss = rss_kb(pid).unwrap_or(0);
        let t = field(&line, "t");
        println!(
            "  {kind:6} t={t:>5} s  rss={:>7.1} MB  sockets={}  sent={} accepted={} served={} waiting={} \
             max_depth={} dropped={} refused={} outages={} recovered={} conv_avg={}  \
             provider: calls={} 529={} compactions={} served={}",
            rss as f64 / 1024.0,
            sockets(pid),
            field(&line, "sent"),
            field(&line, "accepted"),
            field(&line, "served"),
            field(&line, "waiting"),
            field(&line, "max_depth"),
            field(&line, "dropped"),
            field(&line, "refused"),
            field(&line, "outages"),
            field(&line, "recovered"),
            line.split("conversation_avg=")
                .nth(1)
                .and_then(|v| v.split_whitespace().next())
                .unwrap_or("?"),
            provider.calls.load(Ordering::Relaxed),
            provider.overloaded.load(Ordering::Relaxed),
            provider.compactions.load(Ordering::Relaxed),
            provider.served.load(Ordering::Relaxed),
        );
        if kind == "final" {
            last_final = Some(line);
            continue;
        }
        match baseline {
            None if t >= 60 => baseline = Some((t, rss)),
            Some(_) => peak_after = peak_after.max(rss),
            None => {}
        }
    }
    let status = child.wait().expect("the program's exit");
    server.abort();
    println!(
        "  ended after {:.0} s with {status}",
        started.elapsed().as_secs_f64()
    );
    if !status.success() {
        failures.push(format!("{}: colony run exited with {status}", usage.name()));
    }
    match baseline {
        Some((t, base)) => {
            let limit = base + base / 10;
            println!(
                "  rss after the first minute: {:.1} MB at t={t} s, highest later {:.1} MB (limit {:.1} MB)",
                base as f64 / 1024.0,
                peak_after as f64 / 1024.0,
                limit as f64 / 1024.0
            );
            if peak_after > limit {
                failures.push(format!(
                    "{}: rss grew from {base} kB to {peak_after} kB after the first minute",
                    usage.name()
                ));
            }
        }
        None => println!("  (no sample after the first minute: the RSS bound is not checked)"),
    }
    match last_final {
        None => failures.push(format!("{}: no final line", usage.name())),
        Some(line) => {
            let accepted = field(&line, "accepted");
            let served = field(&line, "served");
            let dropped = field(&line, "dropped");
            let waiting = field(&line, "waiting");
            let seen = provider.served.load(Ordering::Relaxed);
            println!(
                "  accounting: accepted {accepted} = served {served} + dropped {dropped} + waiting {waiting}; the provider saw {seen} served"
            );
            if accepted != served + dropped + waiting {
                failures.push(format!(
                    "{}: {} accepted mails unaccounted for",
                    usage.name(),
                    accepted as i64 - (served + dropped + waiting) as i64
                ));
            }
            if seen != served {
                failures.push(format!(
                    "{}: colony counts {served} mails served, the provider saw {seen}",
                    usage.name()
                ));
            }
        }
    }
    failures
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects nothing here.
    let settings = Settings {
        secs: env_or("SOAK_SECS", 600),
        sample: env_or("SOAK_SAMPLE_SECS", 30),
        residents: env_or("SOAK_RESIDENTS", 1000),
        rate: env_or("SOAK_RATE", 100),
        max_calls: std::env::var("SOAK_MAX_CALLS").ok().map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("SOAK_MAX_CALLS={v:?} is not a whole number"))
        }),
    };
    let modes: Vec<Usage> = std::env::var("SOAK_MODES")
        .unwrap_or_else(|_| "realistic,none".into())
        .split(',')
        .map(|m| Usage::parse(m.trim()))
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime for the fake provider");
    let mut failures = Vec::new();
    for usage in modes {
        failures.extend(soak(&rt, usage, &settings));
    }
    if failures.is_empty() {
        println!("soak: passed");
    } else {
        for f in &failures {
            println!("soak: FAILED: {f}");
        }
        std::process::exit(1);
    }
}
