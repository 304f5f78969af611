//! colony in bench-peers: the agent is a colony program (`colony_agent.lua`: `ai.tool`, `ai.run`,
//! `ai.parallel`) and this harness runs it the way `colony run` does (the same multi-thread core,
//! the same config loading and logging set-up, the program's SQLite store in a state directory
//! of its own, where every tool call's audit line is written, `colony::lua::run_source_with` on a
//! VM thread of its own), then measures it by the bench contract of `py/common.py`.
//!
//! Lua has no wall clock yet, so the script runs warm-up and the timed loop itself and marks its
//! progress through a pipe; at "start" and "end" it blocks until this harness has read the fake
//! server's counter and the clocks and answered "go" on a second pipe. Warm-up and the timed loop
//! share one VM, so the timed turns reuse the warm connection pool, as in every other client.
//!
//! Build and run: `cargo build --release --example peers_colony`, then
//! `target/release/examples/peers_colony 300 --port 18765` against fake_openai.js.

// The task's constants live in colony_agent.lua; this harness uses the rest.
#[path = "common.rs"]
#[allow(dead_code)]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::time::Instant;

use common::{Args, Report};

const AGENT: &str = include_str!("colony_agent.lua");

/// The allocator the `colony` binary runs with (runtime/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What the script reports at its "end" mark.
#[derive(serde::Deserialize)]
struct Counts {
    ok_turns: usize,
    tool_calls: u64,
    warmup_failures: usize,
    first_error: Option<String>,
}

/// As `colony run` sets up logging (runtime/cli/mod.rs `init_logging`): warnings to stderr.
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() {
    let started = Instant::now();
    let args = Args::parse();
    init_logging();
    // As `colony run` opens it (runtime/cli/run.rs), in a scratch state directory: a new store,
    // as a program's first run creates it. `PEERS_COLONY_STATE=DIR` keeps it in DIR instead, so
    // that the runs after the first open the store they left, as a program's later runs do.
    let (state_path, scratch) = match std::env::var_os("PEERS_COLONY_STATE") {
        Some(dir) => (std::path::PathBuf::from(dir), None),
        None => {
            let dir = tempfile::tempdir().expect("a scratch state directory");
            (dir.path().to_path_buf(), Some(dir))
        }
    };
    // As `colony run` does (runtime/cli/mod.rs), the store opens on a thread of its own before
    // the runtime is built, while it and the VM are.
    let opening = colony::store::opening::Opening::start(
        state_path,
        None,
        std::path::PathBuf::from("colony_agent.lua"),
    )
    .expect("a thread to open the store");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("colony-core")
        .build()
        .expect("the runtime starts");
    let core = match colony::cli::build_core(&colony::cli::Cassettes::default(), rt.handle()) {
        Ok(core) => core,
        Err(f) => {
            eprintln!("{}", f.message);
            std::process::exit(f.code.into());
        }
    };

    // Script -> harness: one line per mark. Harness -> script: "go" after "start" and "end".
    let (mark_rx, mark_tx) = std::io::pipe().expect("a pipe");
    let (ack_rx, mut ack_tx) = std::io::pipe().expect("a pipe");
    let script_args = vec![
        args.turns.to_string(),
        args.concurrent.to_string(),
        args.warmup.to_string(),
        args.port.to_string(),
        mark_tx.as_raw_fd().to_string(),
        ack_rx.as_raw_fd().to_string(),
    ];
    // `PEERS_COLONY_STORE=memory` runs with the in-memory store an embedding gets by default,
    // to measure the SQLite store's share of a step side by side.
    let in_memory = std::env::var("PEERS_COLONY_STORE").is_ok_and(|v| v == "memory");
    let host = colony::lua::HostSetup {
        store_opening: (!in_memory).then(|| opening.store()),
        ..colony::lua::HostSetup::default()
    };
    let script = std::thread::spawn(move || {
        let result = colony::lua::run_source_with(
            core,
            "colony_agent.lua",
            AGENT.as_bytes().to_vec(),
            script_args,
            host,
        );
        drop(opening.finish().expect("the program's store opens"));
        // However the script ended, tell the harness it is over.
        let _ = (&mark_tx).write_all(b"exit\n");
        drop((mark_tx, ack_rx));
        result
    });

    let mut import_s = None;
    let mut first_turn_s = None;
    let mut ready = started;
    let (mut req_before, mut cpu0, mut t0) = (0, 0.0, started);
    let mut timed = None;
    for line in BufReader::new(mark_rx).lines() {
        let line = line.expect("reading the marks");
        let (mark, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match mark {
            // The VM is built, colony's modules are registered and the script runs.
            "ready" => {
                ready = Instant::now();
                import_s = Some(started.elapsed().as_secs_f64());
            }
            "first" if args.warmup > 0 => first_turn_s = Some(ready.elapsed().as_secs_f64()),
            "first" => {}
            "start" => {
                req_before = common::server_requests(args.port);
                cpu0 = common::cpu_seconds();
                t0 = Instant::now();
                ack_tx.write_all(b"go\n").expect("answering the script");
            }
            "end" => {
                let wall_s = t0.elapsed().as_secs_f64();
                let cpu_s = common::cpu_seconds() - cpu0;
                let steps = common::server_requests(args.port) - req_before;
                let counts: Counts = serde_json::from_str(rest).expect("the script's counts");
                timed = Some((wall_s, cpu_s, steps, counts));
                ack_tx.write_all(b"go\n").expect("answering the script");
            }
            "exit" => break,
            other => panic!("unknown mark {other:?}"),
        }
    }
    let joined = script.join().expect("the script thread");
    drop(scratch);
    if let Err(e) = joined {
        eprintln!("{e}");
        std::process::exit(1);
    }
    let Some((wall_s, cpu_s, steps, counts)) = timed else {
        eprintln!("the script ended without its timed loop");
        std::process::exit(1);
    };
    let report = Report {
        framework: "colony".into(),
        version: format!(
            "colony {} (mlua {}, reqwest {})",
            env!("CARGO_PKG_VERSION"),
            common::locked_version("mlua"),
            common::locked_version("reqwest")
        ),
        args_turns: args.turns,
        concurrent: args.concurrent,
        warmup: args.warmup,
        steps,
        wall_s,
        cpu_s,
        ok_turns: counts.ok_turns,
        tool_calls: counts.tool_calls,
        import_s: import_s.unwrap_or(0.0),
        first_turn_s,
        warmup_failures: counts.warmup_failures,
        first_error: counts.first_error,
    };
    let code = report.print();
    // Shut the core down without waiting on idle pool connections, as the process ends anyway.
    rt.shutdown_background();
    std::process::exit(code);
}
