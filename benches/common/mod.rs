//! What the residents and store benches share: a runtime that counts its parked workers, a
//! core that needs no key, waiting for the runtime to go quiet, and the machine's figures.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use colony::config::Config;
use colony::core::Core;
use colony::providers::Providers;
use colony::providers::replay::Cassette;
use tokio::runtime::Runtime;

/// A multi-thread runtime that counts its parked workers (tokio's park/unpark hooks).
pub struct Rt {
    pub rt: Runtime,
    pub parked: Arc<AtomicUsize>,
}

impl std::ops::Deref for Rt {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        &self.rt
    }
}

pub fn runtime() -> Rt {
    let parked = Arc::new(AtomicUsize::new(0));
    let (on_park, on_unpark) = (parked.clone(), parked.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(move || {
            on_park.fetch_add(1, Ordering::SeqCst);
        })
        .on_thread_unpark(move || {
            on_unpark.fetch_sub(1, Ordering::SeqCst);
        })
        .build()
        .expect("a tokio runtime");
    Rt { rt, parked }
}

/// A core whose settings resolve without a key: a replaying one, on an empty cassette that is
/// never asked (the bench's `Infer` answers instead of the providers).
pub fn core(rt: &Rt) -> Core {
    let file = tempfile::NamedTempFile::new().expect("a temp file");
    let cassette = Cassette::load(file.path()).expect("an empty cassette");
    Core::new(
        Config::default(),
        Providers::new(Some(Arc::new(cassette)), None),
        rt.handle().clone(),
    )
}

/// Waits (on the calling thread, which is no worker) until nothing is queued and every worker
/// has parked, twice in a row: then every spawned or woken task has been polled and is waiting.
pub fn settle(rt: &Rt) {
    let metrics = rt.metrics();
    let workers = metrics.num_workers();
    let quiet = || metrics.global_queue_depth() == 0 && rt.parked.load(Ordering::SeqCst) == workers;
    loop {
        if quiet() {
            std::thread::sleep(Duration::from_micros(200));
            if quiet() {
                return;
            }
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// CPU time (user + system, every thread) this process has used so far; 10 ms resolution.
pub fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after_name = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

/// The one-minute load average: on a machine with other work, the figures mean less.
pub fn load() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// Resident set size of this process, in bytes.
pub fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("a statm line");
    pages * 4096
}

/// A `Deliver::Channel` sender and the task counting what arrives on it (its result once every
/// sender is gone).
pub fn delivery_counter() -> (
    tokio::sync::mpsc::UnboundedSender<colony::residents::Delivery>,
    tokio::task::JoinHandle<u64>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let drained = tokio::spawn(async move {
        let mut n = 0u64;
        while rx.recv().await.is_some() {
            n += 1;
        }
        n
    });
    (tx, drained)
}
