//! Middleware: layers that serve one inference step around the provider (DESIGN §1, §5).
//!
//! A resident *performs* a step ("infer this request at this endpoint") and a stack of layers
//! *serves* it: `with_retries` inside `with_breaker` inside `with_context`. Each layer is an
//! [`Infer`] wrapping an inner [`Infer`], so the stack is plain composition:
//!
//! ```ignore
//! let stack = Breaker::new(Retries::new(core));   // one breaker step = one retried call
//! let inferred = stack.infer(&req, &ep, None).await;
//! ```
//!
//! Outcomes are values: a layer answers `Ok(Inferred)` or `Err(ProviderError)` and never panics
//! or throws; each loop decides at its own call site what a failure means. A step the breaker
//! refuses is an ordinary transient [`ProviderError::Provider`] whose message starts with
//! [`CIRCUIT_OPEN`] (see [`is_circuit_open`]) and whose `retry_after` says when the next probe is
//! due, so callers that only know `ProviderError` still do the right thing.
//!
//! Time goes through a [`Clock`] so the layers can be tested deterministically without sleeping
//! and without tokio's `test-util` feature (which this crate does not enable): [`TokioClock`] in
//! production, [`ManualClock`] in tests.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::core::Core;
use crate::providers::{Endpoint, ProviderError};
use crate::vocab::{InferRequest, Inferred};

// ---------------------------------------------------------------------------------------------
// Serving one step
// ---------------------------------------------------------------------------------------------

/// The streaming hook of a step: each text delta as it arrives. `None` fetches the whole answer.
pub type OnText<'a> = Option<&'a mut (dyn FnMut(&str) + Send)>;

/// What a step answers: the model's reply, or why there is none.
pub type StepResult = Result<Inferred, ProviderError>;

/// Serves one inference step. [`Core`] is the innermost implementation (it reaches the provider);
/// the layers in this module wrap another `Infer`; tests use a scripted fake.
///
/// The returned future is `Send` because residents run on the multi-thread runtime.
pub trait Infer: Send + Sync {
    fn infer<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> impl Future<Output = StepResult> + Send + 'a;
}

impl Infer for Core {
    fn infer<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> impl Future<Output = StepResult> + Send + 'a {
        Core::infer(self, req, ep, on_text)
    }
}

/// The object-safe form of [`Infer`], for stacks chosen at run time (middleware installed on the
/// route or per AI from Lua): every `Infer` is one, and [`SharedInfer`] is an `Infer` again.
pub trait DynInfer: Send + Sync {
    fn infer_boxed<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> BoxFuture<'a, StepResult>;
}

impl<T: Infer> DynInfer for T {
    fn infer_boxed<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> BoxFuture<'a, StepResult> {
        Box::pin(self.infer(req, ep, on_text))
    }
}

/// A shared, type-erased stack: what a route hands each resident.
pub type SharedInfer = Arc<dyn DynInfer>;

impl Infer for SharedInfer {
    fn infer<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> impl Future<Output = StepResult> + Send + 'a {
        (**self).infer_boxed(req, ep, on_text)
    }
}

/// Lends the streaming hook to one attempt and gets it back afterwards.
fn reborrow<'b>(on_text: &'b mut OnText<'_>) -> OnText<'b> {
    match on_text {
        Some(f) => Some(&mut **f),
        None => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Time
// ---------------------------------------------------------------------------------------------

/// Where the layers read the time and how they wait. Times are wall-clock milliseconds since the
/// Unix epoch so that a saved [`BreakerState`] still means something after a restart.
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

/// A poisoned lock here only means a callback panicked; the state it guards is still whole.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------------
// with_retries
// ---------------------------------------------------------------------------------------------

/// How `with_retries` backs off. DESIGN §5: 6 attempts from 2000 ms, capped at 60 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Calls in all, the first included (6 = one call and up to five retries). 0 counts as 1.
    pub attempts: u32,
    /// The ceiling of the first wait; each later ceiling doubles.
    pub base: Duration,
    /// No wait is longer, not even one a provider asks for.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            attempts: 6,
            base: Duration::from_millis(2000),
            cap: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The longest wait after the `failed`-th failed attempt (1-based): `min(cap, base * 2^(failed-1))`.
    pub fn ceiling(&self, failed: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failed.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// `with_retries`: calls the inner step again after a transient failure
/// ([`ProviderError::is_transient`]), backing off exponentially with **full jitter**: the wait
/// after the n-th failure is uniform in `[0, min(cap, base * 2^(n-1))]`. Full jitter (rather than
/// decorrelated) because it spreads many residents hitting the same overloaded provider the most
/// evenly and keeps each wait bounded by a ceiling that is easy to state and test.
///
/// A provider's `retry_after` is a floor: the wait is at least that long (capped at `cap`).
/// A non-transient error is returned at once; after `attempts` calls the last error is returned.
///
/// Streaming: `on_text` is lent to every attempt, so text an attempt streamed before failing is
/// followed by the retry's text from the start. A caller that streams to a person should mark the
/// restart (or not stream through retries).
pub struct Retries<I> {
    inner: I,
    policy: RetryPolicy,
    clock: Arc<dyn Clock>,
    rng: SplitMix,
}

impl<I: Infer> Retries<I> {
    pub fn new(inner: I) -> Retries<I> {
        Retries {
            inner,
            policy: RetryPolicy::default(),
            clock: Arc::new(TokioClock::new()),
            rng: SplitMix::seeded(),
        }
    }

    pub fn with_policy(mut self, policy: RetryPolicy) -> Retries<I> {
        self.policy = policy;
        self
    }

    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Retries<I> {
        self.clock = clock;
        self
    }

    /// Fixes the jitter sequence (tests, reproducible runs).
    pub fn with_seed(mut self, seed: u64) -> Retries<I> {
        self.rng = SplitMix::new(seed);
        self
    }

    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    pub fn inner(&self) -> &I {
        &self.inner
    }

    /// The wait after the `failed`-th failure with error `err`.
    fn wait(&self, failed: u32, err: &ProviderError) -> Duration {
        let ceiling = self.policy.ceiling(failed);
        let jittered = ceiling.mul_f64(self.rng.next_unit());
        let floor = err.retry_after().unwrap_or_default().min(self.policy.cap);
        jittered.max(floor)
    }
}

impl<I: Infer> Infer for Retries<I> {
    async fn infer<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        mut on_text: OnText<'a>,
    ) -> StepResult {
        let attempts = self.policy.attempts.max(1);
        let mut failed = 0;
        loop {
            let err = match self.inner.infer(req, ep, reborrow(&mut on_text)).await {
                Ok(inferred) => return Ok(inferred),
                Err(e) => e,
            };
            failed += 1;
            if !err.is_transient() || failed >= attempts {
                return Err(err);
            }
            let wait = self.wait(failed, &err);
            tracing::debug!(
                attempt = failed,
                wait_ms = wait.as_millis() as u64,
                kind = err.kind(),
                error = %err,
                "retrying after a transient failure"
            );
            self.clock.sleep(wait).await;
        }
    }
}

/// A tiny lock-free PRNG (SplitMix64) for jitter: the crate has no direct `rand` dependency and
/// jitter needs spread, not cryptographic strength. Each layer seeds its own from the wall clock
/// and a process-wide counter, so two layers made in the same instant still differ.
struct SplitMix(AtomicU64);

impl SplitMix {
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    fn new(seed: u64) -> SplitMix {
        SplitMix(AtomicU64::new(seed))
    }

    fn seeded() -> SplitMix {
        static LAYERS: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let n = LAYERS.fetch_add(1, Ordering::Relaxed);
        SplitMix::new(nanos ^ n.wrapping_mul(Self::GAMMA).rotate_left(17))
    }

    fn next_u64(&self) -> u64 {
        let mut z = self
            .0
            .fetch_add(Self::GAMMA, Ordering::Relaxed)
            .wrapping_add(Self::GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1]`.
    fn next_unit(&self) -> f64 {
        (self.next_u64() >> 11) as f64 / ((1u64 << 53) - 1) as f64
    }
}

// ---------------------------------------------------------------------------------------------
// with_breaker
// ---------------------------------------------------------------------------------------------

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerStatus {
    /// Steps go through; consecutive failures are counted.
    Closed,
    /// Steps are refused until the next probe is due.
    Open,
    /// One probe step is testing for recovery; others are refused.
    HalfOpen,
}

impl BreakerStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerStatus::Closed => "closed",
            BreakerStatus::Open => "open",
            BreakerStatus::HalfOpen => "half_open",
        }
    }
}

/// Everything a breaker needs to carry on after a restart; what the store keeps at `ai/breaker`.
/// Times are wall-clock milliseconds since the Unix epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakerState {
    pub status: BreakerStatus,
    /// Consecutive failed steps (probes included) since the last success.
    pub failures: u32,
    /// The message of the most recent failure; kept after closing, for the recovery notice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When open: when the next probe may go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_probe_ms: Option<u64>,
    /// The wait before the probe after the next failed one (first_probe, doubling up to max_probe).
    pub probe_interval_ms: u64,
    /// When the status last changed.
    pub since_ms: u64,
}

impl BreakerState {
    pub fn closed(policy: &BreakerPolicy, now_ms: u64) -> BreakerState {
        BreakerState {
            status: BreakerStatus::Closed,
            failures: 0,
            last_error: None,
            next_probe_ms: None,
            probe_interval_ms: policy.first_probe.as_millis() as u64,
            since_ms: now_ms,
        }
    }
}

/// What `on_transition` is told besides the two statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitionInfo {
    /// Consecutive failed steps so far (0 once closed).
    pub failures: u32,
    pub last_error: Option<String>,
    /// When open: when the next probe may go (wall-clock ms), and how long that is from now.
    pub next_probe_ms: Option<u64>,
    pub next_probe_in: Option<Duration>,
    /// When the transition happened (wall-clock ms).
    pub at_ms: u64,
}

/// Called on each change of state and nowhere else, in order, under the breaker's lock: keep it
/// short and do not call back into the breaker (post a message instead).
pub type OnTransition = Box<dyn Fn(BreakerStatus, BreakerStatus, &TransitionInfo) + Send + Sync>;

/// Where a breaker's state lives. The in-memory [`MemoryBreakerStore`] forgets on exit; the
/// durable store (a later issue) keeps it at `ai/breaker`. `save` is called on every transition;
/// a store that cannot write should log and carry on: the breaker keeps working from memory.
pub trait BreakerStore: Send + Sync {
    fn load(&self) -> Option<BreakerState>;
    fn save(&self, state: &BreakerState);
}

#[derive(Debug, Default)]
pub struct MemoryBreakerStore(Mutex<Option<BreakerState>>);

impl MemoryBreakerStore {
    pub fn new() -> Arc<MemoryBreakerStore> {
        Arc::new(MemoryBreakerStore::default())
    }
}

impl BreakerStore for MemoryBreakerStore {
    fn load(&self) -> Option<BreakerState> {
        lock(&self.0).clone()
    }

    fn save(&self, state: &BreakerState) {
        *lock(&self.0) = Some(state.clone());
    }
}

/// When a breaker trips and how it probes. DESIGN §5: three consecutive failed steps open it; the
/// first probe goes at once, then after 30 s, doubling up to 10 min.
#[derive(Debug, Clone, Copy)]
pub struct BreakerPolicy {
    pub threshold: u32,
    /// The wait after the first failed probe (the first probe itself goes at once).
    pub first_probe: Duration,
    pub max_probe: Duration,
    /// Which errors count as a failed step. The default counts only transient ones
    /// ([`ProviderError::is_transient`]): a refused request (400, bad key, missing config) says the
    /// request or the settings are wrong, not that the provider is down, and it proves the
    /// provider answered, so it counts as a success (resets the count, closes on a probe).
    pub trips: fn(&ProviderError) -> bool,
}

impl Default for BreakerPolicy {
    fn default() -> BreakerPolicy {
        BreakerPolicy {
            threshold: 3,
            first_probe: Duration::from_secs(30),
            max_probe: Duration::from_secs(600),
            trips: ProviderError::is_transient,
        }
    }
}

/// The message prefix of a step refused by an open breaker.
pub const CIRCUIT_OPEN: &str = "circuit open";

/// Whether `err` is a breaker's refusal rather than a provider's answer: the step never left.
pub fn is_circuit_open(err: &ProviderError) -> bool {
    matches!(err, ProviderError::Provider { status: None, message, .. } if message.starts_with(CIRCUIT_OPEN))
}

/// `with_breaker`: stops calling a provider that keeps failing, and tests now and then whether it
/// has come back. One breaker step is one call of the inner (with `with_retries` inside, one
/// retried call), so it opens only after three steps each exhausted their retries.
///
/// - **Closed**: steps go through. `threshold` consecutive failed steps open it.
/// - **Open**: steps are refused at once without calling the inner, with a transient
///   [`ProviderError::Provider`] (see [`is_circuit_open`]) whose `retry_after` is the time until
///   the next probe. When a probe is due, one step goes through as the probe (Open → HalfOpen).
///   The first probe is due at once on opening, the next `first_probe` after a failed one, each
///   later wait doubling up to `max_probe`.
/// - **HalfOpen**: the probe is in flight; other steps are refused. A successful probe closes it;
///   a failed one reopens it with the longer wait.
///
/// Only a probe's outcome moves an open breaker: a step admitted while closed that fails after
/// the breaker opened is not counted again (the outage is already known), nor does its success
/// close it (the probe schedule decides). A probe whose future is dropped (the resident was
/// cancelled) leaves the breaker half-open with no probe in flight, so the next step probes.
pub struct Breaker<I> {
    inner: I,
    policy: BreakerPolicy,
    clock: Arc<dyn Clock>,
    store: Arc<dyn BreakerStore>,
    on_transition: Option<OnTransition>,
    state: Mutex<Live>,
}

struct Live {
    state: BreakerState,
    probing: bool,
}

enum Admit {
    Pass,
    Probe,
}

impl<I: Infer> Breaker<I> {
    /// A closed breaker with the default policy, an in-memory store and the tokio clock.
    pub fn new(inner: I) -> Breaker<I> {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        let policy = BreakerPolicy::default();
        let state = BreakerState::closed(&policy, clock.now_ms());
        Breaker {
            inner,
            policy,
            clock,
            store: MemoryBreakerStore::new(),
            on_transition: None,
            state: Mutex::new(Live {
                state,
                probing: false,
            }),
        }
    }

    pub fn with_policy(mut self, policy: BreakerPolicy) -> Breaker<I> {
        self.policy = policy;
        let live = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if live.state.status == BreakerStatus::Closed && live.state.failures == 0 {
            live.state.probe_interval_ms = policy.first_probe.as_millis() as u64;
        }
        self
    }

    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Breaker<I> {
        let live = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if live.state.status == BreakerStatus::Closed && live.state.failures == 0 {
            live.state.since_ms = clock.now_ms();
        }
        self.clock = clock;
        self
    }

    /// Uses `store` and takes up the state it holds, if any: an open breaker stays open with its
    /// probe schedule. Restoring is not a transition: `on_transition` does not fire.
    pub fn with_store(mut self, store: Arc<dyn BreakerStore>) -> Breaker<I> {
        if let Some(saved) = store.load() {
            *self.state.get_mut().unwrap_or_else(|e| e.into_inner()) = Live {
                state: saved,
                probing: false,
            };
        }
        self.store = store;
        self
    }

    pub fn on_transition(
        mut self,
        f: impl Fn(BreakerStatus, BreakerStatus, &TransitionInfo) + Send + Sync + 'static,
    ) -> Breaker<I> {
        self.on_transition = Some(Box::new(f));
        self
    }

    /// A snapshot of the state (what would be saved).
    pub fn state(&self) -> BreakerState {
        lock(&self.state).state.clone()
    }

    pub fn inner(&self) -> &I {
        &self.inner
    }

    fn admit(&self) -> Result<Admit, ProviderError> {
        let now = self.clock.now_ms();
        let mut live = lock(&self.state);
        match live.state.status {
            BreakerStatus::Closed => Ok(Admit::Pass),
            BreakerStatus::Open => {
                let due = live.state.next_probe_ms.unwrap_or(0);
                if now >= due {
                    live.probing = true;
                    self.transition(&mut live, BreakerStatus::HalfOpen, now);
                    Ok(Admit::Probe)
                } else {
                    Err(self.refusal(&live.state, Duration::from_millis(due - now)))
                }
            }
            BreakerStatus::HalfOpen if !live.probing => {
                // Restored mid-probe, or the last probe was dropped: this step is the probe.
                live.probing = true;
                Ok(Admit::Probe)
            }
            BreakerStatus::HalfOpen => {
                // The probe's outcome is not known yet; if it fails, this is the next wait.
                let wait = Duration::from_millis(live.state.probe_interval_ms);
                Err(self.refusal(&live.state, wait))
            }
        }
    }

    fn refusal(&self, state: &BreakerState, wait: Duration) -> ProviderError {
        let last = state.last_error.as_deref().unwrap_or("unknown error");
        ProviderError::Provider {
            status: None,
            message: format!(
                "{CIRCUIT_OPEN} after {} failed steps (last: {last}); next probe in {:.1} s",
                state.failures,
                wait.as_secs_f64()
            ),
            transient: true,
            retry_after: Some(wait),
        }
    }

    fn settle(&self, result: &StepResult, probe: bool) {
        let now = self.clock.now_ms();
        let failure = match result {
            Err(e) if (self.policy.trips)(e) => Some(e.to_string()),
            _ => None,
        };
        let mut live = lock(&self.state);
        if probe {
            live.probing = false;
            if live.state.status != BreakerStatus::HalfOpen {
                return;
            }
            match failure {
                Some(message) => {
                    let wait = live.state.probe_interval_ms;
                    let s = &mut live.state;
                    s.failures += 1;
                    s.last_error = Some(message);
                    s.next_probe_ms = Some(now + wait);
                    s.probe_interval_ms = (wait * 2).min(self.policy.max_probe.as_millis() as u64);
                    self.transition(&mut live, BreakerStatus::Open, now);
                }
                None => {
                    let s = &mut live.state;
                    s.failures = 0;
                    s.next_probe_ms = None;
                    s.probe_interval_ms = self.policy.first_probe.as_millis() as u64;
                    self.transition(&mut live, BreakerStatus::Closed, now);
                }
            }
            return;
        }
        if live.state.status != BreakerStatus::Closed {
            return;
        }
        match failure {
            Some(message) => {
                let s = &mut live.state;
                s.failures += 1;
                s.last_error = Some(message);
                if s.failures >= self.policy.threshold.max(1) {
                    s.next_probe_ms = Some(now); // the first probe goes at once
                    s.probe_interval_ms = self.policy.first_probe.as_millis() as u64;
                    self.transition(&mut live, BreakerStatus::Open, now);
                }
            }
            None => live.state.failures = 0,
        }
    }

    /// Changes the status, saves, and reports. The one place a status changes.
    fn transition(&self, live: &mut Live, to: BreakerStatus, now: u64) {
        let from = live.state.status;
        if from == to {
            return;
        }
        live.state.status = to;
        live.state.since_ms = now;
        self.store.save(&live.state);
        let s = &live.state;
        let info = TransitionInfo {
            failures: s.failures,
            last_error: s.last_error.clone(),
            next_probe_ms: s.next_probe_ms.filter(|_| to == BreakerStatus::Open),
            next_probe_in: s
                .next_probe_ms
                .filter(|_| to == BreakerStatus::Open)
                .map(|t| Duration::from_millis(t.saturating_sub(now))),
            at_ms: now,
        };
        tracing::info!(
            from = from.as_str(),
            to = to.as_str(),
            failures = info.failures,
            "breaker"
        );
        if let Some(f) = &self.on_transition {
            f(from, to, &info);
        }
    }
}

/// Clears "a probe is in flight" if the probe's future is dropped before it settles.
struct ProbeGuard<'a> {
    live: &'a Mutex<Live>,
    armed: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            lock(self.live).probing = false;
        }
    }
}

impl<I: Infer> Infer for Breaker<I> {
    async fn infer<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> StepResult {
        let probe = matches!(self.admit()?, Admit::Probe);
        let mut guard = ProbeGuard {
            live: &self.state,
            armed: probe,
        };
        let result = self.inner.infer(req, ep, on_text).await;
        guard.armed = false;
        self.settle(&result, probe);
        result
    }
}

// ---------------------------------------------------------------------------------------------
// Context
// ---------------------------------------------------------------------------------------------

/// What `before_step` is asked with: the request about to be sent.
pub type BeforeStep =
    Arc<dyn Fn(&InferRequest) -> BoxFuture<'static, Option<String>> + Send + Sync>;

/// `with_context`: adds context to every step's system prompt: a fixed `system_suffix`, and
/// whatever `before_step` answers for this step (the time, the state of a queue...). Both are
/// appended after the request's own system text, each on a paragraph of its own; the
/// conversation itself is not touched, so nothing of it is stored.
pub struct Context<I> {
    inner: I,
    system_suffix: Option<String>,
    before_step: Option<BeforeStep>,
}

impl<I: Infer> Context<I> {
    pub fn new(inner: I) -> Context<I> {
        Context {
            inner,
            system_suffix: None,
            before_step: None,
        }
    }

    pub fn with_suffix(mut self, suffix: impl Into<String>) -> Context<I> {
        self.system_suffix = Some(suffix.into());
        self
    }

    pub fn with_before_step(mut self, f: BeforeStep) -> Context<I> {
        self.before_step = Some(f);
        self
    }
}

impl<I: Infer> Infer for Context<I> {
    async fn infer<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> StepResult {
        let mut added: Vec<String> = self.system_suffix.iter().cloned().collect();
        if let Some(f) = &self.before_step
            && let Some(text) = f(req).await
            && !text.trim().is_empty()
        {
            added.push(text);
        }
        if added.is_empty() {
            return self.inner.infer(req, ep, on_text).await;
        }
        let mut req = req.clone();
        let mut system = req.system.take().unwrap_or_default();
        for text in added {
            if !system.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(&text);
        }
        req.system = Some(system);
        let mut on_text = on_text;
        self.inner.infer(&req, ep, reborrow(&mut on_text)).await
    }
}

// ---------------------------------------------------------------------------------------------
// A scripted step, for tests
// ---------------------------------------------------------------------------------------------

/// A fake inner step answering from a queue, recording when each call came (by its clock). Once
/// the queue is empty it answers a fatal `Config` error, so a test that calls too often fails
/// loudly. Public for the residents' tests.
pub struct Scripted {
    answers: Mutex<VecDeque<StepResult>>,
    calls: Mutex<Vec<u64>>,
    clock: Arc<dyn Clock>,
}

impl Scripted {
    pub fn new(clock: Arc<dyn Clock>, answers: impl IntoIterator<Item = StepResult>) -> Scripted {
        Scripted {
            answers: Mutex::new(answers.into_iter().collect()),
            calls: Mutex::new(Vec::new()),
            clock,
        }
    }

    pub fn push(&self, answer: StepResult) {
        lock(&self.answers).push_back(answer);
    }

    /// The clock's reading at each call so far.
    pub fn calls(&self) -> Vec<u64> {
        lock(&self.calls).clone()
    }
}

impl Infer for Scripted {
    fn infer<'a>(
        &'a self,
        _req: &'a InferRequest,
        _ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> impl Future<Output = StepResult> + Send + 'a {
        lock(&self.calls).push(self.clock.now_ms());
        let answer = lock(&self.answers).pop_front().unwrap_or_else(|| {
            Err(ProviderError::Config(
                "scripted step: no answer left".into(),
            ))
        });
        if let (Some(f), Ok(inferred)) = (on_text, &answer) {
            f(&inferred.text());
        }
        async move {
            tokio::task::yield_now().await;
            answer
        }
    }
}

#[cfg(test)]
mod tests {
    //! Every test runs on a [`ManualClock`]: waits advance virtual time at once, so the asserted
    //! times are exact virtual readings, not wall time.

    use super::*;
    use crate::providers::ToolsLevel;
    use crate::vocab::{Message, Stop, Style, Usage};

    const T0: u64 = 1_700_000_000_000;

    fn step_args() -> (InferRequest, Endpoint) {
        let req = InferRequest {
            model: "m".into(),
            messages: vec![Message::user("hi")],
            ..Default::default()
        };
        let ep = Endpoint {
            reads: Default::default(),
            provider: "fake".into(),
            style: Style::Replay,
            base_url: String::new(),
            key: None,
            tools_level: ToolsLevel::Native,
            timeout: Duration::from_secs(60),
            max_response_bytes: crate::providers::body::DEFAULT_MAX_RESPONSE_BYTES,
            max_concurrent_calls: crate::providers::DEFAULT_MAX_CONCURRENT_CALLS,
        };
        (req, ep)
    }

    fn ok(text: &str) -> StepResult {
        Ok(Inferred {
            message: Message::assistant(text),
            stop: Stop::EndTurn,
            usage: Usage::default(),
            model: None,
        })
    }

    fn overloaded(message: &str, retry_after: Option<Duration>) -> StepResult {
        Err(ProviderError::Provider {
            status: Some(529),
            message: message.into(),
            transient: true,
            retry_after,
        })
    }

    fn fatal() -> StepResult {
        Err(ProviderError::Auth {
            status: 401,
            message: "invalid key".into(),
        })
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    async fn run(stack: &impl Infer) -> StepResult {
        let (req, ep) = step_args();
        stack.infer(&req, &ep, None).await
    }

    fn retries(clock: &Arc<ManualClock>, answers: Vec<StepResult>) -> Retries<Scripted> {
        Retries::new(Scripted::new(clock.clone(), answers))
            .with_clock(clock.clone())
            .with_seed(7)
    }

    // --- with_retries ---

    #[tokio::test]
    async fn retries_honour_retry_after() {
        let clock = ManualClock::new(T0);
        let r = retries(&clock, vec![overloaded("busy", Some(secs(45))), ok("done")]);
        assert_eq!(run(&r).await.unwrap().text(), "done");
        // Jitter after the first failure is at most 2 s; the provider asked for 45.
        assert_eq!(clock.sleeps(), vec![secs(45)]);
        assert_eq!(r.inner().calls(), vec![T0, T0 + 45_000]);
    }

    /// The same on tokio's own clock, paused: the production [`TokioClock`] waits the provider's
    /// 45 s (not the at most 2 s of jitter) and the test takes no wall time.
    #[tokio::test(start_paused = true)]
    async fn retries_honour_retry_after_on_a_paused_tokio_clock() {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        let r = Retries::new(Scripted::new(
            clock.clone(),
            vec![
                overloaded("busy", Some(secs(45))),
                overloaded("busy", None),
                ok("done"),
            ],
        ))
        .with_seed(7);
        let started = tokio::time::Instant::now();
        assert_eq!(run(&r).await.unwrap().text(), "done");
        let calls = r.inner().calls();
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[1] - calls[0], 45_000);
        // The second wait has no floor: full jitter under the 4 s ceiling.
        assert!(calls[2] - calls[1] <= 4_000, "{calls:?}");
        assert!(started.elapsed() >= secs(45));
    }

    #[tokio::test]
    async fn retry_after_is_capped() {
        let clock = ManualClock::new(T0);
        let r = retries(
            &clock,
            vec![overloaded("busy", Some(secs(100))), ok("done")],
        );
        assert!(run(&r).await.is_ok());
        assert_eq!(clock.sleeps(), vec![secs(60)]);
    }

    #[tokio::test]
    async fn fatal_error_is_returned_at_once() {
        let clock = ManualClock::new(T0);
        let r = retries(&clock, vec![fatal(), ok("never")]);
        let err = run(&r).await.unwrap_err();
        assert_eq!(err.kind(), "auth_error");
        assert_eq!(r.inner().calls().len(), 1);
        assert!(clock.sleeps().is_empty());
        assert_eq!(clock.now_ms(), T0);
    }

    #[tokio::test]
    async fn fatal_after_transient_stops_there() {
        let clock = ManualClock::new(T0);
        let r = retries(&clock, vec![overloaded("busy", None), fatal(), ok("never")]);
        assert_eq!(run(&r).await.unwrap_err().kind(), "auth_error");
        assert_eq!(r.inner().calls().len(), 2);
        assert_eq!(clock.sleeps().len(), 1);
    }

    #[tokio::test]
    async fn gives_up_after_attempts_with_the_last_error() {
        let clock = ManualClock::new(T0);
        let mut answers: Vec<StepResult> = (1..=6)
            .map(|n| overloaded(&format!("busy {n}"), None))
            .collect();
        answers.push(ok("too late"));
        let r = retries(&clock, answers);
        let err = run(&r).await.unwrap_err();
        assert!(err.to_string().contains("busy 6"), "{err}");
        assert_eq!(r.inner().calls().len(), 6);
        assert_eq!(clock.sleeps().len(), 5);
        for (n, wait) in clock.sleeps().iter().enumerate() {
            assert!(*wait <= r.policy().ceiling(n as u32 + 1));
        }
    }

    #[test]
    fn backoff_ceiling_doubles_from_base_and_is_capped() {
        let p = RetryPolicy::default();
        let ceilings: Vec<u64> = (1..=8).map(|n| p.ceiling(n).as_secs()).collect();
        assert_eq!(ceilings, vec![2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(p.ceiling(200), secs(60), "no overflow far out");
    }

    #[test]
    fn backoff_is_full_jitter_under_a_growing_ceiling() {
        let clock = ManualClock::new(T0);
        let r = retries(&clock, vec![]);
        let err = overloaded("busy", None).unwrap_err();
        let mut means = Vec::new();
        for n in 1..=7 {
            let ceiling = r.policy().ceiling(n);
            let waits: Vec<Duration> = (0..400).map(|_| r.wait(n, &err)).collect();
            assert!(
                waits.iter().all(|w| *w <= ceiling),
                "never above the ceiling"
            );
            let max = waits.iter().max().unwrap();
            let min = waits.iter().min().unwrap();
            assert!(*max >= ceiling.mul_f64(0.95), "spreads up to the ceiling");
            assert!(*min <= ceiling.mul_f64(0.05), "spreads down to zero");
            means.push(waits.iter().sum::<Duration>() / 400);
        }
        for n in 1..5 {
            assert!(means[n] > means[n - 1], "grows: {means:?}");
        }
        assert!(means[6] <= secs(60));
    }

    #[tokio::test]
    async fn retries_lend_the_stream_hook_to_each_attempt() {
        let clock = ManualClock::new(T0);
        let r = retries(&clock, vec![overloaded("busy", None), ok("hello")]);
        let (req, ep) = step_args();
        let mut seen = String::new();
        let mut hook = |d: &str| seen.push_str(d);
        r.infer(&req, &ep, Some(&mut hook)).await.unwrap();
        assert_eq!(seen, "hello");
    }

    // --- with_breaker ---

    type Log = Arc<Mutex<Vec<(BreakerStatus, BreakerStatus, TransitionInfo)>>>;

    fn breaker(
        clock: &Arc<ManualClock>,
        store: Arc<dyn BreakerStore>,
        answers: Vec<StepResult>,
    ) -> (Breaker<Scripted>, Log) {
        let log: Log = Arc::default();
        let sink = log.clone();
        let b = Breaker::new(Scripted::new(clock.clone(), answers))
            .with_clock(clock.clone())
            .with_store(store)
            .on_transition(move |from, to, info| lock(&sink).push((from, to, info.clone())));
        (b, log)
    }

    fn moves(log: &Log) -> Vec<(BreakerStatus, BreakerStatus)> {
        lock(log).iter().map(|(f, t, _)| (*f, *t)).collect()
    }

    use BreakerStatus::{Closed, HalfOpen, Open};

    fn failures(n: usize) -> Vec<StepResult> {
        (1..=n)
            .map(|i| overloaded(&format!("down {i}"), None))
            .collect()
    }

    #[tokio::test]
    async fn opens_after_three_consecutive_failures() {
        let clock = ManualClock::new(T0);
        let (b, log) = breaker(&clock, MemoryBreakerStore::new(), failures(3));
        for _ in 0..2 {
            assert!(!is_circuit_open(&run(&b).await.unwrap_err()));
            assert_eq!(b.state().status, Closed);
        }
        run(&b).await.unwrap_err();
        let s = b.state();
        assert_eq!(s.status, Open);
        assert_eq!(s.failures, 3);
        assert_eq!(s.next_probe_ms, Some(T0), "the first probe is due at once");
        assert_eq!(moves(&log), vec![(Closed, Open)]);
        let info = lock(&log)[0].2.clone();
        assert_eq!(info.failures, 3);
        assert!(info.last_error.as_deref().unwrap().contains("down 3"));
        assert_eq!(info.next_probe_in, Some(Duration::ZERO));
    }

    #[tokio::test]
    async fn two_failures_and_a_success_do_not_open() {
        let clock = ManualClock::new(T0);
        let mut answers = failures(2);
        answers.push(ok("fine"));
        answers.extend(failures(2));
        let (b, log) = breaker(&clock, MemoryBreakerStore::new(), answers);
        for _ in 0..5 {
            let _ = run(&b).await;
        }
        assert_eq!(b.state().status, Closed);
        assert_eq!(b.state().failures, 2);
        assert!(moves(&log).is_empty());
    }

    #[tokio::test]
    async fn refused_requests_do_not_trip_it() {
        let clock = ManualClock::new(T0);
        let (b, log) = breaker(
            &clock,
            MemoryBreakerStore::new(),
            vec![fatal(), fatal(), fatal(), fatal()],
        );
        for _ in 0..4 {
            assert_eq!(run(&b).await.unwrap_err().kind(), "auth_error");
        }
        assert_eq!(b.state().status, Closed);
        assert!(moves(&log).is_empty());
    }

    #[tokio::test]
    async fn refuses_while_open_without_calling_the_inner() {
        let clock = ManualClock::new(T0);
        let (b, _log) = breaker(&clock, MemoryBreakerStore::new(), failures(4));
        for _ in 0..4 {
            run(&b).await.unwrap_err(); // three to open, the fourth is the failed first probe
        }
        assert_eq!(b.inner().calls().len(), 4);
        let err = run(&b).await.unwrap_err();
        assert!(is_circuit_open(&err), "{err}");
        assert!(err.is_transient());
        assert_eq!(err.retry_after(), Some(secs(30)));
        assert!(err.to_string().contains("down 4"), "{err}");
        clock.advance(secs(10));
        assert_eq!(run(&b).await.unwrap_err().retry_after(), Some(secs(20)));
        assert_eq!(b.inner().calls().len(), 4, "refusals never reach the inner");
    }

    #[tokio::test]
    async fn probes_at_once_then_after_30s_doubling_to_10_minutes() {
        let clock = ManualClock::new(T0);
        let (b, _log) = breaker(&clock, MemoryBreakerStore::new(), failures(3 + 9));
        for _ in 0..3 {
            run(&b).await.unwrap_err();
        }
        // The first probe goes at once.
        run(&b).await.unwrap_err();
        assert_eq!(b.inner().calls().len(), 4);
        let mut waits = Vec::new();
        for _ in 0..8 {
            let s = b.state();
            assert_eq!(s.status, Open);
            let wait = s.next_probe_ms.unwrap() - clock.now_ms();
            waits.push(wait / 1000);
            let before = b.inner().calls().len();
            clock.advance(Duration::from_millis(wait - 1));
            assert!(is_circuit_open(&run(&b).await.unwrap_err()), "not due yet");
            assert_eq!(b.inner().calls().len(), before);
            clock.advance(Duration::from_millis(1));
            let err = run(&b).await.unwrap_err();
            assert!(!is_circuit_open(&err), "the probe went: {err}");
            assert_eq!(b.inner().calls().len(), before + 1);
        }
        assert_eq!(waits, vec![30, 60, 120, 240, 480, 600, 600, 600]);
    }

    #[tokio::test]
    async fn closes_on_a_successful_probe_reporting_each_transition_once() {
        let clock = ManualClock::new(T0);
        let mut answers = failures(4);
        answers.push(ok("back"));
        answers.push(overloaded("once more", None));
        let (b, log) = breaker(&clock, MemoryBreakerStore::new(), answers);
        for _ in 0..4 {
            run(&b).await.unwrap_err();
        }
        assert!(is_circuit_open(&run(&b).await.unwrap_err()));
        clock.advance(secs(30));
        assert_eq!(run(&b).await.unwrap().text(), "back");
        let s = b.state();
        assert_eq!((s.status, s.failures, s.next_probe_ms), (Closed, 0, None));
        assert_eq!(
            moves(&log),
            vec![
                (Closed, Open),
                (Open, HalfOpen),
                (HalfOpen, Open),
                (Open, HalfOpen),
                (HalfOpen, Closed),
            ]
        );
        let reopened = lock(&log)[2].2.clone();
        assert_eq!(reopened.failures, 4);
        assert_eq!(reopened.next_probe_in, Some(secs(30)));
        assert_eq!(reopened.next_probe_ms, Some(T0 + 30_000));
        // Closed again: one failure is counted from zero, and the schedule starts over.
        run(&b).await.unwrap_err();
        assert_eq!(b.state().status, Closed);
        assert_eq!(b.state().failures, 1);
        assert_eq!(b.state().probe_interval_ms, 30_000);
        assert_eq!(lock(&log).len(), 5);
    }

    /// An inner whose answer waits for a signal, to hold a probe in flight.
    struct Gated {
        gate: tokio::sync::Notify,
        inner: Scripted,
    }

    impl Infer for Gated {
        async fn infer<'a>(
            &'a self,
            req: &'a InferRequest,
            ep: &'a Endpoint,
            on_text: OnText<'a>,
        ) -> StepResult {
            self.gate.notified().await;
            self.inner.infer(req, ep, on_text).await
        }
    }

    fn gated_breaker(clock: &Arc<ManualClock>, answers: Vec<StepResult>) -> Breaker<Gated> {
        Breaker::new(Gated {
            gate: tokio::sync::Notify::new(),
            inner: Scripted::new(clock.clone(), answers),
        })
        .with_clock(clock.clone())
    }

    async fn open_it(b: &Breaker<Gated>) {
        for _ in 0..3 {
            let (req, ep) = step_args();
            let step = b.infer(&req, &ep, None);
            tokio::pin!(step);
            assert!(futures::poll!(&mut step).is_pending());
            b.inner().gate.notify_one();
            step.await.unwrap_err();
        }
        assert_eq!(b.state().status, Open);
    }

    #[tokio::test]
    async fn one_probe_at_a_time() {
        let clock = ManualClock::new(T0);
        let mut answers = failures(3);
        answers.push(ok("back"));
        let b = gated_breaker(&clock, answers);
        open_it(&b).await;
        let (req, ep) = step_args();
        let probe = b.infer(&req, &ep, None);
        tokio::pin!(probe);
        assert!(futures::poll!(&mut probe).is_pending());
        assert_eq!(b.state().status, HalfOpen);
        let other = run(&b).await.unwrap_err();
        assert!(is_circuit_open(&other), "{other}");
        assert_eq!(other.retry_after(), Some(secs(30)));
        b.inner().gate.notify_one();
        assert_eq!(probe.await.unwrap().text(), "back");
        assert_eq!(b.state().status, Closed);
    }

    #[tokio::test]
    async fn a_dropped_probe_lets_the_next_step_probe() {
        let clock = ManualClock::new(T0);
        let mut answers = failures(3);
        answers.push(ok("back"));
        let b = gated_breaker(&clock, answers);
        open_it(&b).await;
        {
            let (req, ep) = step_args();
            let probe = b.infer(&req, &ep, None);
            tokio::pin!(probe);
            assert!(futures::poll!(&mut probe).is_pending());
        } // dropped: the resident was cancelled mid-probe
        assert_eq!(b.state().status, HalfOpen);
        let (req, ep) = step_args();
        let probe = b.infer(&req, &ep, None);
        tokio::pin!(probe);
        assert!(
            futures::poll!(&mut probe).is_pending(),
            "went through as the probe"
        );
        b.inner().gate.notify_one();
        assert!(probe.await.is_ok());
        assert_eq!(b.state().status, Closed);
    }

    /// Counts saves, to check there is one per transition and no more.
    #[derive(Default)]
    struct CountingStore {
        saves: Mutex<Vec<BreakerState>>,
    }

    impl BreakerStore for CountingStore {
        fn load(&self) -> Option<BreakerState> {
            lock(&self.saves).last().cloned()
        }
        fn save(&self, state: &BreakerState) {
            lock(&self.saves).push(state.clone());
        }
    }

    #[tokio::test]
    async fn state_is_saved_on_each_transition_and_restored() {
        let clock = ManualClock::new(T0);
        let store = Arc::new(CountingStore::default());
        let (b, log) = breaker(&clock, store.clone(), failures(5));
        for _ in 0..4 {
            run(&b).await.unwrap_err();
        }
        let _ = run(&b).await; // refused: no transition, no save
        let saved: Vec<BreakerStatus> = lock(&store.saves).iter().map(|s| s.status).collect();
        assert_eq!(saved, vec![Open, HalfOpen, Open]);
        assert_eq!(lock(&log).len(), 3);
        assert_eq!(store.load().unwrap(), b.state());
        drop(b);

        // A restart: a new breaker on the same store is still open, on the same schedule.
        clock.advance(secs(10));
        let (b2, log2) = breaker(&clock, store.clone(), failures(1));
        assert_eq!(b2.state().status, Open);
        let err = run(&b2).await.unwrap_err();
        assert!(is_circuit_open(&err));
        assert_eq!(err.retry_after(), Some(secs(20)));
        assert!(b2.inner().calls().is_empty());
        clock.advance(secs(20));
        run(&b2).await.unwrap_err(); // the probe, failed
        let s = b2.state();
        assert_eq!((s.status, s.failures), (Open, 5));
        assert_eq!(
            s.next_probe_ms,
            Some(clock.now_ms() + 60_000),
            "the wait doubled"
        );
        assert_eq!(
            moves(&log2),
            vec![(Open, HalfOpen), (HalfOpen, Open)],
            "restoring is no transition"
        );
    }

    #[tokio::test]
    async fn restored_half_open_probes_with_the_next_step() {
        let clock = ManualClock::new(T0);
        let store = MemoryBreakerStore::new();
        let policy = BreakerPolicy::default();
        store.save(&BreakerState {
            status: HalfOpen,
            failures: 3,
            last_error: Some("down".into()),
            next_probe_ms: Some(T0),
            probe_interval_ms: 30_000,
            since_ms: T0,
        });
        let (b, log) = breaker(&clock, store, vec![ok("back")]);
        assert_eq!(
            b.state().probe_interval_ms,
            policy.first_probe.as_millis() as u64
        );
        assert!(run(&b).await.is_ok());
        assert_eq!(moves(&log), vec![(HalfOpen, Closed)]);
    }

    #[test]
    fn breaker_state_serialises_with_wall_clock_millis() {
        let s = BreakerState {
            status: HalfOpen,
            failures: 4,
            last_error: Some("overloaded".into()),
            next_probe_ms: Some(T0 + 30_000),
            probe_interval_ms: 60_000,
            since_ms: T0,
        };
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["status"], "half_open");
        assert_eq!(json["next_probe_ms"], T0 + 30_000);
        let back: BreakerState = serde_json::from_value(json).unwrap();
        assert_eq!(back, s);
    }

    // --- composition ---

    #[tokio::test]
    async fn retries_inside_the_breaker_one_step_is_one_retried_call() {
        let clock = ManualClock::new(T0);
        let log: Log = Arc::default();
        let sink = log.clone();
        let stack = Breaker::new(
            Retries::new(Scripted::new(clock.clone(), failures(18)))
                .with_clock(clock.clone())
                .with_seed(1),
        )
        .with_clock(clock.clone())
        .on_transition(move |f, t, i| lock(&sink).push((f, t, i.clone())));
        for step in 1..=3 {
            run(&stack).await.unwrap_err();
            assert_eq!(stack.inner().inner().calls().len(), 6 * step);
        }
        assert_eq!(moves(&log), vec![(Closed, Open)]);
        assert_eq!(clock.sleeps().len(), 15);

        // Type-erased, as a route would hold it: refusals still come back as values.
        let shared: SharedInfer = Arc::new(stack);
        clock.advance(secs(1));
        let probe = shared.infer(&step_args().0, &step_args().1, None).await;
        assert_eq!(
            probe.unwrap_err().kind(),
            "config_error",
            "script exhausted"
        );
    }
}
