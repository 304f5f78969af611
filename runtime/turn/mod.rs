//! The turn: one model turn as a value. Infer, run the calls the model asked for (all of a step's
//! calls at once, each with its deadline), feed the results back, repeat until the model answers
//! without calls or the step cap is reached.
//!
//! - [`tools`]: tool definitions, schema checks, the parameter shorthand, allow/deny globs.
//! - [`dispatch`]: running one call, where every failure becomes an error result for the model
//!   and a [`ToolEvent`] for the caller, never a failed turn.
//! - [`take_turn`](mod@take_turn): the loop, the step cap and its budget note, streaming and `on_step`.
//! - [`model_call`]: one model call with its text streamed and the refused-attachment retry
//!   (`ai.ask` makes the same call).
//! - [`compaction`]: summarising the transcript when the next request would overflow the window.
//! - [`estimate`]: colony's own count of a request's tokens, for when the provider's is missing.
//!
//! The loop is `Send`: it reaches the script only through the seam ([`crate::script::Script`]), so
//! it runs on the Lua thread for a script's own turns and on the core for residents alike. Each model call goes through a
//! middleware stack ([`crate::infer::DynInfer`]); a script's own turns pass the
//! bare [`crate::core::Core`].

pub mod compaction;
pub mod dispatch;
pub mod estimate;
pub mod model_call;
pub mod take_turn;
pub mod tools;

use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

pub use take_turn::take_turn;
pub use tools::{Handler, ToolDef};

use crate::core::Ask;
use crate::script::{FnId, Provenance};
use crate::vocab::{FileRef, Message, Stop, ToolCall, ToolResult, Usage};

/// How many model calls a turn may make when it does not say (a script's `ai.take_turn`, a
/// resident's turns; `ai.run` allows one more).
pub const DEFAULT_MAX_STEPS: u32 = 8;

/// Everything one turn needs. `ask.messages` is the transcript so far (the prompt included);
/// `ask.tools` is ignored in favour of `tools`.
#[derive(Clone)]
pub struct TurnSpec {
    pub ask: Ask,
    pub tools: Vec<ToolDef>,
    pub max_steps: u32,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    /// Arguments overwritten before a handler runs, for every tool whose schema declares them.
    pub pin: Map<String, Value>,
    pub compaction: Compaction,
    /// Called with each text delta (a JSON string).
    pub on_text: Option<FnId>,
    /// Called after each step with the step's report.
    pub on_step: Option<FnId>,
    /// Called as each tool call ends, with its [`ToolEvent`] and its arguments.
    pub on_tool: Option<FnId>,
    /// The mail a resident's turn serves: its tools see the sender and the hop.
    pub provenance: Option<Provenance>,
    /// The workspace its tools' `store.*` calls see (a resident's `workspace`).
    pub workspace: Option<String>,
    /// Told of each step and call as it happens (persistence, the audit log).
    pub hooks: Option<std::sync::Arc<dyn TurnHooks>>,
    /// The conversation's size as last reported (a resident's previous turn), so a turn whose
    /// first request would overflow compacts before it, not never.
    pub reported_tokens: Option<u64>,
    /// Tools that may change between steps (MCP servers connected by the model mid-turn).
    pub dynamic: Option<std::sync::Arc<dyn DynamicTools>>,
}

/// A source of tools read again before every step: what one step adds, the next one offers.
pub trait DynamicTools: Send + Sync {
    fn current(&self) -> Vec<ToolDef>;

    /// Called before each step reads [`DynamicTools::current`]: a source whose tools may have
    /// changed elsewhere (an MCP server that said so) finds out what they are now.
    fn refresh(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// What a call of the step in flight had done when the program last stopped.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    /// Nothing: run it.
    Nothing,
    /// It started and did not finish: run it again only if the tool is idempotent.
    Started,
    /// It finished: its result (and the files it carried) is reused, the tool is not run again.
    Finished(ToolResult, Vec<FileRef>),
}

/// Why the calls of a step were not journaled as started ([`TurnHooks::starting`]).
#[derive(Debug, Clone, PartialEq)]
pub enum NotStarted {
    /// Refused for good (in a cluster: this node no longer holds the resident's lease): the
    /// calls do not run, and each is answered with the reason.
    Refused(String),
    /// The store could not write (a full disk, a database gone away): nothing of the step
    /// runs, and the turn ends as one whose step could not be saved, to be continued, the calls
    /// run then, once the store writes again. Answered "not run" instead, the model read that,
    /// the turn ended, and the mail's work was never done.
    Unsaved(String),
}

/// A turn's observer: what a persisted resident writes down so that a restart resumes the turn
/// without running a finished tool twice, and what the audit log records. Every method has a
/// default that does nothing; calls come from the turn's task, in order.
pub trait TurnHooks: Send + Sync {
    /// A turn that may call tools begins: what `finished` will write may be prepared for
    /// now, beside the turn's first model call. Returns at once.
    fn turn_begins(&self) {}
    /// A step's model reply was appended (before any of its calls run, and before a final
    /// answer is handed on). An error (the store cannot write) ends the turn there; a final
    /// answer is then dropped from it, never delivered unsaved.
    fn inferred(&self, _messages: &[Message]) -> Result<(), String> {
        Ok(())
    }
    /// What the journal says of `call_id` (at the first step after a restart).
    fn recorded(&self, _call_id: &str) -> Recorded {
        Recorded::Nothing
    }
    /// A step's calls are about to run, all of them journaled as started before any does: a
    /// restart, or the node that took over, must be able to tell that one had. An error and
    /// none of them runs ([`NotStarted`]).
    fn starting(&self, _calls: &[&ToolCall]) -> Result<(), NotStarted> {
        Ok(())
    }
    /// A call ended (whether it ran, was refused, or was reused).
    fn finished(
        &self,
        _call: &ToolCall,
        _result: &ToolResult,
        _files: &[FileRef],
        _event: &ToolEvent,
    ) {
    }
    /// What to wait for before the call that just `finished` goes on, for a hook that queues
    /// what it writes so that other turns' writes share its transaction (a script's audit
    /// lines: `store::audit_batch`); `None`, the default, when it wrote already.
    fn settled(&self) -> Option<futures::future::BoxFuture<'static, ()>> {
        None
    }
    /// A step's results were appended (before the next model call). An error ends the turn
    /// before the next model call.
    fn step_done(&self, _messages: &[Message]) -> Result<(), String> {
        Ok(())
    }
    /// A model call answered, having spent `usage`: for a host that must count what a turn
    /// spent even when the turn is cut before it ends (its outcome then never comes).
    fn spent(&self, _usage: &Usage) {}
}

impl TurnSpec {
    pub fn new(ask: Ask) -> TurnSpec {
        TurnSpec {
            ask,
            tools: Vec::new(),
            max_steps: DEFAULT_MAX_STEPS,
            allow: Vec::new(),
            deny: Vec::new(),
            pin: Map::new(),
            compaction: Compaction::default(),
            on_text: None,
            on_step: None,
            on_tool: None,
            provenance: None,
            workspace: None,
            hooks: None,
            reported_tokens: None,
            dynamic: None,
        }
    }
}

/// When and how the transcript is summarised to stay inside the model's window.
#[derive(Debug, Clone)]
pub struct Compaction {
    pub enabled: bool,
    /// The model's context window, in tokens.
    pub context_window: u64,
    /// The fraction of the window at which to compact.
    pub compact_at: f64,
    /// Borrowed when it is the default, so a hundred thousand residents share one copy.
    pub prompt: std::borrow::Cow<'static, str>,
}

pub const DEFAULT_COMPACT_PROMPT: &str = "Summarise this conversation for your own later use, \
    so that you can continue it from the summary alone: the user's goal, what has been done, what \
    the tools returned that still matters, and what remains to do. Keep every fact, name and \
    number needed to continue; leave out everything else.";

impl Default for Compaction {
    fn default() -> Compaction {
        Compaction {
            enabled: true,
            context_window: 200_000,
            compact_at: 0.8,
            prompt: std::borrow::Cow::Borrowed(DEFAULT_COMPACT_PROMPT),
        }
    }
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Ok,
    /// The handler raised an error (a string) or returned `nil, err`.
    Error,
    /// The handler raised a value that is not a string.
    Thrown,
    /// The arguments were not JSON.
    BadArguments,
    /// The arguments broke the tool's schema.
    Schema,
    /// The handler did not finish within its timeout.
    Deadline,
    /// The model called a tool nobody offered.
    UnknownTool,
    /// It had started when the program stopped, and is not idempotent: not run again.
    Interrupted,
    /// The program ended while it ran: cut off, not finished (the turn ends with it).
    Cancelled,
    /// The turn's tool budget (`max_steps`) ran out before it could run.
    NotRun,
    /// Over the tool's `rate`: not run; the message says when to try again.
    RateLimited,
}

impl EventKind {
    /// The kind as scripts and the audit log name it (`unknown_tool`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Ok => "ok",
            EventKind::Error => "error",
            EventKind::Thrown => "thrown",
            EventKind::BadArguments => "bad_arguments",
            EventKind::Schema => "schema",
            EventKind::Deadline => "deadline",
            EventKind::UnknownTool => "unknown_tool",
            EventKind::Interrupted => "interrupted",
            EventKind::Cancelled => "cancelled",
            EventKind::NotRun => "not_run",
            EventKind::RateLimited => "rate_limited",
        }
    }
}

/// One tool call, as the caller sees it afterwards.
#[derive(Debug, Clone, Serialize)]
pub struct ToolEvent {
    pub step: u32,
    pub call_id: String,
    pub name: String,
    pub kind: EventKind,
    /// What the model got back: the result, or the error message.
    pub outcome: String,
    #[serde(rename = "duration_ms", serialize_with = "as_millis")]
    pub duration: Duration,
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// What one step did, handed to `on_step`.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    pub step: u32,
    pub text: String,
    pub calls: Vec<ToolCall>,
    pub results: Vec<ToolResult>,
    pub usage: Usage,
}

/// Why a turn ended early, beside `stop = "error"`.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct TurnError {
    pub kind: String,
    pub message: String,
    /// How long the provider (or an open breaker) asked to wait before trying again.
    #[serde(skip)]
    pub retry_after: Option<Duration>,
    /// The HTTP status of the model call that failed, when there was one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Trying again cannot help until the settings change
    /// ([`crate::providers::ProviderError::is_permanent`]): a resident is blocked, not in an outage.
    #[serde(skip)]
    pub permanent: bool,
    /// Worth trying again unchanged after a pause
    /// ([`crate::providers::ProviderError::is_transient`]).
    #[serde(skip)]
    pub transient: bool,
}

impl TurnError {
    pub fn from_provider(e: &crate::providers::ProviderError) -> TurnError {
        TurnError {
            kind: e.kind().to_string(),
            message: e.to_string(),
            retry_after: e.retry_after(),
            status: e.status(),
            permanent: e.is_permanent(),
            transient: e.is_transient(),
        }
    }
}

/// A finished turn. `messages` is always valid to send again: every call has its result.
#[derive(Debug, Clone)]
pub struct TurnOutcome {
    pub reply: String,
    pub stop: Stop,
    pub steps: u32,
    pub usage: Usage,
    pub tool_events: Vec<ToolEvent>,
    pub messages: Vec<Message>,
    pub compactions: u32,
    pub error: Option<TurnError>,
    /// Whether the turn began by answering calls a restart had cut off (and committed them):
    /// something happened even if no model call succeeded.
    pub resumed: bool,
    /// The size of its last request as the provider reported it (input + output tokens).
    pub reported_tokens: Option<u64>,
}
