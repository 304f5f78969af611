//! The fuzz targets' smoke run (`fuzz/targets.rs`): each parser that reads bytes from outside
//! gets a few hundred generated inputs and must answer every one without a panic or a hang. The
//! long run is the same file with more cases (`fuzz/README.md`):
//! `COLONY_FUZZ_CASES=670000 cargo test --profile bench --test fuzz -- --test-threads 2 --nocapture`.
//!
//! Crashes the harness has found are kept below as regression tests, with the input it shrank.

#[path = "../fuzz/targets.rs"]
mod targets;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use colony::vocab::Style;
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Cases per target: `COLONY_FUZZ_CASES`, else a smoke run's 256.
fn cases() -> u32 {
    std::env::var("COLONY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn config() -> Config {
    Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..Config::default()
    }
}

/// One case taking longer than this is a hang: the process says which target and stops (a
/// parser that never returns cannot be interrupted from inside its own thread).
const HANG: Duration = Duration::from_secs(20);

/// The case each thread has in flight: its target and when it began.
static IN_FLIGHT: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<std::thread::ThreadId, (&'static str, Instant)>>,
> = std::sync::LazyLock::new(|| {
    // One watcher for the process: it looks twice a second for a case past `HANG`.
    std::thread::spawn(|| {
        let mut ticks = 0u64;
        loop {
            std::thread::sleep(Duration::from_millis(500));
            ticks += 1;
            // A long run says how far it is, once a minute.
            if ticks.is_multiple_of(120) {
                eprintln!(
                    "fuzz: {} executions so far in this process",
                    targets::EXECUTIONS.load(Ordering::Relaxed)
                );
            }
            let hung = IN_FLIGHT
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .find(|(_, began)| began.elapsed() > HANG)
                .map(|(target, _)| *target);
            if let Some(target) = hung {
                eprintln!("fuzz: {target}: one case ran past {HANG:?}: a hang");
                std::process::abort();
            }
        }
    });
    Default::default()
});

/// Says a target is done and how many executions the process has made so far: the last line a
/// long run prints holds its total, whichever target ends last.
fn done(target: &str) {
    eprintln!(
        "fuzz: {target} done; {} executions so far in this process",
        targets::EXECUTIONS.load(Ordering::Relaxed)
    );
}

/// Runs `f` as one case of `target`, watched for a hang.
fn watched(target: &'static str, f: impl FnOnce()) {
    let me = std::thread::current().id();
    IN_FLIGHT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(me, (target, Instant::now()));
    f();
    IN_FLIGHT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&me);
}

fn scratch() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a scratch folder"))
        .path()
}

fn sse_events() -> impl Strategy<Value = Vec<(String, String)>> {
    let event = prop_oneof![
        Just(String::new()),
        Just("message_start".to_string()),
        Just("content_block_start".to_string()),
        Just("content_block_delta".to_string()),
        Just("content_block_stop".to_string()),
        Just("message_delta".to_string()),
        Just("message_stop".to_string()),
        Just("error".to_string()),
        "[a-z_]{0,12}",
    ];
    let data = prop_oneof![
        4 => targets::json_value().prop_map(|v| v.to_string()),
        1 => Just("[DONE]".to_string()),
        1 => ".{0,64}",
    ];
    proptest::collection::vec((event, data), 0..24)
}

macro_rules! styles {
    ($name:ident, $target:expr) => {
        #[test]
        fn $name() {
            for style in [Style::Anthropic, Style::Openai, Style::Gemini] {
                proptest!(config(), |(bytes in targets::provider_input(style))| {
                    watched(stringify!($name), || $target(style, &bytes));
                });
            }
            done(stringify!($name));
        }
    };
}

styles!(provider_bodies, targets::provider_body);
styles!(provider_streams, targets::provider_stream);

#[test]
fn provider_events() {
    for style in [Style::Anthropic, Style::Openai, Style::Gemini] {
        proptest!(config(), |(events in sse_events())| {
            watched("provider_events", || targets::provider_events(style, &events));
        });
    }
    done("provider_events");
}

#[test]
fn text_tool_calls() {
    let text = prop_oneof![
        ".{0,200}",
        targets::json_value().prop_map(|v| format!("Sure.\n```json\n{v}\n```\nDone.")),
        targets::json_value().prop_map(|v| format!("```{v}``````\n{v}")),
    ];
    proptest!(config(), |(text in text)| {
        watched("text_tool_calls", || targets::text_tool_calls(&text));
    });
    done("text_tool_calls");
}

#[test]
fn json_decode() {
    let bytes = prop_oneof![
        targets::json_value().prop_map(|v| v.to_string().into_bytes()),
        targets::mutated_capture(Style::Openai),
        proptest::collection::vec(any::<u8>(), 0..256),
    ];
    proptest!(config(), |(bytes in bytes)| {
        watched("json_decode", || targets::json_decode(&bytes));
    });
    done("json_decode");
}

#[test]
fn cassettes() {
    let line = prop_oneof![
        targets::json_value().prop_map(|v| v.to_string()),
        targets::json_value()
            .prop_map(|v| { serde_json::json!({ "fingerprint": "f", "response": v }).to_string() }),
        ".{0,80}",
    ];
    let text = proptest::collection::vec(line, 0..6).prop_map(|l| l.join("\n").into_bytes());
    proptest!(config(), |(text in text)| {
        watched("cassettes", || targets::cassette(scratch(), &text));
    });
    done("cassettes");
}

#[test]
fn configs() {
    let line = prop_oneof![
        Just("[use.general]".to_string()),
        Just("[prices.models.m]".to_string()),
        Just("[rate.tools]".to_string()),
        Just("[mcp.docs]".to_string()),
        Just("[serve]".to_string()),
        "[a-z_]{1,10} = \"[ -~]{0,20}\"",
        "[a-z_]{1,10} = -?[0-9]{1,12}(\\.[0-9]{1,4})?",
        "[ -~]{0,40}",
    ];
    let text = proptest::collection::vec(line, 0..12).prop_map(|l| l.join("\n").into_bytes());
    proptest!(config(), |(text in text)| {
        watched("configs", || targets::config(scratch(), &text));
    });
    done("configs");
}

#[test]
fn stored_json() {
    let bytes = prop_oneof![
        targets::json_value().prop_map(|v| v.to_string().into_bytes()),
        targets::json_value().prop_map(|v| {
            serde_json::json!([{ "role": "assistant", "parts": [v] }])
                .to_string()
                .into_bytes()
        }),
        proptest::collection::vec(any::<u8>(), 0..128),
    ];
    proptest!(config(), |(bytes in bytes)| {
        watched("stored_json", || targets::stored(&bytes));
    });
    done("stored_json");
}

#[test]
fn mcp_messages() {
    let result =
        targets::json_value().prop_map(|v| serde_json::json!({ "content": [v], "isError": false }));
    let servers = targets::json_value()
        .prop_map(|v| serde_json::json!({ "mcpServers": { "s": v } }).to_string());
    proptest!(config(), |(value in result, text in servers)| {
        watched("mcp_messages", || targets::mcp(&value, &text));
    });
    done("mcp_messages");
}

/// What a long run prints: the executions across the targets of this process.
#[test]
fn zz_report_executions() {
    // Runs in the same process as the others (the name sorts it last when run on one thread).
    eprintln!(
        "fuzz: {} executions so far in this process",
        targets::EXECUTIONS.load(Ordering::Relaxed)
    );
}
