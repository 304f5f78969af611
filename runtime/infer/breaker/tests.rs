//! `with_breaker` on a [`ManualClock`]: opening, refusing, probing, closing, saving and restoring.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::infer::Infer;
use crate::infer::clock::ManualClock;
use crate::infer::scripted::Scripted;
use crate::infer::tests::{Log, T0, failures, fatal, moves, ok, overloaded, run, secs, step_args};

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

use BreakerStatus::{Closed, HalfOpen, Open};

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
    async fn step<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> StepResult {
        self.gate.notified().await;
        self.inner.step(req, ep, on_text).await
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
        let step = b.step(&req, &ep, None);
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
    let probe = b.step(&req, &ep, None);
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
        let probe = b.step(&req, &ep, None);
        tokio::pin!(probe);
        assert!(futures::poll!(&mut probe).is_pending());
    } // dropped: the resident was cancelled mid-probe
    assert_eq!(b.state().status, HalfOpen);
    let (req, ep) = step_args();
    let probe = b.step(&req, &ep, None);
    tokio::pin!(probe);
    assert!(
        futures::poll!(&mut probe).is_pending(),
        "went through as the probe"
    );
    b.inner().gate.notify_one();
    assert!(probe.await.is_ok());
    assert_eq!(b.state().status, Closed);
}

/// Counts saves, to check there is one per change (a failure counted, a transition) and no more.
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
    let saved: Vec<(BreakerStatus, u32)> = lock(&store.saves)
        .iter()
        .map(|s| (s.status, s.failures))
        .collect();
    // Each failure counted while closed is saved too (a breaker built anew from the store, as
    // for each of a script's turns, goes on counting).
    assert_eq!(
        saved,
        vec![
            (Closed, 1),
            (Closed, 2),
            (Open, 3),
            (HalfOpen, 3),
            (Open, 4)
        ]
    );
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
