//! The cost of `ai.ask` from Lua over a bare reqwest call of the same request, against the fake
//! provider on loopback. Both run in this process, interleaved, against the same server; the
//! figure is the ratio of time per call (aim: under 1.2x).
//!
//! Run: `cargo bench --bench ask_overhead`

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use colony::config::Config;
use colony::core::Core;
use colony::providers::Providers;
use support::fake::{FakeProvider, Reply};

const CALLS: usize = 2000;

/// The request `ai.ask("What is 2+3?", { provider = "openai" })` sends, made by hand.
fn bare_body() -> serde_json::Value {
    serde_json::json!({
        "model": "gpt-4.1-mini",
        "messages": [{"role": "user", "content": "What is 2+3?"}],
    })
}

async fn bare(client: &reqwest::Client, url: &str, n: usize) -> Duration {
    let body = bare_body();
    let started = Instant::now();
    for _ in 0..n {
        let resp = client
            .post(url)
            .bearer_auth("bench-key-0123456789")
            .json(&body)
            .send()
            .await
            .expect("the fake answers");
        let value: serde_json::Value = resp.json().await.expect("JSON");
        assert!(value["choices"][0]["message"]["content"].is_string());
    }
    started.elapsed()
}

fn colony(core: &Core, base_url: &str, n: usize) -> Duration {
    let script = format!(
        r#"local opts = {{ provider = "openai", key = "bench-key-0123456789", base_url = "{base_url}" }}
           for _ = 1, {n} do assert(ai.ask("What is 2+3?", opts)) end"#
    );
    let started = Instant::now();
    colony::lua::run_source(core.clone(), "bench", script.into_bytes(), vec![])
        .expect("the bench script runs");
    started.elapsed()
}

fn main() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("The answer is 5."));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let base_url = fake.base_url("openai");
    let core = Core::new(
        Config::default(),
        Providers::new(None, None),
        rt.handle().clone(),
    );
    // The floor runs like colony's Lua thread does: a current-thread runtime owning its
    // connections, so neither side pays thread wake-ups the other does not.
    let bare_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = reqwest::Client::new();
    let url = format!("{base_url}/chat/completions");
    // Warm both paths (connections, allocator, the VM).
    bare_rt.block_on(bare(&client, &url, 200));
    colony(&core, &base_url, 200);

    let mut bare_best = Duration::MAX;
    let mut colony_best = Duration::MAX;
    for _ in 0..3 {
        bare_best = bare_best.min(bare_rt.block_on(bare(&client, &url, CALLS)));
        colony_best = colony_best.min(colony(&core, &base_url, CALLS));
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / CALLS as f64;
    println!(
        "ai.ask overhead against the fake provider (openai style, {CALLS} sequential calls, best of 3)"
    );
    println!("bare reqwest        {:>8.1} us/call", per(bare_best));
    println!("colony ai.ask (Lua) {:>8.1} us/call", per(colony_best));
    println!(
        "ratio               {:>8.2}x  (aim: under 1.2x; includes one VM start)",
        colony_best.as_secs_f64() / bare_best.as_secs_f64()
    );
}
