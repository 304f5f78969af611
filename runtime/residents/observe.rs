//! What a route's residents do, for an observer outside the program (`colony serve`'s events
//! and metrics).
//!
//! The route's own [`super::RouteEvent`]s go to its one watcher (the Lua `ai.watch`), which
//! acts on them; an observer only looks. It is lent to the route before any resident is hired
//! ([`super::Route::set_observer`]) and hears every route event too, plus the start and end of
//! each turn. Nothing is sent when nobody observes, so a program under `colony run` pays one
//! empty check per turn.

use std::time::Duration;

use super::route::RouteEvent;
use crate::turn::{ToolEvent, TurnError};
use crate::vocab::Usage;

/// One thing a resident did.
#[derive(Debug, Clone)]
pub enum Observation {
    /// An event the route reports to its watcher (crash, failure, gone, blocked).
    Route(RouteEvent),
    /// A turn began, serving `mails` arrivals (0 when it continues a turn cut short).
    TurnStarted { ai: String, mails: usize },
    /// A turn ended, well or not.
    TurnEnded(TurnReport),
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
