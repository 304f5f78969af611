//! Helpers shared by the integration tests (`mod support;`) and the benches
//! (`#[path = "../tests/support/mod.rs"] mod support;`). Every binary uses a subset, hence the
//! `dead_code` allowance; nothing here depends on test-only macros.
#![allow(dead_code, unused_imports)]

pub mod browser;
pub mod fake;
pub mod hostile;
pub mod mcp;
pub mod nats;
pub mod postgres;
pub mod pty;
pub mod script;
pub mod serve;
pub mod transcript;

use serde_json::Value;

/// What SQLite leaves beside the store in the state directory `dir` while it is open (its log,
/// `-wal`, and the log's index, `-shm`): a store that was closed leaves neither.
pub fn left_open(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("the state directory")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with("-wal") || name.ends_with("-shm"))
        .collect()
}

/// Serves `app` on `127.0.0.1` (a free port) on a thread of its own, for the life of the test;
/// returns its root URL (`http://127.0.0.1:PORT`).
pub fn serve(app: axum::Router) -> String {
    let (tx, rx) = std::sync::mpsc::channel::<std::net::SocketAddr>();
    std::thread::Builder::new()
        .name("loopback-server".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("server runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                tx.send(listener.local_addr().unwrap()).unwrap();
                axum::serve(listener, app).await.expect("serve");
            });
        })
        .expect("server thread");
    format!("http://{}", rx.recv().expect("the server started"))
}

/// Sends `signal` (`TERM`, `HUP`, `KILL`) to process `pid` with kill(1).
pub fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Whether process `pid` still runs (a zombie waiting for a parent to reap it does not).
pub fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's name in parentheses.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

/// Waits for `child` to exit, at most a minute; past it the child is killed and the test fails
/// with `why` (a colony that does not end is the defect such a test looks for).
pub fn exits_within_a_minute(
    child: &mut std::process::Child,
    why: &str,
) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().expect("waiting on colony") {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{why}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The three wire styles the fake speaks.
pub const STYLES: [&str; 3] = ["anthropic", "openai", "gemini"];

/// A sandbox whose environment points `style`'s provider at the fake, with a test key.
pub fn styled(fake: &fake::FakeProvider, style: &str) -> script::Sandbox {
    let (key_var, url_var) = match style {
        "anthropic" => ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
        "openai" => ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
        "gemini" => ("GEMINI_API_KEY", "GEMINI_BASE_URL"),
        other => panic!("no style {other}"),
    };
    script::Sandbox::new()
        .env(key_var, &format!("test-key-{style}-0123456789"))
        .env(url_var, &fake.base_url(style))
}

/// The bodies of the model calls the fake saw (model lists excluded).
pub fn model_calls(fake: &fake::FakeProvider) -> Vec<Value> {
    fake.requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.body)
        .collect()
}
