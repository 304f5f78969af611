//! `examples/embed.rs` in the test suite: a Rust application with a native tool, a Lua program
//! with a Lua tool, mail in and a delivery out, then a clean stop.

mod support;

#[path = "../examples/embed.rs"]
mod embed;

use std::collections::BTreeMap;

use colony::config::{Config, UseConfig};
use colony::embed::Runtime;
use colony::turn::ToolDef;
use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};

/// The clerk's model: look the stock up, convert it, answer.
fn script(fake: &FakeProvider) {
    fake.push(Reply::tool_call(
        "c1",
        "stock.count",
        json!({"item": "apples"}),
    ));
    fake.push(Reply::tool_call("c2", "units.dozens", json!({"count": 30})));
    fake.push(Reply::text("We have 2 dozen apples, and 6 more."));
}

fn fake_config(fake: &FakeProvider) -> Config {
    let general = UseConfig {
        provider: Some("openai".into()),
        model: Some("clerk-model".into()),
        key: Some("test-key-openai-0123456789".into()),
        base_url: Some(fake.base_url("openai")),
        ..UseConfig::default()
    };
    Config {
        uses: BTreeMap::from([("general".to_string(), general)]),
        ..Config::default()
    }
}

/// A runtime whose model is `fake`.
fn fake_runtime(fake: &FakeProvider) -> Runtime {
    Runtime::with_config(fake_config(fake), tokio::runtime::Handle::current())
}

/// `source` written to `p.lua` in a folder of its own (kept while the guard lives).
fn script_file(source: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.lua");
    std::fs::write(&path, source).unwrap();
    (dir, path)
}

const EXPECTED: [&str; 2] = [
    "shop floor -> clerk: How many dozen apples do we have?",
    "clerk -> shop floor: We have 2 dozen apples, and 6 more.",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedding_example_runs_against_a_provider() {
    let fake = FakeProvider::start();
    script(&fake);
    let runtime = Runtime::with_config(fake_config(&fake), tokio::runtime::Handle::current());
    let lines = embed::run(runtime).await.expect("the example runs");
    assert_eq!(lines, EXPECTED);
    let calls = support::model_calls(&fake);
    assert_eq!(calls.len(), 3);
    // The native tool's result, then the Lua tool's, went back to the model.
    let result =
        |body: &Value| body["messages"].as_array().unwrap().last().unwrap()["content"].clone();
    let native: Value = serde_json::from_str(result(&calls[1]).as_str().unwrap()).unwrap();
    assert_eq!(native, json!({"item": "apples", "count": 30}));
    let lua: Value = serde_json::from_str(result(&calls[2]).as_str().unwrap()).unwrap();
    assert_eq!(lua, json!({"dozens": 2, "left_over": 6}));
    // Both tools were offered, the native one by its registered name.
    let names: Vec<&str> = calls[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2);
    assert!(
        calls[0]["messages"][1]["content"]
            == "[mail from shop floor] How many dozen apples do we have?"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedding_example_runs_offline_on_its_cassette() {
    let cassette = support::script::project_root().join("examples/embed.jsonl");
    let runtime = Runtime::replaying(&cassette, tokio::runtime::Handle::current()).unwrap();
    assert_eq!(embed::run(runtime).await.unwrap(), EXPECTED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_before_the_watch_and_unknown_host_tools_are_refused() {
    let fake = FakeProvider::start();
    let runtime = fake_runtime(&fake);
    let (_dir, path) = script_file("ai.spawn{ name = 'x', tools = { 'no.such' } }");
    let program = runtime.load(&path, vec![]).unwrap();
    let err = program.join().await.unwrap_err().to_string();
    assert!(
        err.contains("tools[1] = \"no.such\": no tool of that name was registered by the host"),
        "{err}"
    );
    std::fs::write(&path, "ai.sleep(50) ai.spawn{ name = 'x' } ai.watch{}").unwrap();
    let program = runtime.load(&path, vec![]).unwrap();
    let early = program.mail(colony::residents::Mail::new("x", "t", "hi", 0));
    assert_eq!(early, Err(colony::residents::MailError::NoRecipient));
    program.opened().await;
    program.stop("done");
    program.join().await.unwrap();
}

/// Writes `examples/embed.jsonl` afresh against the fake provider:
/// `cargo test --test embed -- --ignored regenerate_embed_cassette`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes examples/embed.jsonl; run by hand"]
async fn regenerate_embed_cassette() {
    let fake = FakeProvider::start();
    script(&fake);
    let cassette = support::script::project_root().join("examples/embed.jsonl");
    let runtime = Runtime::recording(
        fake_config(&fake),
        &cassette,
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    assert_eq!(embed::run(runtime).await.unwrap(), EXPECTED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opened_returns_when_the_script_fails_before_its_watch() {
    let fake = FakeProvider::start();
    let runtime = fake_runtime(&fake);
    let (_dir, path) = script_file("ai.sleep(20) error('oops before the watch')");
    let program = runtime.load(&path, vec![]).unwrap();
    // The route stops when the script ends, so this returns instead of waiting forever.
    program.opened().await;
    assert_eq!(
        program.mail(colony::residents::Mail::new("x", "t", "hi", 0)),
        Err(colony::residents::MailError::NoRecipient)
    );
    let err = program.join().await.unwrap_err().to_string();
    assert!(err.contains("oops before the watch"), "{err}");
}

/// What a host (an application, a service) does with a loaded program, through the lifecycle
/// that `colony run` drives too: list its residents, hear its events, dismiss one, restart the
/// program from its file (read again), stop it with a reason and a grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_drives_a_program_through_its_lifecycle() {
    use colony::residents::RouteEvent;
    use colony::residents::resident::State;
    let fake = FakeProvider::start();
    let runtime = Runtime::with_config(fake_config(&fake), tokio::runtime::Handle::current());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.lua");
    let program_text = |names: &[&str]| {
        let spawns: String = names
            .iter()
            .map(|n| format!("ai.spawn{{ name = '{n}', deliver_to = 'host' }} "))
            .collect();
        format!("{spawns} local why = ai.watch{{}} fs.write('ended.txt', why)")
    };
    std::fs::write(&path, program_text(&["a", "b"])).unwrap();
    let program = runtime.load(&path, vec![]).unwrap();
    program.opened().await;
    let listed = |p: &colony::embed::Program| -> Vec<(String, State)> {
        p.residents()
            .into_iter()
            .map(|r| (r.name, r.state))
            .collect()
    };
    assert_eq!(
        listed(&program),
        [
            ("a".to_string(), State::Idle),
            ("b".to_string(), State::Idle)
        ]
    );
    let mut events = program.events();
    assert!(program.dismiss("b"));
    assert!(!program.dismiss("nobody"));
    assert_eq!(
        events.recv().await.unwrap(),
        RouteEvent::Gone { ai: "b".into() }
    );
    assert_eq!(program.unblock("a"), Some(false));
    assert_eq!(program.unblock("nobody"), None);

    // The file changed: a restart reads it again.
    std::fs::write(&path, program_text(&["c"])).unwrap();
    let program = program.restart("restarted").await.unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ended.txt")).unwrap(),
        "restarted"
    );
    program.opened().await;
    assert_eq!(listed(&program), [("c".to_string(), State::Idle)]);
    program.stop_within("done", std::time::Duration::from_secs(1));
    assert_eq!(program.lifecycle().stop_reason().as_deref(), Some("done"));
    assert_eq!(
        program.lifecycle().grace(),
        std::time::Duration::from_secs(1)
    );
    program.join().await.unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ended.txt")).unwrap(),
        "done"
    );
}

/// A host of several programs lends each what it needs (`Runtime::load_with`): the observer
/// hears the turn, each tool call as it ends and each model step; the deliveries reach the
/// host's own channel (not `Program::delivery`); the permissions lent are the program's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_lends_a_program_an_observer_a_deliveries_channel_and_its_permissions() {
    use colony::embed::Lend;
    use colony::residents::{Mail, Observation};
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "peek", json!({})));
    fake.push(Reply::text("looked"));
    let runtime = fake_runtime(&fake);
    let (dir, path) = script_file(
        "local peek = ai.tool{ name = 'peek', description = 'Reads a file', parameters = {}, \
         handler = function() return fs.read('secret.txt') end } \
         ai.spawn{ name = 'a', tools = { peek }, deliver_to = 'host' } ai.watch{}",
    );
    std::fs::write(dir.path().join("secret.txt"), "the secret").unwrap();
    let (observer, mut observed) = tokio::sync::mpsc::unbounded_channel();
    let (deliveries, mut delivered) = tokio::sync::mpsc::unbounded_channel();
    let lend = Lend {
        observer: Some(observer),
        deliveries: Some(deliveries),
        permissions: Some(std::sync::Arc::new(colony::permissions::Permissions::none())),
        ..Lend::default()
    };
    let mut program = runtime.load_with(&path, vec![], lend).unwrap();
    program.opened().await;
    program.mail(Mail::new("a", "host", "look", 0)).unwrap();
    let d = delivered
        .recv()
        .await
        .expect("the reply, on the host's channel");
    assert_eq!((d.ai.as_str(), d.text.as_str()), ("a", "looked"));
    // The tool's read was refused: nothing was granted.
    let calls = support::model_calls(&fake);
    let result = calls[1]["messages"].as_array().unwrap().last().unwrap()["content"].clone();
    assert!(
        result
            .as_str()
            .is_some_and(|r| r.contains("needs --allow-read=")),
        "{result}"
    );
    program.stop("done");
    // Its own channel was lent away: `delivery` has nothing for the host.
    assert!(program.delivery().await.is_none());
    program.join().await.unwrap();
    let mut kinds = Vec::new();
    while let Ok(o) = observed.try_recv() {
        kinds.push(match o {
            Observation::TurnStarted { .. } => "turn_started".to_string(),
            Observation::ToolCallEnded { call, .. } => {
                format!("tool {} {}", call.name, call.kind.as_str())
            }
            Observation::ModelCall { ok, .. } => format!("model ok={ok}"),
            Observation::TurnEnded(_) => "turn_ended".to_string(),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(
        kinds,
        [
            "turn_started",
            "model ok=true",
            "tool peek error",
            "model ok=true",
            "turn_ended",
            // The stop ended it: it left the route.
            "Route(Gone { ai: \"a\" })"
        ]
    );
}

/// A program an application loads leaves SIGINT and SIGTERM to the application: once one had
/// watched, tokio's handlers stayed installed for the process's life, and neither Ctrl-C nor
/// `kill` ended the application again, even after the program had ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loaded_program_leaves_the_signals_to_the_application() {
    let cassette = support::script::project_root().join("examples/embed.jsonl");
    let runtime = Runtime::replaying(&cassette, tokio::runtime::Handle::current()).unwrap();
    assert_eq!(embed::run(runtime).await.unwrap(), EXPECTED);
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        // SAFETY: sigaction(2) with no new action only reads the current one into `now`.
        let handler = unsafe {
            let mut now: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(signal, std::ptr::null(), &mut now), 0);
            now.sa_sigaction
        };
        assert_eq!(handler, libc::SIG_DFL, "{name} has a handler of colony's");
    }
}

/// A script that loops after its watch: the application's stop ends it where it stands once
/// the grace and a little more have passed, and `join` returns (it waited for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_after_stop_ends_a_script_that_loops_after_its_watch() {
    let fake = FakeProvider::start();
    let runtime = fake_runtime(&fake);
    let (_dir, path) = script_file("ai.spawn{ name = 'a' } print(ai.watch{}) while true do end");
    let program = runtime.load(&path, vec![]).unwrap();
    program.opened().await;
    program.stop_within("the application is done", std::time::Duration::ZERO);
    // A guard against a hang, not a measure: the stop ends the script within about 10 s.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(120), program.join())
        .await
        .expect("join never returned");
    let err = ended.unwrap_err().to_string();
    assert!(err.contains("the application is done"), "{err}");
}

/// A program dropped while it runs is stopped (it ran on, calling models).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_dropped_while_it_runs_is_stopped() {
    let fake = FakeProvider::start();
    let runtime = fake_runtime(&fake);
    let (_dir, path) = script_file("ai.spawn{ name = 'a' } ai.watch{}");
    let program = runtime.load(&path, vec![]).unwrap();
    program.opened().await;
    let lifecycle = program.lifecycle().clone();
    drop(program);
    assert_eq!(
        lifecycle.stop_reason().as_deref(),
        Some("its Program was dropped")
    );
    tokio::time::timeout(std::time::Duration::from_secs(120), lifecycle.stopped())
        .await
        .expect("the dropped program never stopped");
}

/// A file that does not compile is the load's error, naming the file and line: it loaded `Ok`
/// and the error came out of `join` alone, while mail was refused as to an unknown name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_does_not_compile_is_the_loads_error() {
    let fake = FakeProvider::start();
    let runtime = fake_runtime(&fake);
    let (_dir, path) = script_file("ai.spawn{ name = 'a' \nai.watch{}");
    let err = match runtime.load(&path, vec![]) {
        Ok(_) => panic!("a file that does not compile loaded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("p.lua:2:"), "{err}");
    assert!(err.contains("'}' expected"), "{err}");
}

/// A script that spawns a resident and ends without a watch: the program's deliveries end
/// (`None`), as the doc says, for a host reading them in a loop (it waited for ever: the
/// resident never hired still held the channel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_end_when_the_script_ends_without_a_watch() {
    let fake = FakeProvider::start();
    let runtime = fake_runtime(&fake);
    let (_dir, path) = script_file("ai.spawn{ name = 'a', deliver_to = 'host' }");
    let mut program = runtime.load(&path, vec![]).unwrap();
    program.opened().await;
    let next = tokio::time::timeout(std::time::Duration::from_secs(120), program.delivery())
        .await
        .expect("the deliveries never ended");
    assert!(next.is_none());
    program.join().await.unwrap();
}

/// `path` loaded and open, its `clerk` mailed "go".
async fn clerk_mailed(runtime: &Runtime, path: &std::path::Path) -> colony::embed::Program {
    let program = runtime.load(path, vec![]).unwrap();
    program.opened().await;
    program
        .mail(colony::residents::Mail::new("clerk", "desk", "go", 0))
        .unwrap();
    program
}

/// The program's next delivery to its host, within a minute (past it the test fails).
async fn next_delivery(program: &mut colony::embed::Program) -> colony::residents::Delivery {
    tokio::time::timeout(std::time::Duration::from_secs(60), program.delivery())
        .await
        .expect("a delivery within a minute")
        .expect("a delivery")
}

/// A host tool that panics before it returns its future fails its call, as one that panics in
/// its future does, and the turn goes on: it took the resident down (a crash, a restart) and the
/// mail it served was never answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_tool_that_panics_at_once_fails_its_call_not_the_resident() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "host.boom", json!({})));
    fake.push(Reply::text("carried on"));
    let mut runtime = fake_runtime(&fake);
    fn boom(_: Value) -> futures::future::Ready<Result<Value, String>> {
        panic!("boom before any future")
    }
    runtime
        .register_tool(ToolDef::native("host.boom", "Panics", json!({}), boom).unwrap())
        .unwrap();
    let (_dir, path) = script_file(
        "ai.spawn{ name = 'clerk', tools = { 'host.boom' }, deliver_to = 'host' }\nai.watch{ until_idle = false }\n",
    );
    let mut program = clerk_mailed(&runtime, &path).await;
    let reply = next_delivery(&mut program).await;
    assert_eq!(reply.text, "carried on");
    let calls = support::model_calls(&fake);
    let result = calls[1]["messages"].as_array().unwrap().last().unwrap()["content"].clone();
    assert!(
        result
            .as_str()
            .is_some_and(|r| r.contains("the tool panicked: boom before any future")),
        "{result}"
    );
    assert_eq!(program.residents()[0].restarts, 0);
    program.stop("done");
    program.join().await.unwrap();
}

/// A runtime configured from a file reads it again when it changes, as `colony run` does: a
/// resident blocked for want of a provider tries again once the file is fixed. It was read
/// once, and the resident stayed blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_from_a_config_file_takes_up_the_file_fixed() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("served"));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[use.other]\nmodel = \"x\"\n").unwrap();
    let runtime = Runtime::from_config_file(&config, tokio::runtime::Handle::current()).unwrap();
    let (_script_dir, path) = script_file(
        "ai.spawn{ name = 'clerk', deliver_to = 'host' }\nai.watch{ until_idle = false }\n",
    );
    let mut program = clerk_mailed(&runtime, &path).await;
    let blocked = next_delivery(&mut program).await;
    assert!(
        blocked.text.contains("is blocked: config_error"),
        "{}",
        blocked.text
    );
    std::fs::write(
        &config,
        format!(
            "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nkey = \"test-key-openai-0123456789\"\nbase_url = \"{}\"\n",
            fake.base_url("openai")
        ),
    )
    .unwrap();
    let mut texts = Vec::new();
    while texts.last().map(String::as_str) != Some("served") {
        texts.push(next_delivery(&mut program).await.text);
    }
    assert!(texts[0].contains("again after"), "{texts:?}");
    program.stop("done");
    program.join().await.unwrap();
}
