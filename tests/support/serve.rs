//! `colony serve` as a user runs it: the binary on port 0 (its address read from the line it
//! prints on stdout), an HTTP client for its API and a reader of its event stream.

use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::script::Sandbox;

/// How long a test waits for something that should happen at once before it says it did not
/// (a guard against hanging, not a timing assertion).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// One answer: its status, headers and body (JSON when it parses, else `Value::String`).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
    pub json: Value,
}

/// One Server-Sent Event.
#[derive(Debug, Clone)]
pub struct Event {
    pub id: Option<u64>,
    pub kind: String,
    pub data: Value,
}

/// A running `colony serve`.
pub struct Served {
    pub child: Option<Child>,
    pub url: String,
    pub token: Option<String>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
}

impl Served {
    /// `colony serve --listen 127.0.0.1:0 ARGS...`, once it listens.
    pub fn start(sb: &Sandbox, args: &[&str]) -> Served {
        let mut all = vec!["serve", "--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        Served::start_exact(sb, &all)
    }

    /// `colony ARGS...` (a `serve` command line), once it listens.
    pub fn start_exact(sb: &Sandbox, args: &[&str]) -> Served {
        let mut child = sb.spawn(args);
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let mut pipe = child.stderr.take().expect("stderr");
            let stderr = stderr.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    stderr
                        .lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        let (tx, rx) = mpsc::channel::<String>();
        let stdout = Arc::new(Mutex::new(String::new()));
        {
            let pipe = child.stdout.take().expect("stdout");
            let stdout = stdout.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if let Some(addr) = line.strip_prefix("colony serve: listening on ") {
                        let _ = tx.send(addr.to_string());
                    } else {
                        let mut out = stdout.lock().unwrap();
                        out.push_str(&line);
                        out.push('\n');
                    }
                }
            });
        }
        let url = match rx.recv_timeout(PATIENCE) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "colony serve never said where it listens\nstderr:\n{}",
                    stderr.lock().unwrap()
                );
            }
        };
        Served {
            child: Some(child),
            url,
            token: None,
            stdout,
            stderr,
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime"),
            client: reqwest::Client::new(),
        }
    }

    /// The client the helpers use (no token added), for a request they do not make.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.client.request(method, format!("{}{path}", self.url));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Sends `r` and reads the whole answer.
    pub fn send(&self, r: reqwest::RequestBuilder) -> Answer {
        self.rt.block_on(async {
            let res = r.send().await.expect("the service answers");
            let status = res.status().as_u16();
            let headers = res.headers().clone();
            let text = res.text().await.expect("a body");
            let json = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
            Answer {
                status,
                headers,
                text,
                json,
            }
        })
    }

    pub fn get(&self, path: &str) -> Answer {
        self.send(self.request(reqwest::Method::GET, path))
    }

    /// A GET with extra headers (and without the token when `bare`).
    pub fn get_with(&self, path: &str, headers: &[(&str, &str)], bare: bool) -> Answer {
        let mut r = if bare {
            self.client.get(format!("{}{path}", self.url))
        } else {
            self.request(reqwest::Method::GET, path)
        };
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        self.send(r)
    }

    pub fn post(&self, path: &str, body: Value) -> Answer {
        self.send(self.request(reqwest::Method::POST, path).json(&body))
    }

    /// POSTs `body` and answers its status, or the error when the service closed the
    /// connection before the body was sent (as it may once it has refused it).
    pub fn post_status(&self, path: &str, body: Value) -> Result<u16, reqwest::Error> {
        let r = self.request(reqwest::Method::POST, path).json(&body);
        self.rt
            .block_on(async { r.send().await.map(|res| res.status().as_u16()) })
    }

    /// Mails `to` in `program` through the API.
    pub fn mail(&self, program: &str, body: Value) -> Answer {
        self.post(&format!("/api/programs/{program}/mail"), body)
    }

    /// Opens `/api/events` (resuming after `last` when given).
    pub fn events(&self, last: Option<u64>) -> Events {
        let mut r = self.request(reqwest::Method::GET, "/api/events");
        if let Some(id) = last {
            r = r.header("Last-Event-ID", id.to_string());
        }
        self.stream(r)
    }

    /// Sends `r`, a request answered with a stream of events (`/api/events`, an `/mcp`
    /// session's GET), and reads it on the service's runtime; its status must be 200.
    pub fn stream(&self, r: reqwest::RequestBuilder) -> Events {
        let (tx, rx) = mpsc::channel();
        let (opened_tx, opened_rx) = mpsc::channel();
        self.rt.spawn(async move {
            use futures::StreamExt;
            let res = r.send().await.expect("the event stream opens");
            let _ = opened_tx.send(res.status().as_u16());
            let mut body = res.bytes_stream();
            let mut buf = String::new();
            while let Some(Ok(chunk)) = body.next().await {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buf.find("\n\n") {
                    let frame: String = buf.drain(..end + 2).collect();
                    if let Some(e) = parse_frame(&frame)
                        && tx.send(e).is_err()
                    {
                        return;
                    }
                }
            }
        });
        let status = opened_rx
            .recv_timeout(PATIENCE)
            .expect("the event stream opens");
        assert_eq!(status, 200, "the event stream's status");
        Events { rx }
    }

    /// Sends `signal` (`TERM`, `HUP`, `KILL`) to the service.
    pub fn signal(&self, signal: &str) {
        super::signal(self.child.as_ref().expect("running").id(), signal);
    }

    /// Waits for the service to exit; its status code (`None`: killed by a signal).
    pub fn wait(&mut self) -> Option<i32> {
        let mut child = self.child.take().expect("running");
        let (tx, rx) = mpsc::channel();
        let pid = child.id();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait().map(|s| s.code()));
        });
        match rx.recv_timeout(PATIENCE) {
            Ok(status) => status.expect("wait"),
            Err(_) => {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                panic!("colony serve did not exit\nstderr:\n{}", self.stderr());
            }
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn parse_frame(frame: &str) -> Option<Event> {
    let mut id = None;
    let mut kind = String::from("message");
    let mut data = String::new();
    for line in frame.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("event:") {
            kind = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    if data.is_empty() {
        return None;
    }
    Some(Event {
        id,
        kind,
        data: serde_json::from_str(&data).unwrap_or(Value::String(data)),
    })
}

/// An open event stream.
pub struct Events {
    rx: mpsc::Receiver<Event>,
}

impl Events {
    /// The next event that `wanted` accepts (the others it passed are returned beside it).
    #[track_caller]
    pub fn until(&self, what: &str, wanted: impl Fn(&Event) -> bool) -> (Event, Vec<Event>) {
        let deadline = std::time::Instant::now() + PATIENCE;
        let mut passed = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(e) if wanted(&e) => return (e, passed),
                Ok(e) => passed.push(e),
                Err(_) => panic!("no {what} event came; saw {passed:#?}"),
            }
        }
    }

    /// Waits for the stream to end (the service closed it), the events before passed over.
    #[track_caller]
    pub fn ended(&self, what: &str) {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} was still open"),
            }
        }
    }

    /// The next event of type `kind` for `resident`.
    #[track_caller]
    pub fn next_of(&self, kind: &str, resident: &str) -> Event {
        self.until(&format!("{kind} of {resident}"), |e| {
            e.kind == kind && e.data["resident"] == resident
        })
        .0
    }
}

/// Waits until `ready` holds, checking every 10 ms, and panics naming `what` after [`PATIENCE`]:
/// for what the service does asynchronously (a signal heard, a turn ended).
#[track_caller]
pub fn eventually(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while !ready() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
