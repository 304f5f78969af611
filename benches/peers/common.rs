//! What the two Rust clients of the peers benchmark share: the bench contract's arguments, the
//! task's constants, the fake server's request counter, the process's CPU time and the JSON line.
//! Mirrors `py/common.py` and `node/common.mjs` of bench-peers field by field.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub const PROMPT: &str = "What is 2+3? Use the add tool.";
pub const INSTRUCTIONS: &str = "You are a calculator. Always use the add tool for arithmetic.";
pub const MODEL: &str = "fake-model";

/// `T [--concurrent C] [--warmup N] [--port P]`; the port defaults to `$FAKE_PORT`, then 8765.
pub struct Args {
    pub turns: usize,
    pub concurrent: usize,
    pub warmup: usize,
    pub port: u16,
}

impl Args {
    pub fn parse() -> Args {
        let mut args = Args {
            turns: 300,
            concurrent: 0,
            warmup: 5,
            port: std::env::var("FAKE_PORT")
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or(8765),
        };
        let mut it = std::env::args().skip(1);
        while let Some(a) = it.next() {
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (a.clone(), None),
            };
            let mut value = |name: &str| -> usize {
                let v = inline.clone().or_else(|| it.next()).unwrap_or_else(|| {
                    usage(&format!("{name} needs a value"));
                });
                v.parse()
                    .unwrap_or_else(|_| usage(&format!("{name}: not a number: {v}")))
            };
            match flag.as_str() {
                "--concurrent" => args.concurrent = value("--concurrent"),
                "--warmup" => args.warmup = value("--warmup"),
                "--port" => args.port = value("--port") as u16,
                "-h" | "--help" => usage(""),
                s if !s.starts_with('-') => {
                    args.turns = s
                        .parse()
                        .unwrap_or_else(|_| usage(&format!("turns: not a number: {s}")))
                }
                s => usage(&format!("unknown option {s}")),
            }
        }
        args
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("{problem}");
    }
    eprintln!(
        "usage: CLIENT [T] [--concurrent C] [--warmup N] [--port P]   (port also $FAKE_PORT)"
    );
    std::process::exit(2)
}

/// `GET /stats` on the fake server: how many model calls it has answered. Plain `std::net`, so
/// the harness does not warm up (or share) the client's own HTTP stack, as the Node and Python
/// harnesses use node:http and urllib for the same reason.
pub fn server_requests(port: u16) -> u64 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("the fake server is reachable");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    s.write_all(b"GET /stats HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .expect("GET /stats");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("the /stats answer");
    let raw = String::from_utf8_lossy(&raw);
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(body).expect("/stats is JSON");
    v["requests"].as_u64().expect("/stats has requests")
}

#[repr(C)]
struct Timeval {
    tv_sec: i64,
    tv_usec: i64,
}

#[repr(C)]
struct Rusage {
    ru_utime: Timeval,
    ru_stime: Timeval,
    _rest: [i64; 14],
}

unsafe extern "C" {
    fn getrusage(who: i32, usage: *mut Rusage) -> i32;
}

/// The process's user+sys CPU time in seconds, all threads (`getrusage(RUSAGE_SELF)`, as
/// py/common.py does; declared by hand because `libc` is not a direct dependency).
pub fn cpu_seconds() -> f64 {
    let mut ru = Rusage {
        ru_utime: Timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        ru_stime: Timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        _rest: [0; 14],
    };
    // SAFETY: `ru` is a writable struct laid out as Linux's 64-bit `struct rusage`.
    let rc = unsafe { getrusage(0, &mut ru) };
    assert_eq!(rc, 0, "getrusage failed");
    let t = |tv: &Timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(&ru.ru_utime) + t(&ru.ru_stime)
}

/// The version of a crate as locked in the workspace's Cargo.lock.
pub fn locked_version(krate: &str) -> String {
    const LOCK: &str = include_str!("../../Cargo.lock");
    let needle = format!("name = \"{krate}\"\nversion = \"");
    LOCK.find(&needle)
        .and_then(|i| LOCK[i + needle.len()..].split('"').next())
        .unwrap_or("?")
        .to_string()
}

/// What a client measured; `print` writes the bench contract's JSON line.
pub struct Report {
    pub framework: String,
    pub version: String,
    pub args_turns: usize,
    pub concurrent: usize,
    pub warmup: usize,
    pub steps: u64,
    pub wall_s: f64,
    pub cpu_s: f64,
    pub ok_turns: usize,
    pub tool_calls: u64,
    pub import_s: f64,
    /// The first warm-up turn's wall time (None without warm-up).
    pub first_turn_s: Option<f64>,
    pub warmup_failures: usize,
    pub first_error: Option<String>,
}

impl Report {
    /// Prints the JSON line; returns the exit code (0 when every turn was ok and made 2 steps).
    pub fn print(self) -> i32 {
        let r1 = |x: f64| (x * 10.0).round() / 10.0;
        let r4 = |x: f64| (x * 1e4).round() / 1e4;
        let per_step = |x: f64| (self.steps > 0).then(|| r1(x / self.steps as f64 * 1e6));
        // As in common.py: without warm-up, a single timed turn is the first turn.
        let first_turn_s = if self.warmup == 0 {
            (self.args_turns == 1).then_some(self.wall_s)
        } else {
            self.first_turn_s
        };
        let out = serde_json::json!({
            "framework": self.framework,
            "version": self.version,
            "mode": if self.concurrent > 1 { "concurrent" } else { "sequential" },
            "concurrency": self.concurrent.max(1),
            "turns": self.args_turns,
            "steps": self.steps,
            "wall_s": r4(self.wall_s),
            "per_step_us": per_step(self.wall_s),
            "cpu_s": r4(self.cpu_s),
            "cpu_per_step_us": per_step(self.cpu_s),
            "ok_turns": self.ok_turns,
            "failed_turns": self.args_turns - self.ok_turns,
            "tool_calls": self.tool_calls,
            "import_s": r4(self.import_s),
            "first_turn_s": first_turn_s.map(r4),
            "warmup_failures": self.warmup_failures,
            "first_error": self.first_error,
        });
        println!("{out}");
        if self.ok_turns == self.args_turns && self.steps == 2 * self.args_turns as u64 {
            0
        } else {
            1
        }
    }
}
