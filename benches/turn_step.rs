//! The runtime's own cost per step of a turn: a Lua `ai.take_turn` of N steps (N-1 tool calls,
//! then an answer) against the fake provider, minus the same N HTTP exchanges sent by a bare
//! reqwest loop (the very request bodies colony sent, captured from the fake), per step. Measured
//! with the watchdog hook and without, side by side (aim: the hook under 3 %;
//! benches/common/watchdog.rs says how).
//!
//! Run: `cargo bench --bench turn_step`

#[path = "common/watchdog.rs"]
mod watchdog;

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use colony::config::Config;
use colony::core::Core;
use colony::providers::Providers;
use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};

const STEPS: usize = 5;
const TURNS: usize = 300;

/// Answers with a tool call until the transcript holds STEPS-1 tool results, then with text.
fn responder(body: &Value, _style: &str) -> Reply {
    let results = body["messages"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["role"] == "tool").count())
        .unwrap_or(0);
    if results + 1 < STEPS {
        Reply::tool_call(format!("call_{results}"), "add", json!({"a": 2, "b": 3}))
    } else {
        Reply::text("The answer is 5.")
    }
}

fn script(base_url: &str, turns: usize) -> String {
    format!(
        r#"local add = ai.tool{{ name = "add", description = "Add two integers.",
             parameters = {{ a = "integer", b = "integer" }}, handler = function(args) return args.a + args.b end }}
           for _ = 1, {turns} do
             local r = ai.take_turn{{ prompt = "What is 2+3? Use the add tool.", tools = {{ add }},
               provider = "openai", key = "bench-key-0123456789", base_url = "{base_url}", max_steps = {STEPS} }}
             assert(r.steps == {STEPS} and r.stop == "end_turn", r.error or r.stop)
           end"#
    )
}

/// Wall and CPU time of `f`.
fn timed(f: impl FnOnce()) -> (Duration, Duration) {
    let (wall, cpu0) = (Instant::now(), watchdog::cpu());
    f();
    (wall.elapsed(), watchdog::cpu() - cpu0)
}

fn colony_turns(core: &Core, base_url: &str, turns: usize) {
    colony::lua::run_source(
        core.clone(),
        "bench",
        script(base_url, turns).into_bytes(),
        vec![],
    )
    .expect("the bench script runs");
}

async fn bare_turns(client: &reqwest::Client, url: &str, bodies: &[Value], turns: usize) {
    for _ in 0..turns {
        for body in bodies {
            let resp = client
                .post(url)
                .bearer_auth("bench-key-0123456789")
                .json(body)
                .send()
                .await
                .expect("the fake answers");
            let v: Value = resp.json().await.expect("JSON");
            assert!(v["choices"].is_array());
        }
    }
}

fn main() {
    let (with, without) = watchdog::pair(measure);
    let (bare_wall, bare_cpu, colony_wall, colony_cpu) = (with[0], with[1], with[2], with[3]);
    println!(
        "runtime cost per step: ai.take_turn of {STEPS} steps ({} tool calls) x {TURNS} turns, best of {}",
        STEPS - 1,
        3 * 5
    );
    println!(
        "                           wall us/step   CPU us/step (this process, fake server included)"
    );
    println!("bare reqwest, same bodies  {bare_wall:>12.1}  {bare_cpu:>12.1}");
    println!("colony take_turn           {colony_wall:>12.1}  {colony_cpu:>12.1}");
    println!(
        "colony's own cost          {:>12.1}  {:>12.1}",
        colony_wall - bare_wall,
        colony_cpu - bare_cpu
    );
    println!();
    watchdog::header("per step");
    watchdog::line("colony take_turn, wall", "us", with[2], without[2]);
    watchdog::line("colony take_turn, CPU", "us", with[3], without[3]);
    watchdog::line(
        "colony's own cost, CPU",
        "us",
        with[3] - with[1],
        without[3] - without[1],
    );
}

/// Best of 5, in us per step: the bare floor's wall and CPU time, then colony's.
fn measure() -> Vec<f64> {
    let fake = FakeProvider::start();
    fake.set_responder(responder);
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

    // One turn to capture the exact requests colony sends.
    fake.take_requests();
    colony_turns(&core, &base_url, 1);
    let bodies: Vec<Value> = fake.take_requests().into_iter().map(|r| r.body).collect();
    assert_eq!(bodies.len(), STEPS);

    // The floor runs like colony's Lua thread does: a current-thread runtime owning its
    // connections, so neither side pays thread wake-ups the other does not.
    let bare_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = reqwest::Client::new();
    let url = format!("{base_url}/chat/completions");
    bare_rt.block_on(bare_turns(&client, &url, &bodies, 20));
    colony_turns(&core, &base_url, 20);
    let best = |a: (Duration, Duration), b: (Duration, Duration)| (a.0.min(b.0), a.1.min(b.1));
    let (mut bare, mut colony) = (
        (Duration::MAX, Duration::MAX),
        (Duration::MAX, Duration::MAX),
    );
    for _ in 0..5 {
        bare = best(
            bare,
            timed(|| bare_rt.block_on(bare_turns(&client, &url, &bodies, TURNS))),
        );
        colony = best(colony, timed(|| colony_turns(&core, &base_url, TURNS)));
    }
    let steps = (TURNS * STEPS) as f64;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / steps;
    vec![per(bare.0), per(bare.1), per(colony.0), per(colony.1)]
}
