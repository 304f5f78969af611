//! The seam through which the core reaches the script that hosts it: "run this handler of the
//! script with these arguments", "call this callback", "run this source".
//!
//! The core (the turn, the residents, the lifecycle) knows a script's functions only by a
//! [`FnId`] and calls them through a [`Script`]; it never knows what language the script is in.
//! The Lua host implements the trait (its `LuaBridge`, in `lua/bridge.rs`): each call crosses to
//! the VM's thread as a message and runs in a coroutine of its own there. A call's context
//! (which call, which step, the mail its turn serves, the workspace its `store.*` sees) travels
//! as the typed [`ToolContext`], not as text to parse back on the other side. See
//! `ARCHITECTURE.md` ("The crossing").

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value as Json;

use crate::vocab::FileRef;

/// A script's function the core may call (a tool handler, a callback, a source), as the
/// script's host numbered it.
pub type FnId = u64;

/// How a script's tool handler ended.
#[derive(Debug, Clone, PartialEq)]
pub enum HandlerOutcome {
    /// It returned a value: text as is, a table as JSON.
    Value(String),
    /// It returned `{ text = ..., files = {...} }`: text with files attached.
    Attached(String, Vec<FileRef>),
    /// It returned `nil, err`.
    Refused(String),
    /// It ran past its deadline without waiting, and was stopped there.
    Deadline(String),
    /// It raised an error with a message (a string): the message and where.
    Raised(Fault),
    /// It raised a value that is not a string (a table, a number...).
    Thrown(String),
    /// The program ended before the handler did: the call was cut off, not finished.
    Gone,
}

/// What a script's function raised, as colony reports it: the message (for a Lua error,
/// `file:line: message`, the line being the script's even when one of colony's functions raised
/// it) and the script's frames of the traceback, which the log shows under the message.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub message: String,
    /// `stack traceback:` and its frames, when the error came from Lua.
    pub traceback: Option<String>,
    /// What was running when it raised (`deliver_to`), when that is not the child's own body.
    pub during: Option<&'static str>,
    /// It did not raise: the watchdog stopped it (past its deadline, or, for a source or a
    /// callback, 10 s without waiting). Restarted,
    /// such code spins again, holding the program's one Lua thread each time
    /// ([`crate::residents::supervision`] counts these stops over a longer span).
    pub spun: bool,
}

impl Fault {
    /// What `during` was running when it raised.
    pub fn during(mut self, during: &'static str) -> Fault {
        self.during = Some(during);
        self
    }
}

impl From<String> for Fault {
    fn from(message: String) -> Fault {
        Fault {
            message,
            traceback: None,
            during: None,
            spun: false,
        }
    }
}

impl From<&str> for Fault {
    fn from(message: &str) -> Fault {
        Fault::from(message.to_string())
    }
}

/// The message, and under it the traceback: what a log line shows.
impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        match &self.traceback {
            Some(t) => write!(f, "\n{t}"),
            None => Ok(()),
        }
    }
}

/// Where the mail a turn serves came from: what `ai.inbound_provenance()` answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Provenance {
    pub origin: String,
    pub hop: u32,
    /// The AI serving it (a relaying tool's `source`).
    pub to: String,
}

/// What a tool handler is told of its call besides the arguments: a handler's `ctx` is made
/// from it (`call_id`, `name`, `step`, and in a resident's turn `origin`, `hop`, `ai`,
/// `workspace`), and the host runs the handler inside its provenance and workspace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolContext {
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    pub step: u32,
    /// The mail the turn serves (a resident's turn).
    pub provenance: Option<Provenance>,
    /// The store namespace the handler's `store.*` calls see (a resident's `workspace`).
    pub workspace: Option<String>,
    /// When the caller gives up (the tool's timeout): a handler that never waits is stopped
    /// then, where the script can do that.
    pub deadline: Option<std::time::Instant>,
}

/// The core's handle on the script hosting a program. `Send + Sync`: a turn or a resident on
/// any thread reaches the script through it. Every call answers even when the script has ended
/// ([`HandlerOutcome::Gone`], or a [`Fault`] saying so), so the core never waits for a program
/// that is gone.
pub trait Script: Send + Sync {
    /// Runs the tool handler `func(args, ctx)`. Dropping the returned future (a deadline)
    /// cancels the handler at its next wait.
    fn call_handler(
        &self,
        func: FnId,
        args: Json,
        cx: ToolContext,
    ) -> BoxFuture<'static, HandlerOutcome>;

    /// Calls `func(args...)` and waits for it to return (`on_step`, `on_tool`, a stream's
    /// deltas, `deliver_to`); `Err` carries what it raised.
    fn call(&self, func: FnId, args: Vec<Json>) -> BoxFuture<'static, Result<(), Fault>>;

    /// Calls `func(args...)` without waiting, from code that cannot wait (a breaker's transition
    /// hook). Calls posted from one thread start in the order posted; an error is logged as
    /// `{who} raised: ...`.
    fn post(&self, func: FnId, who: String, args: Vec<Json>);

    /// Runs the source `func(ai)` inside `workspace` until it returns (`Ok`) or raises.
    /// Dropping the returned future ends the source at its next wait.
    fn run_source(
        &self,
        func: FnId,
        ai: String,
        workspace: Option<String>,
    ) -> BoxFuture<'static, Result<(), Fault>>;
}

impl<S: Script + ?Sized> Script for Arc<S> {
    fn call_handler(
        &self,
        func: FnId,
        args: Json,
        cx: ToolContext,
    ) -> BoxFuture<'static, HandlerOutcome> {
        (**self).call_handler(func, args, cx)
    }

    fn call(&self, func: FnId, args: Vec<Json>) -> BoxFuture<'static, Result<(), Fault>> {
        (**self).call(func, args)
    }

    fn post(&self, func: FnId, who: String, args: Vec<Json>) {
        (**self).post(func, who, args)
    }

    fn run_source(
        &self,
        func: FnId,
        ai: String,
        workspace: Option<String>,
    ) -> BoxFuture<'static, Result<(), Fault>> {
        (**self).run_source(func, ai, workspace)
    }
}

/// What a call into a script that has ended answers.
pub const GONE: &str = "the Lua program has ended";

/// No script at all, for residents hosted without one (an embedding application's own): every
/// handler answers that the program has ended.
#[derive(Debug, Clone, Copy, Default)]
pub struct Detached;

impl Script for Detached {
    fn call_handler(&self, _: FnId, _: Json, _: ToolContext) -> BoxFuture<'static, HandlerOutcome> {
        Box::pin(std::future::ready(HandlerOutcome::Gone))
    }

    fn call(&self, _: FnId, _: Vec<Json>) -> BoxFuture<'static, Result<(), Fault>> {
        Box::pin(std::future::ready(Err(Fault::from(GONE))))
    }

    fn post(&self, _: FnId, _: String, _: Vec<Json>) {}

    fn run_source(
        &self,
        _: FnId,
        _: String,
        _: Option<String>,
    ) -> BoxFuture<'static, Result<(), Fault>> {
        Box::pin(std::future::ready(Err(Fault::from(GONE))))
    }
}
