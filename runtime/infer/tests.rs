//! What the layers' tests share, and the test of the layers composed. Every test runs on a
//! [`ManualClock`]: waits advance virtual time at once, so the asserted times are exact virtual
//! readings, not wall time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::breaker::BreakerStatus::{Closed, Open};
use super::breaker::{Breaker, BreakerStatus, TransitionInfo};
use super::clock::ManualClock;
use super::retries::Retries;
use super::scripted::Scripted;
use super::{Infer, SharedInfer, StepResult, lock};
use crate::providers::{Endpoint, ProviderError, ToolsLevel};
use crate::vocab::{InferRequest, Inferred, Message, Stop, Style, Usage};

pub(super) const T0: u64 = 1_700_000_000_000;

pub(super) fn step_args() -> (InferRequest, Endpoint) {
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

pub(super) fn ok(text: &str) -> StepResult {
    Ok(Inferred {
        message: Message::assistant(text),
        stop: Stop::EndTurn,
        usage: Usage::default(),
        model: None,
    })
}

pub(super) fn overloaded(message: &str, retry_after: Option<Duration>) -> StepResult {
    Err(ProviderError::Provider {
        status: Some(529),
        message: message.into(),
        transient: true,
        retry_after,
    })
}

pub(super) fn fatal() -> StepResult {
    Err(ProviderError::Auth {
        status: 401,
        message: "invalid key".into(),
    })
}

pub(super) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub(super) async fn run(stack: &impl Infer) -> StepResult {
    let (req, ep) = step_args();
    stack.step(&req, &ep, None).await
}

pub(super) type Log = Arc<Mutex<Vec<(BreakerStatus, BreakerStatus, TransitionInfo)>>>;

pub(super) fn moves(log: &Log) -> Vec<(BreakerStatus, BreakerStatus)> {
    lock(log).iter().map(|(f, t, _)| (*f, *t)).collect()
}

pub(super) fn failures(n: usize) -> Vec<StepResult> {
    (1..=n)
        .map(|i| overloaded(&format!("down {i}"), None))
        .collect()
}

/// One breaker step is one retried call: the breaker opens after three steps of six calls each.
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
    let probe = shared.step(&step_args().0, &step_args().1, None).await;
    assert_eq!(
        probe.unwrap_err().kind(),
        "config_error",
        "script exhausted"
    );
}
