//! Where the layers read the time and how they wait, so they can be tested deterministically
//! without sleeping and without tokio's `test-util` feature in the library: [`TokioClock`] in
//! production, [`ManualClock`] in tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;

use super::lock;

/// Where the layers read the time and how they wait. Times are wall-clock milliseconds since the
/// Unix epoch so that a saved [`BreakerState`](super::breaker::BreakerState) still means
/// something after a restart.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> u64;
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()>;
}

/// The production clock: waits with `tokio::time::sleep`; reads the wall clock once, at creation,
/// and advances it by tokio's monotonic clock, so a step never sees time go backwards when the
/// system clock is adjusted (and a paused tokio clock, should `test-util` ever be enabled, drives
/// both reading and waiting).
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    at: tokio::time::Instant,
    wall_ms: u64,
}

impl TokioClock {
    pub fn new() -> TokioClock {
        TokioClock {
            at: tokio::time::Instant::now(),
            wall_ms: wall_now_ms(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> TokioClock {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.wall_ms + self.at.elapsed().as_millis() as u64
    }

    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(d))
    }
}

fn wall_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A virtual clock for tests: `sleep` advances it at once by the requested amount (and records the
/// wait), so a test of a 10-minute schedule runs in microseconds and asserts exact virtual times.
/// Public so the residents' own tests (and integration tests) can drive middleware the same way.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_us: AtomicU64,
    sleeps: Mutex<Vec<Duration>>,
}

impl ManualClock {
    /// Starts at `start_ms` (wall-clock milliseconds since the epoch).
    pub fn new(start_ms: u64) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            now_us: AtomicU64::new(start_ms * 1000),
            sleeps: Mutex::new(Vec::new()),
        })
    }

    /// Moves time forward without anyone sleeping (time passing between steps).
    pub fn advance(&self, d: Duration) {
        self.now_us
            .fetch_add(d.as_micros() as u64, Ordering::SeqCst);
    }

    /// Every wait asked of this clock so far, in order.
    pub fn sleeps(&self) -> Vec<Duration> {
        lock(&self.sleeps).clone()
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_us.load(Ordering::SeqCst) / 1000
    }

    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        lock(&self.sleeps).push(d);
        self.advance(d);
        Box::pin(tokio::task::yield_now())
    }
}
