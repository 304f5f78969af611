//! `with_breaker`: the circuit breaker that stops calling a provider that keeps failing, its probe
//! schedule, and where its state is kept so that it outlives a restart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::clock::{Clock, TokioClock};
use super::{Infer, OnText, StepResult, lock};
use crate::providers::{Endpoint, ProviderError};
use crate::vocab::InferRequest;

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

/// Everything a breaker needs to carry on after a restart; what the program's store keeps under
/// the breaker's key ([`super::stack::breaker_key`]). Times are wall-clock milliseconds since the
/// Unix epoch.
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
/// program's store keeps it under the breaker's key (`residents::persist::StoreBreaker`, which the
/// host hands [`super::stack::build`]). `save` is called on every transition; a store that cannot
/// write should log and carry on: the breaker keeps working from memory.
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

/// When a breaker trips and how it probes. The defaults: three consecutive failed steps open it; the
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
        // A call its payer's budget refused never reached the provider: it says nothing of it.
        if let Err(ProviderError::Budget(_)) = result {
            if probe {
                lock(&self.state).probing = false;
            }
            return;
        }
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
        // The count is saved as it changes, not only at a transition: a breaker built anew for
        // each of a script's turns (from the state its store keeps) started every turn at 0
        // failures, and one whose turns failed at their first step never opened.
        match failure {
            Some(message) => {
                let s = &mut live.state;
                s.failures += 1;
                s.last_error = Some(message);
                if s.failures >= self.policy.threshold.max(1) {
                    s.next_probe_ms = Some(now); // the first probe goes at once
                    s.probe_interval_ms = self.policy.first_probe.as_millis() as u64;
                    self.transition(&mut live, BreakerStatus::Open, now);
                } else {
                    self.store.save(&live.state);
                }
            }
            // A success after failures starts the count again (nothing to save otherwise: the
            // usual step costs no write).
            None if live.state.failures > 0 => {
                live.state.failures = 0;
                self.store.save(&live.state);
            }
            None => {}
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
    async fn step<'a>(
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
        let result = self.inner.step(req, ep, on_text).await;
        guard.armed = false;
        self.settle(&result, probe);
        result
    }
}

#[cfg(test)]
mod tests;
