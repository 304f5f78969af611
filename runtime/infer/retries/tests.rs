//! `with_retries` on a [`ManualClock`] (and once on tokio's paused clock).

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::infer::Infer;
use crate::infer::clock::{Clock, ManualClock, TokioClock};
use crate::infer::scripted::Scripted;
use crate::infer::tests::{T0, fatal, ok, overloaded, run, secs, step_args};

fn retries(clock: &Arc<ManualClock>, answers: Vec<StepResult>) -> Retries<Scripted> {
    Retries::new(Scripted::new(clock.clone(), answers))
        .with_clock(clock.clone())
        .with_seed(7)
}

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
    r.step(&req, &ep, Some(&mut hook)).await.unwrap();
    assert_eq!(seen, "hello");
}

/// Streams "hel" and then fails transiently, each call; counts its calls.
#[derive(Default)]
struct CutMidStream(std::sync::atomic::AtomicUsize);

impl Infer for CutMidStream {
    fn step<'a>(
        &'a self,
        _req: &'a InferRequest,
        _ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> impl Future<Output = StepResult> + Send + 'a {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(f) = on_text {
            f("hel");
        }
        async { Err(ProviderError::Fetch("the stream broke".into())) }
    }
}

/// A stream that broke after some text is not tried again: the retry's text followed from
/// the start, and a person saw "hel" and then "hello" with no sign of the restart. Without a
/// stream hook the same failure is retried.
#[tokio::test]
async fn an_attempt_that_streamed_text_before_failing_is_not_retried() {
    let clock = ManualClock::new(T0);
    let r = Retries::new(CutMidStream::default())
        .with_clock(clock.clone())
        .with_seed(7);
    let (req, ep) = step_args();
    let mut seen = String::new();
    let mut hook = |d: &str| seen.push_str(d);
    let err = r.step(&req, &ep, Some(&mut hook)).await.unwrap_err();
    assert_eq!(err.kind(), "fetch_error");
    assert_eq!(seen, "hel");
    assert_eq!(r.inner().0.load(std::sync::atomic::Ordering::Relaxed), 1);

    let silent = Retries::new(CutMidStream::default())
        .with_clock(clock.clone())
        .with_seed(7);
    silent.step(&req, &ep, None).await.unwrap_err();
    assert_eq!(
        silent.inner().0.load(std::sync::atomic::Ordering::Relaxed),
        6
    );
}
