//! `colony serve` under load: the release binary on loopback, against the fake provider answering
//! at once, so every figure is the service's own cost (HTTP, routing, the turn, the events).
//!
//! 1. **API mail to delivery event**: one idle resident (`deliver_to = "host"`), sequential rounds:
//!    the clock starts before `POST /api/programs/p/mail` and stops when its `delivery` event
//!    arrives on `/api/events`. p50 and p99.
//! 2. **Sustained API mails/s**: 8 clients post 4,000 mails at once to one resident, round
//!    robin over 100 residents; the rate of `202`s, and the rate until every mail was served
//!    (the resident's `served` counts in the API).
//! 3. **`/metrics` with 10,000 residents**: the scrape's time (median of 10) and size.
//! 4. **The dashboard's first render with 10,000 residents**: headless Chromium's own
//!    `performance.now()` (from navigation start) when the page has listed its programs and the
//!    first page of residents and opened its event stream (median of 3 loads).
//!
//! Run: `cargo bench --bench serve` (about a minute).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::browser::Headless;
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::serve::Served;

fn program(residents: usize) -> String {
    format!(
        "for i = 1, {residents} do ai.spawn{{ name = 'r' .. i, deliver_to = 'host' }} end\nai.watch{{}}\n"
    )
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("ok"));
    let sb = Sandbox::new();
    sb.write(
        "config.toml",
        &format!(
            "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nkey = \"bench-key-0123456789\"\nbase_url = \"{}\"\n",
            fake.base_url("openai")
        ),
    );
    let small = sb.write("small.lua", &program(100));
    let big = sb.write("big.lua", &program(10_000));
    let served = Served::start(
        &sb,
        &[&small.display().to_string(), &big.display().to_string()],
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while served.get("/readyz").status != 200 {
        assert!(
            Instant::now() < deadline,
            "never ready: {}",
            served.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // 1. Mail to delivery event.
    let events = served.events(None);
    let rounds = 300;
    let mut lat = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let start = Instant::now();
        let a = served.mail("small", json!({ "to": "r1", "content": format!("m{i}") }));
        assert_eq!(a.status, 202);
        events.next_of("delivery", "r1");
        lat.push(start.elapsed());
    }
    lat.sort();
    println!(
        "serve: API mail -> delivery event, {rounds} rounds: p50 {}, p99 {}",
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99))
    );
    drop(events);

    // 2. Sustained mails/s.
    let total = 4_000usize;
    let clients = 8;
    let before: u64 = served_total(&served);
    let start = Instant::now();
    std::thread::scope(|s| {
        for c in 0..clients {
            let url = served.url.clone();
            s.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let client = reqwest::Client::new();
                rt.block_on(async {
                    for i in (c..total).step_by(clients) {
                        let r = client
                            .post(format!("{url}/api/programs/small/mail"))
                            .json(&json!({ "to": format!("r{}", 1 + i % 100), "content": "x" }))
                            .send()
                            .await
                            .unwrap();
                        assert_eq!(r.status().as_u16(), 202);
                    }
                });
            });
        }
    });
    let accepted = start.elapsed();
    while served_total(&served) < before + total as u64 {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "mail never all served"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let all_served = start.elapsed();
    println!(
        "serve: {total} API mails from {clients} clients to 100 residents: {:.0} accepted/s ({:.2} s), {:.0} served/s ({:.2} s to serve all)",
        total as f64 / accepted.as_secs_f64(),
        accepted.as_secs_f64(),
        total as f64 / all_served.as_secs_f64(),
        all_served.as_secs_f64()
    );

    // 3. The scrape with 10,000 residents (and 100 more).
    let mut times = Vec::new();
    let mut size = 0;
    for _ in 0..10 {
        let start = Instant::now();
        let s = served.get("/metrics");
        times.push(start.elapsed());
        assert_eq!(s.status, 200);
        size = s.text.len();
    }
    times.sort();
    println!(
        "serve: /metrics with 10,100 residents: median {}, max {}, {:.1} KiB",
        ms(pct(&times, 0.5)),
        ms(*times.last().unwrap()),
        size as f64 / 1024.0
    );

    // 4. The dashboard's first render: the first program (by name) is the 10,000-resident one.
    let mut renders = Vec::new();
    for _ in 0..3 {
        let browser = Headless::open(&format!("{}/", served.url));
        browser.until("its first render", "document.body.dataset.ready === 'yes'");
        let info: String = browser.eval("document.getElementById('page-info').textContent");
        assert_eq!(info, "1–100 of 10000");
        renders.push(browser.eval::<f64>("window.colonyFirstRender"));
    }
    renders.sort_by(f64::total_cmp);
    println!(
        "serve: dashboard first render with 10,000 residents (programs, first page of residents, event stream opening), from the browser's performance.now(): median {:.1} ms of {:?}",
        renders[1], renders
    );
}

/// Mails served by every resident of `small`, from the API.
fn served_total(served: &Served) -> u64 {
    let r = served.get("/api/programs/small/residents?limit=1000").json;
    r["residents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["served"].as_u64().unwrap_or(0))
        .sum()
}
