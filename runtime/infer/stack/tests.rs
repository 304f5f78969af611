//! Stacks built from layer specs: the order of the layers, the breaker's store and hook, the keys.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::infer::breaker::{BreakerStatus, MemoryBreakerStore, is_circuit_open};
use crate::infer::clock::TokioClock;
use crate::infer::scripted::Scripted;
use crate::infer::tests::{failures, ok, step_args};
use crate::infer::{Infer, OnText, StepResult, lock};
use crate::providers::Endpoint;
use crate::vocab::InferRequest;

/// An inner step that records the system prompt of each request it is asked.
#[derive(Default)]
struct Systems(Mutex<Vec<Option<String>>>);

impl Infer for Systems {
    async fn step<'a>(
        &'a self,
        req: &'a InferRequest,
        _ep: &'a Endpoint,
        _on_text: OnText<'a>,
    ) -> StepResult {
        lock(&self.0).push(req.system.clone());
        ok("fine")
    }
}

fn suffix(text: &str) -> LayerSpec {
    LayerSpec::Context {
        system_suffix: Some(text.into()),
        before_step: None,
    }
}

async fn step(stack: &SharedInfer) -> StepResult {
    let (mut req, ep) = step_args();
    req.system = Some("base".into());
    stack.step(&req, &ep, None).await
}

#[tokio::test]
async fn the_first_layer_is_the_outermost() {
    let inner = Arc::new(Systems::default());
    let stack = build(inner.clone(), &[suffix("outer"), suffix("inner")], None);
    step(&stack).await.unwrap();
    // The outer layer adds its text first; the inner one adds to what it was given.
    assert_eq!(
        *lock(&inner.0),
        vec![Some("base\n\nouter\n\ninner".to_string())]
    );
}

#[tokio::test]
async fn no_layers_is_the_inner_itself() {
    let inner = Arc::new(Systems::default());
    let stack = build(inner.clone(), &[], None);
    step(&stack).await.unwrap();
    assert_eq!(*lock(&inner.0), vec![Some("base".to_string())]);
}

type Moves = Arc<Mutex<Vec<(BreakerStatus, BreakerStatus)>>>;

/// `[breaker, retries]` around `inner`, the breaker opening at the first failed step, its state in
/// `breakers`, its moves recorded.
fn guarded(inner: SharedInfer, breakers: &Arc<MemoryBreakerStore>) -> (SharedInfer, Moves) {
    let moves: Moves = Arc::default();
    let sink = moves.clone();
    let hook: TransitionHook = Arc::new(move |from, to, _info| lock(&sink).push((from, to)));
    let layers = [
        LayerSpec::Breaker {
            policy: BreakerPolicy {
                threshold: 1,
                ..BreakerPolicy::default()
            },
            on_transition: Some(hook),
        },
        LayerSpec::Retries(RetryPolicy {
            attempts: 2,
            base: Duration::ZERO,
            cap: Duration::ZERO,
        }),
    ];
    let store: Arc<dyn BreakerStore> = breakers.clone();
    (build(inner, &layers, Some(store)), moves)
}

#[tokio::test]
async fn the_breaker_wraps_the_retries_and_keeps_its_state_where_it_is_told() {
    use BreakerStatus::{Closed, HalfOpen, Open};
    let clock = Arc::new(TokioClock::new());
    let breakers = MemoryBreakerStore::new();
    let inner = Arc::new(Scripted::new(clock.clone(), failures(4)));
    let (stack, moves) = guarded(inner.clone(), &breakers);
    // One step is one retried call (two calls); it opens the breaker, the next step is the probe
    // (two calls more), which fails and leaves it open for the first probe interval.
    for _ in 0..2 {
        let err = step(&stack).await.unwrap_err();
        assert!(!is_circuit_open(&err), "{err}");
    }
    assert_eq!(inner.calls().len(), 4);
    assert_eq!(
        *lock(&moves),
        vec![(Closed, Open), (Open, HalfOpen), (HalfOpen, Open)]
    );
    assert_eq!(breakers.load().map(|s| s.status), Some(Open));

    // A stack built again on the same store (a restart) is still open: it refuses at once.
    let again = Arc::new(Scripted::new(clock, [ok("never")]));
    let (stack, moves) = guarded(again.clone(), &breakers);
    let err = step(&stack).await.unwrap_err();
    assert!(is_circuit_open(&err), "{err}");
    assert!(again.calls().is_empty());
    assert!(lock(&moves).is_empty(), "restoring is no transition");
}

#[test]
fn each_owner_has_a_breaker_key_of_its_own() {
    assert_eq!(ROUTE_BREAKER_KEY, "ai/breaker");
    assert_eq!(breaker_key("w"), "ai/breaker/w");
    assert_eq!(breaker_key("script"), "ai/breaker/script");
    assert_eq!(breaker_owner(&breaker_key("w")), "w");
    assert_eq!(breaker_owner(ROUTE_BREAKER_KEY), "route");
}
