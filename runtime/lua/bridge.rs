//! The crossing from the Rust core into the Lua VM: "call this Lua function with these JSON
//! arguments, answer on this oneshot".
//!
//! A [`LuaBridge`] is `Send + Sync` and cheap to clone, so a turn loop can run anywhere (on the
//! Lua thread itself or on the core) and still reach the script's tools and callbacks. On the
//! Lua thread, [`serve`] receives each job and runs it in its own local task, so a slow tool never
//! holds up another. Lua functions are known to the core by a [`FnId`], kept in a table on the
//! Lua side ([`Functions`]).

use std::cell::RefCell;
use std::collections::HashMap;

use mlua::{Function, Lua, MultiValue, Value};
use serde_json::Value as Json;
use tokio::sync::{mpsc, oneshot};

use super::convert::{from_json, to_json};
use crate::residents::mail::Provenance;
use crate::residents::supervision::Fault;

/// A Lua function the core may call.
pub type FnId = u64;

/// How a Lua tool handler ended.
#[derive(Debug, Clone, PartialEq)]
pub enum HandlerOutcome {
    /// It returned a value: text as is, a table as JSON.
    Value(String),
    /// It returned `{ text = ..., files = {...} }`: text with files attached.
    Attached(String, Vec<crate::vocab::FileRef>),
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

enum Job {
    Tool {
        func: FnId,
        args: Json,
        ctx: Json,
        /// When the caller gives up: the handler is stopped then even if it never waits.
        deadline: Option<std::time::Instant>,
        reply: oneshot::Sender<HandlerOutcome>,
    },
    Callback {
        func: FnId,
        args: Vec<Json>,
        reply: Reply,
    },
}

/// Where a callback's outcome goes.
enum Reply {
    /// To the caller, who waits for it.
    To(oneshot::Sender<Result<(), Fault>>),
    /// Nobody waits: an error is logged under this name (`[planner] on_transition`).
    Log(String),
}

/// The core's handle on one Lua VM.
#[derive(Clone)]
pub struct LuaBridge {
    jobs: mpsc::UnboundedSender<Job>,
}

/// The receiving end, served on the Lua thread by [`serve`].
pub struct LuaJobs(mpsc::UnboundedReceiver<Job>);

pub fn channel() -> (LuaBridge, LuaJobs) {
    let (tx, rx) = mpsc::unbounded_channel();
    (LuaBridge { jobs: tx }, LuaJobs(rx))
}

const GONE: &str = "the Lua program has ended";

impl LuaBridge {
    /// Runs a tool handler `func(args, ctx)` on the Lua thread. Dropping the returned future
    /// (a deadline) cancels the handler at its next wait; one that never waits is stopped at
    /// `deadline`, or once the caller stopped waiting.
    pub async fn call_tool(
        &self,
        func: FnId,
        args: Json,
        ctx: Json,
        deadline: Option<std::time::Instant>,
    ) -> HandlerOutcome {
        let (reply, answer) = oneshot::channel();
        if self
            .jobs
            .send(Job::Tool {
                func,
                args,
                ctx,
                deadline,
                reply,
            })
            .is_err()
        {
            return HandlerOutcome::Gone;
        }
        answer.await.unwrap_or(HandlerOutcome::Gone)
    }

    /// Calls `func(arg)` on the Lua thread and waits for it to return.
    pub async fn callback(&self, func: FnId, arg: Json) -> Result<(), Fault> {
        self.call(func, vec![arg]).await
    }

    /// Calls `func(args...)` on the Lua thread and waits for it to return; `Err` carries what it
    /// raised.
    pub async fn call(&self, func: FnId, args: Vec<Json>) -> Result<(), Fault> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job::Callback {
                func,
                args,
                reply: Reply::To(reply),
            })
            .map_err(|_| Fault::from(GONE))?;
        answer.await.map_err(|_| Fault::from(GONE))?
    }

    /// Calls `func(args...)` on the Lua thread without waiting, from code that cannot wait (a
    /// breaker's transition hook). Calls posted from one thread start in the order posted; an
    /// error is logged as `{who} raised: file:line: message` with its traceback.
    pub fn post(&self, func: FnId, who: String, args: Vec<Json>) {
        let _ = self.jobs.send(Job::Callback {
            func,
            args,
            reply: Reply::Log(who),
        });
    }

    /// A bridge to no VM, for residents hosted without a Lua program (every Lua tool answers
    /// that the program has ended).
    pub fn detached() -> LuaBridge {
        channel().0
    }
}

tokio::task_local! {
    /// The mail the running tool's turn serves (`ai.inbound_provenance()`).
    static PROVENANCE: Provenance;
}

/// The mail the calling tool's turn serves, if it runs inside a resident's turn.
pub fn current_provenance() -> Option<Provenance> {
    PROVENANCE.try_with(Clone::clone).ok()
}

/// The provenance a tool call's `ctx` carries (set by dispatch for a resident's turn).
fn provenance_of(ctx: &Json) -> Option<Provenance> {
    Some(Provenance {
        origin: ctx.get("origin")?.as_str()?.to_string(),
        hop: u32::try_from(ctx.get("hop")?.as_u64()?).ok()?,
        to: ctx.get("ai")?.as_str()?.to_string(),
    })
}

/// The Lua functions the core may call, by id. Lives in the VM's app data.
#[derive(Default)]
pub struct Functions {
    next: std::cell::Cell<FnId>,
    table: RefCell<HashMap<FnId, Function>>,
}

impl Functions {
    pub fn register(&self, f: Function) -> FnId {
        let id = self.next.get() + 1;
        self.next.set(id);
        self.table.borrow_mut().insert(id, f);
        id
    }

    pub fn unregister(&self, id: FnId) {
        self.table.borrow_mut().remove(&id);
    }

    fn get(&self, id: FnId) -> Option<Function> {
        self.table.borrow().get(&id).cloned()
    }
}

/// Registers `f` with the VM's [`Functions`].
pub fn register(lua: &Lua, f: Function) -> FnId {
    lua.app_data_ref::<Functions>()
        .expect("the VM has a function table")
        .register(f)
}

pub fn unregister(lua: &Lua, id: FnId) {
    if let Some(fns) = lua.app_data_ref::<Functions>() {
        fns.unregister(id);
    }
}

/// Serves jobs until every [`LuaBridge`] is gone. Run it as a local task on the Lua thread.
pub async fn serve(lua: Lua, mut jobs: LuaJobs) {
    // `xpcall` in Lua tells a raised string from a thrown value, which mlua's error type blurs;
    // its handler notes where it was raised while the stack is still there.
    let protected = lua
        .load("local f, a, c, h = ... return xpcall(f, h, a, c)")
        .set_name("=colony.tool")
        .into_function()
        .and_then(|f| Ok((f, super::traced_handler(&lua)?)));
    let Ok((protected, handler)) = protected else {
        return;
    };
    while let Some(job) = jobs.0.recv().await {
        let lua = lua.clone();
        let protected = protected.clone();
        let handler = handler.clone();
        tokio::task::spawn_local(async move {
            match job {
                Job::Tool {
                    func,
                    args,
                    ctx,
                    deadline,
                    reply,
                } => {
                    let provenance = provenance_of(&ctx);
                    let workspace = ctx
                        .get("workspace")
                        .and_then(Json::as_str)
                        .map(str::to_string);
                    let run = run_tool(&lua, (&protected, &handler), func, args, ctx);
                    let run = async {
                        match workspace {
                            Some(w) => super::store::WORKSPACE.scope(w, run).await,
                            None => run.await,
                        }
                    };
                    let run = async {
                        match provenance {
                            Some(p) => PROVENANCE.scope(p, run).await,
                            None => run.await,
                        }
                    };
                    // The hook asks whether the caller is still waiting, the select waits for
                    // it to stop: both look at the one reply.
                    let reply = std::rc::Rc::new(RefCell::new(Some(reply)));
                    let waiting = reply.clone();
                    let limit = super::watchdog::Limit {
                        deadline,
                        abandoned: Some(Box::new(move || {
                            waiting.borrow().as_ref().is_none_or(|r| r.is_closed())
                        })),
                        ..Default::default()
                    };
                    let run = super::watchdog::guarded(limit, run);
                    let gave_up = std::future::poll_fn(|cx| match reply.borrow_mut().as_mut() {
                        Some(r) => r.poll_closed(cx),
                        None => std::task::Poll::Ready(()),
                    });
                    tokio::select! {
                        outcome = run => {
                            if let Some(reply) = reply.borrow_mut().take() {
                                let _ = reply.send(outcome);
                            }
                        }
                        // The caller gave up (a deadline): dropping `run` stops the handler.
                        _ = gave_up => {}
                    }
                }
                Job::Callback { func, args, reply } => {
                    let run = run_callback(&lua, func, args);
                    let result =
                        super::watchdog::guarded(super::watchdog::Limit::callback(), run).await;
                    match reply {
                        Reply::To(reply) => {
                            let _ = reply.send(result);
                        }
                        Reply::Log(who) => {
                            if let Err(e) = result {
                                tracing::warn!("{who} raised: {e}");
                            }
                        }
                    }
                }
            }
        });
    }
}

/// The registered function `id`, if it is still registered.
pub fn function(lua: &Lua, id: FnId) -> Option<Function> {
    lua.app_data_ref::<Functions>()?.get(id)
}

async fn run_tool(
    lua: &Lua,
    (protected, traced): (&Function, &Function),
    func: FnId,
    args: Json,
    ctx: Json,
) -> HandlerOutcome {
    let Some(handler) = function(lua, func) else {
        return HandlerOutcome::Raised("the tool's handler is gone".into());
    };
    let call = async {
        let args = from_json(lua, &args)?;
        let ctx = from_json(lua, &ctx)?;
        protected
            .call_async::<MultiValue>((handler, args, ctx, traced))
            .await
    };
    let values = match call.await {
        Ok(v) => v,
        Err(e) => match super::watchdog::Stop::of(&e) {
            Some(stop @ super::watchdog::Stop::Deadline(_)) => {
                return HandlerOutcome::Deadline(stop.to_string());
            }
            _ => return HandlerOutcome::Raised(super::fault(&e)),
        },
    };
    let mut values = values.into_iter();
    let ok = matches!(values.next(), Some(Value::Boolean(true)));
    let first = values.next().unwrap_or(Value::Nil);
    if !ok {
        // The traced handler's `{ err, message, traceback }`.
        // Lua calls no message handler for a memory error: the bare error comes back.
        let Value::Table(t) = first else {
            return HandlerOutcome::Raised(super::memory_or(&first).into());
        };
        let raised = t.get::<Value>(1).unwrap_or(Value::Nil);
        let fault = Fault {
            message: t.get("message").unwrap_or_default(),
            traceback: t.get("traceback").ok(),
            during: None,
        };
        return match raised {
            Value::String(_) | Value::Error(_) => HandlerOutcome::Raised(fault),
            other => HandlerOutcome::Thrown(describe_thrown(lua, other)),
        };
    }
    match first {
        Value::Nil => match values.next() {
            Some(Value::Nil) | None => HandlerOutcome::Value(String::new()),
            Some(err) => HandlerOutcome::Refused(super::describe_error(&err)),
        },
        Value::String(s) => HandlerOutcome::Value(s.to_string_lossy()),
        // `{ text = "...", files = {...} }` and nothing else: text with files attached (any
        // other table, a listing with a `files` field say, is a value sent as JSON).
        Value::Table(t) if is_attached(&t) => {
            let text = t
                .get::<mlua::LuaString>("text")
                .map(|s| s.to_string_lossy())
                .unwrap_or_default();
            match t
                .get::<Value>("files")
                .and_then(|f| super::files::read_files(lua, f, "the result's files"))
            {
                Ok(files) => HandlerOutcome::Attached(text, files),
                Err(e) => HandlerOutcome::Raised(super::plain(&e).into()),
            }
        }
        v @ (Value::Table(_) | Value::Boolean(_) | Value::Integer(_) | Value::Number(_)) => {
            match to_json(lua, v) {
                Ok(json) => HandlerOutcome::Value(json.to_string()),
                Err(e) => HandlerOutcome::Raised(
                    format!(
                        "the handler returned a value JSON cannot hold: {}",
                        super::plain(&e)
                    )
                    .into(),
                ),
            }
        }
        other => HandlerOutcome::Raised(
            format!(
                "the handler returned a {}, not a string or a table",
                other.type_name()
            )
            .into(),
        ),
    }
}

/// Whether a returned table is the text-with-files form: a string `text`, a table `files`, and
/// no other key.
fn is_attached(t: &mlua::Table) -> bool {
    let mut keys = 0;
    for pair in t.pairs::<Value, Value>() {
        let Ok((k, v)) = pair else { return false };
        match (k, v) {
            (Value::String(k), Value::String(_)) if k == "text" => keys |= 1,
            (Value::String(k), Value::Table(_)) if k == "files" => keys |= 2,
            _ => return false,
        }
    }
    keys == 3
}

/// A thrown value as text: a table is shown as JSON where it can be.
fn describe_thrown(lua: &Lua, value: Value) -> String {
    let type_name = value.type_name();
    match to_json(lua, value) {
        Ok(json) => format!("a {type_name} was thrown: {json}"),
        Err(_) => format!("a {type_name} was thrown"),
    }
}

async fn run_callback(lua: &Lua, func: FnId, args: Vec<Json>) -> Result<(), Fault> {
    let f = function(lua, func).ok_or(Fault::from("the callback is gone"))?;
    let args = args
        .iter()
        .map(|a| from_json(lua, a))
        .collect::<mlua::Result<MultiValue>>()
        .map_err(|e| Fault::from(super::plain(&e)))?;
    f.call_async::<()>(args).await.map_err(|e| super::fault(&e))
}
