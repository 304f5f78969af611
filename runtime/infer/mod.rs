//! Inference middleware: the layers that serve one inference step around the provider, for every
//! turn (a resident's, and a script's own `ai.take_turn`).
//!
//! A turn *performs* a step ("infer this request at this endpoint") and a stack of layers
//! *serves* it: `with_retries` inside `with_breaker` inside `with_context`. Each layer is an
//! [`Infer`] wrapping an inner [`Infer`], so the stack is plain composition:
//!
//! ```ignore
//! let stack = Breaker::new(Retries::new(core));   // one breaker step = one retried call
//! let inferred = stack.step(&req, &ep, None).await;
//! ```
//!
//! - [`clock`]: where the layers read the time and how they wait ([`clock::TokioClock`] in
//!   production, [`clock::ManualClock`] in tests, so no test sleeps).
//! - [`retries`]: `with_retries` ([`retries::Retries`]), full-jitter backoff under a doubling
//!   ceiling, the provider's `retry_after` as a floor.
//! - [`breaker`]: `with_breaker` ([`breaker::Breaker`]), the circuit breaker, its probe schedule
//!   and where its state is kept ([`breaker::BreakerStore`]).
//! - [`context`]: `with_context` ([`context::Context`]), text added to every step's system prompt.
//! - [`stack`]: a stack built from a host's layer specs ([`stack::LayerSpec`]), with each breaker's
//!   state kept in the program's store under its owner's key.
//! - [`scripted`]: a fake inner step answering from a queue, for tests.
//! - [`spending`]: who pays for a model call that is not a resident's own step (its tools', its
//!   sources').
//!
//! "Infer" names one thing in Rust: serving a step through these layers ([`Infer::step`]). The
//! other calls that reach a model have names of their own (ARCHITECTURE.md, "Names for a model
//! call"): [`Providers::call`](crate::providers::Providers::call) puts one request on the wire,
//! [`Core::call_provider`] is the innermost step, [`crate::turn::model_call::call_model`] is a
//! script's or a turn's call through a stack, and [`crate::structured::ask_structured`] asks for
//! an answer matching a schema. In Lua, `ai.infer` and `ai.infer_with_tools` are aliases of
//! `ai.ask_simple` and `ai.take_turn`.
//!
//! Outcomes are values: a layer answers `Ok(Inferred)` or `Err(ProviderError)` and never panics
//! or throws; each loop decides at its own call site what a failure means. A step the breaker
//! refuses is an ordinary transient [`ProviderError::Provider`] whose message starts with
//! [`breaker::CIRCUIT_OPEN`] (see [`breaker::is_circuit_open`]) and whose `retry_after` says when
//! the next probe is due, so callers that only know `ProviderError` still do the right thing.
//!
//! [`ProviderError::Provider`]: crate::providers::ProviderError::Provider

pub mod breaker;
pub mod clock;
pub mod context;
pub mod retries;
pub mod scripted;
pub mod spending;
pub mod stack;

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::BoxFuture;

use crate::core::Core;
use crate::providers::{Endpoint, ProviderError};
use crate::vocab::{InferRequest, Inferred};

/// The streaming hook of a step: each text delta as it arrives. `None` fetches the whole answer.
pub type OnText<'a> = Option<&'a mut (dyn FnMut(&str) + Send)>;

/// What a step answers: the model's reply, or why there is none.
pub type StepResult = Result<Inferred, ProviderError>;

/// Serves one inference step. [`Core`] is the innermost implementation ([`Core::call_provider`]);
/// the layers of this module wrap another `Infer`; tests use [`scripted::Scripted`].
///
/// The returned future is `Send` because residents run on the multi-thread runtime.
pub trait Infer: Send + Sync {
    fn step<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> impl Future<Output = StepResult> + Send + 'a;
}

impl Infer for Core {
    fn step<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> impl Future<Output = StepResult> + Send + 'a {
        Core::call_provider(self, req, ep, on_text)
    }
}

/// The object-safe form of [`Infer`], for stacks chosen at run time (middleware installed on the
/// route or per AI from Lua): every `Infer` is one, and [`SharedInfer`] is an `Infer` again.
pub trait DynInfer: Send + Sync {
    fn step_boxed<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> BoxFuture<'a, StepResult>;
}

impl<T: Infer> DynInfer for T {
    fn step_boxed<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> BoxFuture<'a, StepResult> {
        Box::pin(self.step(req, ep, on_text))
    }
}

/// A shared, type-erased stack: what a route hands each resident.
pub type SharedInfer = Arc<dyn DynInfer>;

impl Infer for SharedInfer {
    fn step<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> impl Future<Output = StepResult> + Send + 'a {
        (**self).step_boxed(req, ep, on_text)
    }
}

/// Lends the streaming hook to one attempt and gets it back afterwards.
fn reborrow<'b>(on_text: &'b mut OnText<'_>) -> OnText<'b> {
    match on_text {
        Some(f) => Some(&mut **f),
        None => None,
    }
}

/// A poisoned lock here only means a callback panicked; the state it guards is still whole.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
