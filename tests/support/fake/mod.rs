//! A fake model provider for integration tests and benchmarks.
//!
//! One local HTTP server speaks the three wire styles colony talks to at once, chosen by path
//! prefix: `base_url("anthropic")`, `base_url("openai")`, `base_url("gemini")`. Model calls are
//! answered from a FIFO script of [`Reply`]s shared across styles, each rendered in the style
//! (and streaming mode) of the request it answers; every request is recorded. An empty script
//! answers HTTP 500 "fake provider: no scripted reply left", so a test that calls the model more
//! often than it planned fails loudly.
//!
//! ```ignore
//! let fake = FakeProvider::start();
//! fake.push(Reply::tool_call("toolu_1", "get_weather", json!({"city": "Paris"})));
//! fake.push(Reply::text("It is sunny."));
//! // point colony at fake.base_url("anthropic") with any key, run, then:
//! assert_eq!(fake.calls(), 2);
//! assert_eq!(fake.last_request().unwrap().body["messages"][2]["role"], "user");
//! ```

mod anthropic;
mod gemini;
mod openai;
mod reply;
mod server;
mod wire;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde_json::Value;

pub use anthropic::MODELS as ANTHROPIC_MODELS;
pub use gemini::MODELS as GEMINI_MODELS;
pub use openai::MODELS as OPENAI_MODELS;
pub use reply::{Call, Reply};

use server::{Shared, State};

/// One request as the fake received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path with query, e.g. `/gemini/v1beta/models/gemini-x:streamGenerateContent?alt=sse`.
    pub path: String,
    /// `anthropic`, `openai`, `gemini`, or empty for a path outside the three.
    pub style: String,
    /// Header names lowercased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The JSON body; `Value::Null` when empty or not JSON.
    pub body: Value,
}

impl Recorded {
    /// The first value of a header (name in any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The running fake. Dropping it stops the server (open connections are cut).
pub struct FakeProvider {
    addr: SocketAddr,
    state: Shared,
    connections: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeProvider {
    /// Starts the server on `127.0.0.1` (a free port) on its own thread and tokio runtime, so it
    /// works from plain `#[test]`s, `#[tokio::test]`s and benches alike. Returns once listening.
    pub fn start() -> FakeProvider {
        let state: Shared = Arc::new(Mutex::new(State::default()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let app = server::router(state.clone());
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = connections.clone();
        let thread = std::thread::Builder::new()
            .name("fake-provider".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("fake provider: tokio runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                        .await
                        .expect("fake provider: bind");
                    ready_tx.send(listener.local_addr().unwrap()).unwrap();
                    let listener = axum::serve::ListenerExt::tap_io(listener, move |_| {
                        accepted.fetch_add(1, Ordering::Relaxed);
                    });
                    let serve = std::future::IntoFuture::into_future(axum::serve(listener, app));
                    tokio::select! {
                        r = serve => r.expect("fake provider: serve"),
                        _ = stop_rx => {}
                    }
                });
                // Dropping the runtime cancels the connection tasks: no graceful wait for
                // clients that keep connections open.
                rt.shutdown_timeout(std::time::Duration::from_secs(1));
            })
            .expect("fake provider: thread");
        let addr = ready_rx
            .recv()
            .expect("fake provider: server did not start");
        FakeProvider {
            addr,
            state,
            connections,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`, the root (for `/stats`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL of one style, as a provider's `base_url` setting would hold it:
    /// `.../anthropic/v1`, `.../openai/v1`, `.../gemini/v1beta`. Panics on another style.
    pub fn base_url(&self, style: &str) -> String {
        let version = match style {
            "anthropic" | "openai" => "v1",
            "gemini" => "v1beta",
            other => panic!("fake provider: unknown style {other:?}"),
        };
        format!("{}/{style}/{version}", self.url())
    }

    /// Queues the answer to a coming model call (FIFO, shared by all styles).
    pub fn push(&self, reply: Reply) {
        self.state().queue.push_back(reply);
    }

    /// Answers every call once the queue is empty (and no responder is set), e.g. for benches.
    pub fn set_default(&self, reply: Reply) {
        self.state().default = Some(reply);
    }

    /// Chooses the answer from the request body and style (`anthropic`, `openai`, `gemini`)
    /// once the queue is empty; takes precedence over the default.
    pub fn set_responder<F>(&self, f: F)
    where
        F: Fn(&Value, &str) -> Reply + Send + Sync + 'static,
    {
        self.state().responder = Some(Arc::new(f));
    }

    /// With `false`, requests without a key header are served instead of answered 401.
    pub fn require_key(&self, on: bool) {
        self.state().require_key = on;
    }

    /// Answers 401 to every request carrying `key` (or a key containing it) in a header;
    /// `None` refuses none.
    pub fn refuse_key(&self, key: Option<&str>) {
        self.state().refused_key = key.map(str::to_string);
    }

    /// Scripted replies not yet taken.
    pub fn pending(&self) -> usize {
        self.state().queue.len()
    }

    /// Model-call requests received (any outcome, 401 and 500 included; model lists are not
    /// calls). Also served as `GET /stats` -> `{"calls": N}`.
    pub fn calls(&self) -> usize {
        self.state().calls
    }

    /// TCP connections the server has accepted so far (each client connection once, however
    /// many requests it carried).
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Every request so far, oldest first (`/stats` excluded).
    pub fn requests(&self) -> Vec<Recorded> {
        self.state().requests.clone()
    }

    pub fn last_request(&self) -> Option<Recorded> {
        self.state().requests.last().cloned()
    }

    /// The requests so far, forgetting them (the call count stays).
    pub fn take_requests(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.state().requests)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panicking responder must not poison every later assertion.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
