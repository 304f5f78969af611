//! `with_retries`: a step tried again after a transient failure, backing off with full jitter.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::clock::{Clock, TokioClock};
use super::{Infer, OnText, StepResult};
use crate::providers::{Endpoint, ProviderError};
use crate::vocab::InferRequest;

/// How `with_retries` backs off. The defaults: 6 attempts from 2000 ms, capped at 60 s.
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
/// Streaming: an attempt that failed after streaming some text is not tried again (its error is
/// returned): the retry's text would follow from the start, and a person reading the stream saw
/// the same words twice with no sign of the restart (`colony ask` does the same).
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
    async fn step<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        mut on_text: OnText<'a>,
    ) -> StepResult {
        let attempts = self.policy.attempts.max(1);
        let mut failed = 0;
        loop {
            let mut streamed = false;
            let answer = match on_text.as_mut() {
                None => self.inner.step(req, ep, None).await,
                Some(to) => {
                    let mut marked = |text: &str| {
                        streamed |= !text.is_empty();
                        to(text)
                    };
                    self.inner.step(req, ep, Some(&mut marked)).await
                }
            };
            let err = match answer {
                Ok(inferred) => return Ok(inferred),
                Err(e) => e,
            };
            failed += 1;
            if !err.is_transient() || failed >= attempts || streamed {
                return Err(err);
            }
            let wait = self.wait(failed, &err);
            retrying(failed, attempts, wait, &err);
            self.clock.sleep(wait).await;
        }
    }
}

/// Says that a call waits to be tried again. At the default level, at most once every
/// [`SaidEvery::PERIOD`](crate::said::SaidEvery::PERIOD) for the process: waits reach a minute
/// by default, and a program that said nothing through five of them looked hung; during an
/// outage every caller retries, and one line each would fill the log. Every retry at `debug`.
fn retrying(failed: u32, attempts: u32, wait: Duration, err: &ProviderError) {
    static SAID: crate::said::SaidEvery = crate::said::SaidEvery::new();
    tracing::debug!(
        attempt = failed,
        wait_ms = wait.as_millis() as u64,
        kind = err.kind(),
        error = %err,
        "retrying after a transient failure"
    );
    if let Some(unsaid) = SAID.say() {
        tracing::warn!(
            "a model call failed ({err}); trying again in {:.1} s, attempt {} of \
             {attempts}{}",
            wait.as_secs_f64(),
            failed + 1,
            crate::said::also(unsaid)
        );
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

#[cfg(test)]
mod tests;
