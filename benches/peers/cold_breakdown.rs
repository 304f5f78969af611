//! Where colony's cold start goes: each step `colony run` (and peers_colony) takes before a
//! script's first model call, timed on its own, first time and again (min of 5 repeats), with
//! colony's public API. No server needed.
//!
//! Run: `cargo run --release --example peers_cold_breakdown`

use std::time::{Duration, Instant};

use colony::config::Config;
use colony::core::Core;
use colony::providers::Providers;
use colony::store::state_dir::StateDir;
use colony::turn::{Handler, ToolDef};
use serde_json::json;

const REPEATS: usize = 5;

/// The first run of `f`, and the fastest of the next REPEATS.
fn time<T>(mut f: impl FnMut() -> T) -> (Duration, Duration) {
    let t = Instant::now();
    drop(f());
    let first = t.elapsed();
    let again = (0..REPEATS)
        .map(|_| {
            let t = Instant::now();
            drop(f());
            t.elapsed()
        })
        .min()
        .unwrap_or_default();
    (first, again)
}

fn row(what: &str, (first, again): (Duration, Duration)) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("{what:<62} {:>8.2} {:>8.2}", ms(first), ms(again));
}

fn main() {
    let started = Instant::now();
    println!("{:<62} {:>8} {:>8}", "step (ms)", "first", "again");
    row(
        "tokio multi-thread runtime (the core)",
        time(|| {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("runtime")
        }),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    row("Config::load", time(Config::load));
    row(
        "reqwest::Client::new (rustls + platform verifier)",
        time(reqwest::Client::new),
    );
    row(
        "Providers::new (core's HTTP client)",
        time(|| Providers::new(None, None)),
    );
    let core = Core::new(
        Config::default(),
        Providers::new(None, None),
        rt.handle().clone(),
    );
    row(
        "Core::with_own_client (a VM's HTTP client)",
        time(|| core.with_own_client()),
    );
    row(
        "lua::new_vm (Lua state + modules + own client)",
        time(|| colony::lua::new_vm(core.clone()).expect("vm")),
    );
    let schema = json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    });
    row(
        "ToolDef::new for add (jsonschema compile)",
        time(|| {
            ToolDef::new(
                "add",
                "Add two integers.",
                schema.clone(),
                None,
                Handler::Lua(1),
            )
        }),
    );
    row(
        "run_source(\"\") (thread + runtime + VM + teardown)",
        time(|| colony::lua::run_source(core.clone(), "empty", Vec::new(), vec![])),
    );
    let tool = br#"local add = ai.tool{ name = "add", description = "Add two integers.",
        parameters = { type = "object", properties = { a = { type = "integer" }, b = { type = "integer" } },
                       required = { "a", "b" } },
        handler = function(args) return args.a + args.b end }"#;
    row(
        "run_source(ai.tool{add}) (the same + the tool)",
        time(|| colony::lua::run_source(core.clone(), "tool", tool.to_vec(), vec![])),
    );
    // The program's store as `colony run` opens it (on a thread of its own, beside the VM):
    // its state directory locked, the store written out new (a program's first run) or the
    // one a run left opened and checked (every later run).
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let mut new_dirs = 0;
    row(
        "StateDir::open + close, a new store (written out)",
        time(|| {
            new_dirs += 1;
            StateDir::open(&scratch.path().join(new_dirs.to_string())).expect("a new store")
        }),
    );
    row(
        "StateDir::open + close, the store a run left (checked)",
        time(|| StateDir::open(&scratch.path().join("1")).expect("the kept store")),
    );
    row(
        "total of this program so far",
        (started.elapsed(), Duration::ZERO),
    );
}
