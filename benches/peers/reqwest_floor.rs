//! The Rust floor of bench-peers: a bare reqwest client doing the two chat-completions calls of a
//! turn by hand (call 1 returns a tool call, `add` runs here, call 2 returns the final text), like
//! `py/raw_openai.py` and `node/raw_fetch.mjs`. No framework: the per-step cost of reqwest, hyper,
//! tokio and serde_json that any Rust client pays, colony included.
//!
//! The loop runs on a current-thread tokio runtime, as colony drives a script's own model calls
//! (and as Node and asyncio run theirs: one event loop); `--concurrent C` keeps C turns in flight
//! with `join_all`, like `Promise.all` in the Node harness.
//!
//! It is a package of its own (`floor/Cargo.toml`), so colony's release profile (its
//! dependencies optimised for size, its debug info) does not reach it. Build and run: `benches/peers/run.sh` builds it into
//! `target/peers-floor/release/peers_reqwest_floor`; run that with `300 --port 18765` against
//! fake_openai.js.

#[path = "common.rs"]
mod common;

use std::cell::{Cell, RefCell};
use std::time::Instant;

use common::{Args, INSTRUCTIONS, MODEL, PROMPT, Report};
use serde_json::{Value, json};

fn tools() -> Value {
    json!([{
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }])
}

struct Client {
    http: reqwest::Client,
    url: String,
    tools: Value,
    /// Every run of `add`, over the whole process.
    tool_calls: Cell<u64>,
}

impl Client {
    async fn chat(&self, messages: &[Value]) -> Result<Value, String> {
        let body = json!({ "model": MODEL, "messages": messages, "tools": self.tools });
        let r = self
            .http
            .post(&self.url)
            .bearer_auth("x")
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("fetch: {e}"))?;
        let status = r.status();
        if !status.is_success() {
            let text = r.text().await.unwrap_or_default();
            return Err(format!("HTTP {status}: {text}"));
        }
        let mut v: Value = r.json().await.map_err(|e| format!("JSON: {e}"))?;
        Ok(v["choices"][0]["message"].take())
    }

    fn add(&self, a: i64, b: i64, calls: &Cell<u32>) -> i64 {
        self.tool_calls.set(self.tool_calls.get() + 1);
        calls.set(calls.get() + 1);
        a + b
    }

    /// One fresh conversation to its end: the final text, and how often this turn's `add` ran.
    async fn turn(&self) -> Result<(String, u32), String> {
        let calls = Cell::new(0);
        let mut messages = vec![
            json!({"role": "system", "content": INSTRUCTIONS}),
            json!({"role": "user", "content": PROMPT}),
        ];
        let m1 = self.chat(&messages).await?;
        let tool_calls = m1["tool_calls"].as_array().cloned().unwrap_or_default();
        messages.push(m1);
        for call in tool_calls {
            let args: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or(""))
                    .map_err(|e| format!("arguments: {e}"))?;
            let (Some(a), Some(b)) = (args["a"].as_i64(), args["b"].as_i64()) else {
                return Err(format!("bad arguments: {args}"));
            };
            let result = self.add(a, b, &calls);
            messages.push(
                json!({"role": "tool", "tool_call_id": call["id"], "content": result.to_string()}),
            );
        }
        let m2 = self.chat(&messages).await?;
        let text = m2["content"].as_str().unwrap_or("").to_string();
        Ok((text, calls.get()))
    }

    /// Runs one turn and judges it as py/common.py does; a failure is noted, not raised.
    async fn one(&self, failures: &RefCell<Vec<String>>) -> usize {
        match self.turn().await {
            Ok((text, 1)) if text.contains('5') => 1,
            Ok((text, n)) => {
                let text: String = text.chars().take(80).collect();
                failures
                    .borrow_mut()
                    .push(format!("bad turn: text={text:?} tool_calls={n}"));
                0
            }
            Err(e) => {
                failures.borrow_mut().push(e.chars().take(300).collect());
                0
            }
        }
    }

    async fn run_turns(
        &self,
        n: usize,
        concurrency: usize,
        failures: &RefCell<Vec<String>>,
    ) -> usize {
        if concurrency <= 1 {
            let mut ok = 0;
            for _ in 0..n {
                ok += self.one(failures).await;
            }
            return ok;
        }
        let remaining = Cell::new(n);
        let ok = Cell::new(0);
        let worker = || async {
            while remaining.get() > 0 {
                remaining.set(remaining.get() - 1);
                let good = self.one(failures).await;
                ok.set(ok.get() + good);
            }
        };
        futures::future::join_all((0..concurrency).map(|_| worker())).await;
        ok.get()
    }
}

fn main() {
    let started = Instant::now();
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the runtime starts");
    let client = Client {
        http: reqwest::Client::new(),
        url: format!("{}/chat/completions", args.base_url()),
        tools: tools(),
        tool_calls: Cell::new(0),
    };
    let import_s = started.elapsed().as_secs_f64();

    let report = rt.block_on(async {
        let failures = RefCell::new(Vec::new());
        let t0 = Instant::now();
        if args.warmup > 0 {
            client.run_turns(1, 1, &failures).await;
        }
        let first_turn_s = (args.warmup > 0).then(|| t0.elapsed().as_secs_f64());
        client
            .run_turns(args.warmup.saturating_sub(1), args.concurrent, &failures)
            .await;
        let warmup_failures = failures.borrow().len();

        let calls_before = client.tool_calls.get();
        let req_before = common::server_requests(args.port);
        let cpu0 = common::cpu_seconds();
        let t0 = Instant::now();
        let ok = client
            .run_turns(args.turns, args.concurrent, &failures)
            .await;
        let wall_s = t0.elapsed().as_secs_f64();
        let cpu_s = common::cpu_seconds() - cpu0;
        let steps = common::server_requests(args.port) - req_before;
        let first_error = failures.borrow().first().cloned();
        Report {
            framework: "raw-reqwest-rust".into(),
            version: format!(
                "reqwest {} + tokio {}",
                common::locked_version("reqwest"),
                common::locked_version("tokio")
            ),
            args_turns: args.turns,
            concurrent: args.concurrent,
            warmup: args.warmup,
            steps,
            wall_s,
            cpu_s,
            ok_turns: ok,
            tool_calls: client.tool_calls.get() - calls_before,
            import_s,
            first_turn_s,
            warmup_failures,
            first_error,
        }
    });
    std::process::exit(report.print());
}
