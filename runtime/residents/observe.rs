//! What a route's residents do, for an observer outside the program (`colony serve`'s events
//! and metrics).
//!
//! The route's own [`super::RouteEvent`]s go to its one watcher (the Lua `ai.watch`), which
//! acts on them; an observer only looks. It is lent to the route before any resident is hired
//! ([`super::Route::set_observer`]) and hears every route event too, plus the start and end of
//! each turn, each tool call and model step as it ends, and each breaker transition. Nothing is sent when nobody observes, so a program under `colony run` pays one
//! empty check per turn.

use std::time::Duration;

use super::route::RouteEvent;
use crate::infer::breaker::{BreakerState, BreakerStatus};
use crate::infer::{DynInfer, Infer, OnText, StepResult};
use crate::providers::Endpoint;
use crate::turn::{Recorded, ToolEvent, TurnError, TurnHooks};
use crate::vocab::{FileRef, InferRequest, Message, ToolCall, ToolResult, Usage};

/// One thing a resident did.
#[derive(Debug, Clone)]
pub enum Observation {
    /// An event the route reports to its watcher (crash, failure, gone, blocked).
    Route(RouteEvent),
    /// A turn began, serving `mails` arrivals (0 when it continues a turn cut short).
    TurnStarted { ai: String, mails: usize },
    /// A turn ended, well or not.
    TurnEnded(TurnReport),
    /// A tool call of a turn in flight ended (ran, failed, was refused or reused), as it did.
    ToolCallEnded { ai: String, call: ToolEvent },
    /// One model step of a turn (the stack's step: the retries inside it included) ended;
    /// `ok`: it answered. A step an open breaker refused never left and is not told.
    ModelCall {
        ai: String,
        duration: Duration,
        ok: bool,
    },
    /// A breaker changed state: `owner` is the resident whose own breaker it is, `route` for
    /// the one shared by the residents without middleware of their own, `script` for the
    /// script's own turns.
    Breaker {
        owner: String,
        from: BreakerStatus,
        state: BreakerState,
    },
}

/// How a turn went.
#[derive(Debug, Clone)]
pub struct TurnReport {
    pub ai: String,
    /// Mails it served (taken into the conversation); 0 when nothing of it happened.
    pub served: usize,
    pub steps: u32,
    pub stop: &'static str,
    pub usage: Usage,
    /// Each tool call, with its outcome kind and duration.
    pub tool_calls: Vec<ToolEvent>,
    pub error: Option<TurnError>,
    /// The turn's wall time, and the part of it spent outside tool calls (model calls).
    pub duration: Duration,
    pub model_time: Duration,
}

/// Where observations go.
pub type Observer = tokio::sync::mpsc::UnboundedSender<Observation>;

/// A turn's hooks that also tell the observer of each tool call as it ends, then hand on to
/// the resident's own (persistence, the audit), if it has them.
pub(super) struct ObservedHooks {
    pub ai: String,
    pub observer: Observer,
    pub inner: Option<std::sync::Arc<dyn TurnHooks>>,
}

impl TurnHooks for ObservedHooks {
    fn turn_begins(&self) {
        if let Some(h) = &self.inner {
            h.turn_begins();
        }
    }

    fn inferred(&self, messages: &[Message]) -> Result<(), String> {
        self.inner.as_ref().map_or(Ok(()), |h| h.inferred(messages))
    }

    fn recorded(&self, call_id: &str) -> Recorded {
        self.inner
            .as_ref()
            .map_or(Recorded::Nothing, |h| h.recorded(call_id))
    }

    fn starting(&self, calls: &[&ToolCall]) -> Result<(), crate::turn::NotStarted> {
        self.inner.as_ref().map_or(Ok(()), |h| h.starting(calls))
    }

    fn finished(&self, call: &ToolCall, result: &ToolResult, files: &[FileRef], event: &ToolEvent) {
        if let Some(h) = &self.inner {
            h.finished(call, result, files, event)
        }
        let _ = self.observer.send(Observation::ToolCallEnded {
            ai: self.ai.clone(),
            call: event.clone(),
        });
    }

    fn step_done(&self, messages: &[Message]) -> Result<(), String> {
        self.inner
            .as_ref()
            .map_or(Ok(()), |h| h.step_done(messages))
    }

    fn spent(&self, usage: &crate::vocab::Usage) {
        if let Some(h) = &self.inner {
            h.spent(usage);
        }
    }
}

/// A resident's stack that tells the observer how long each model step took.
pub(super) struct Timed<'a> {
    pub ai: &'a str,
    pub observer: &'a Observer,
    pub inner: &'a dyn DynInfer,
}

impl Infer for Timed<'_> {
    async fn step<'b>(
        &'b self,
        req: &'b InferRequest,
        ep: &'b Endpoint,
        on_text: OnText<'b>,
    ) -> StepResult {
        let began = std::time::Instant::now();
        let result = self.inner.step_boxed(req, ep, on_text).await;
        let refused = matches!(&result, Err(e) if crate::infer::breaker::is_circuit_open(e));
        if !refused {
            let _ = self.observer.send(Observation::ModelCall {
                ai: self.ai.to_string(),
                duration: began.elapsed(),
                ok: result.is_ok(),
            });
        }
        result
    }
}
