//! The round trip of one Lua tool call dispatched from Rust through the bridge: the job crosses
//! to the Lua thread, the handler runs in its own coroutine, the answer comes back on a oneshot.
//! Measured from the Lua thread itself (a script's own turn) and from the core's multi-thread
//! runtime (a resident's turn), with the call's context as a turn sends it (typed fields, made
//! into the handler's `ctx` table on the Lua thread), and once more from the Lua thread with the
//! context as a JSON value (how it travelled before). Aim: at or under 5 us from the Lua thread.
//! Each figure is measured with the watchdog hook and without, side by side (aim: the hook under
//! 3 %; benches/common/watchdog.rs says how). A last figure is a handler that is all Lua work (a
//! loop of 10,000 steps), where the hook costs most: while any count hook is set, Lua 5.4 calls
//! its hook check before every instruction, not only every 1,000th.
//!
//! Run: `cargo bench --bench tool_roundtrip`

#[path = "common/watchdog.rs"]
mod watchdog;

use std::time::Instant;

use colony::config::Config;
use colony::core::Core;
use colony::lua::bridge::{self, HandlerOutcome, LuaBridge};
use colony::providers::Providers;
use colony::script::{Script, ToolContext};
use serde_json::json;

const CALLS: u32 = 100_000;
/// Each figure is the best of this many batches of its calls: a batch the machine slowed (this
/// 2-core machine's neighbours take time now and then) does not count.
const BATCHES: u32 = 20;

/// Microseconds per call of a batch of `n` calls begun at `started`.
fn per_call(started: Instant, n: u32) -> f64 {
    started.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// A tool's deadline, as dispatch gives each call (its `timeout` from now).
fn deadline() -> Option<Instant> {
    Instant::now().checked_add(std::time::Duration::from_secs(120))
}

fn main() {
    let (with, without) = watchdog::pair(measure);
    let (same_thread, cross_thread, json_ctx) = (with[0], with[1], with[2]);
    println!(
        "Lua tool call round trip through the bridge ({CALLS} calls in {BATCHES} batches, the \
         best batch; handler `a + b`)"
    );
    println!("from the Lua thread   {same_thread:>7.2} us/call  (aim: at or under 5 us)");
    println!("from the core runtime {cross_thread:>7.2} us/call  (two thread wake-ups per call)");
    println!("from the Lua thread, the context as JSON {json_ctx:>7.2} us/call");
    println!();
    watchdog::header("the same calls");
    watchdog::line("from the Lua thread", "us", with[0], without[0]);
    watchdog::line("from the core runtime", "us", with[1], without[1]);
    watchdog::line(
        "from the Lua thread, JSON context",
        "us",
        with[2],
        without[2],
    );
    watchdog::line("a handler of 10,000 Lua steps", "us", with[3], without[3]);
}

/// The four figures, in us per call: from the Lua thread, from the core, with a JSON context, and
/// a handler that is all Lua work.
fn measure() -> Vec<f64> {
    let core_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let core = Core::new(
        Config::default(),
        Providers::new(None, None),
        core_rt.handle().clone(),
    );
    let lua_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&lua_rt, async {
        let (lua, jobs) = colony::lua::new_vm(core).expect("a VM");
        tokio::task::spawn_local(bridge::serve(lua.clone(), jobs));
        let handler = lua
            .load("return function(args, ctx) return args.a + args.b end")
            .eval()
            .expect("a handler");
        let id = bridge::register(&lua, handler);
        let bridge = lua.app_data_ref::<LuaBridge>().expect("a bridge").clone();
        let args = json!({"a": 2, "b": 3});
        let ctx = json!({"call_id": "c", "name": "add", "step": 1});
        let cx = ToolContext {
            call_id: "c".into(),
            name: "add".into(),
            step: 1,
            deadline: deadline(),
            ..ToolContext::default()
        };

        for _ in 0..10_000 {
            bridge.call_handler(id, args.clone(), cx.clone()).await;
        }
        let mut same_thread = f64::MAX;
        for _ in 0..BATCHES {
            let started = Instant::now();
            for _ in 0..CALLS / BATCHES {
                let out = bridge.call_handler(id, args.clone(), cx.clone()).await;
                assert_eq!(out, HandlerOutcome::Value("5".into()));
            }
            same_thread = same_thread.min(per_call(started, CALLS / BATCHES));
        }

        let mut json_ctx = f64::MAX;
        for _ in 0..BATCHES {
            let started = Instant::now();
            for _ in 0..CALLS / BATCHES {
                let out = bridge.call_tool(id, args.clone(), ctx.clone()).await;
                assert_eq!(out, HandlerOutcome::Value("5".into()));
            }
            json_ctx = json_ctx.min(per_call(started, CALLS / BATCHES));
        }

        // From the core: each call crosses threads both ways.
        let remote = bridge.clone();
        let (args2, cx2) = (args.clone(), cx.clone());
        let cross = core_rt.spawn(async move {
            let n = CALLS / 10 / BATCHES;
            let mut best = f64::MAX;
            for _ in 0..BATCHES {
                let started = Instant::now();
                for _ in 0..n {
                    remote.call_handler(id, args2.clone(), cx2.clone()).await;
                }
                best = best.min(per_call(started, n));
            }
            best
        });
        let cross_thread = cross.await.expect("the core task");

        let busy = lua
            .load(
                "return function(args, ctx)
                   local s = 0
                   for i = 1, args.n do s = (s + i * 7) % 1000003 end
                   return s
                 end",
            )
            .eval()
            .expect("a busy handler");
        let busy = bridge::register(&lua, busy);
        let n = CALLS / 100 / BATCHES;
        let busy_args = json!({"n": 10_000});
        let mut lua_work = f64::MAX;
        for _ in 0..BATCHES {
            let started = Instant::now();
            for _ in 0..n {
                let out = bridge
                    .call_handler(busy, busy_args.clone(), cx.clone())
                    .await;
                assert!(matches!(out, HandlerOutcome::Value(_)), "{out:?}");
            }
            lua_work = lua_work.min(per_call(started, n));
        }
        vec![same_thread, cross_thread, json_ctx, lua_work]
    })
}
