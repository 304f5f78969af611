//! The Lua side of the seam ([`crate::script`]): "call this Lua function with these
//! arguments, answer on this oneshot".
//!
//! A [`LuaBridge`] is `Send + Sync` and cheap to clone, and it is the program's
//! [`Script`]: a turn loop can run anywhere (on the Lua thread itself or on the core) and still
//! reach the script's tools, callbacks and sources. On the Lua thread, [`serve`] receives each job
//! and runs it in its own local task, so a slow tool never holds up another. Lua functions are
//! known to the core by a [`FnId`], kept in a table on the Lua side ([`Functions`]).

use std::cell::RefCell;
use std::collections::HashMap;

use futures::future::BoxFuture;
use mlua::{Function, Lua, MultiValue, Table, Value};
use serde_json::Value as Json;
use tokio::sync::{mpsc, oneshot};

use super::convert::{from_json, to_json};
use crate::script::{Fault, GONE, Provenance, Script, ToolContext};
pub use crate::script::{FnId, HandlerOutcome};

enum Job {
    Tool {
        func: FnId,
        args: Json,
        ctx: ToolCtx,
        reply: oneshot::Sender<HandlerOutcome>,
    },
    Source {
        func: FnId,
        ai: String,
        workspace: Option<String>,
        reply: oneshot::Sender<Result<(), Fault>>,
    },
    Callback {
        func: FnId,
        args: Vec<Json>,
        reply: Reply,
    },
}

/// The `ctx` a handler is called with.
enum ToolCtx {
    /// A turn's call: the table is made from it on the Lua thread.
    Call(ToolContext),
    /// A table given as it is (a middleware's `before_step` passes `{}`).
    Table(Json),
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

impl LuaBridge {
    /// Runs `func(args, ctx)` on the Lua thread with `ctx` the table `ctx` holds (a turn's calls
    /// go through [`Script::call_handler`] instead). Dropping the returned future (a deadline)
    /// cancels the handler at its next wait.
    pub async fn call_tool(&self, func: FnId, args: Json, ctx: Json) -> HandlerOutcome {
        self.tool(func, args, ToolCtx::Table(ctx)).await
    }

    fn tool(
        &self,
        func: FnId,
        args: Json,
        ctx: ToolCtx,
    ) -> impl std::future::Future<Output = HandlerOutcome> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let sent = self.jobs.send(Job::Tool {
            func,
            args,
            ctx,
            reply,
        });
        async move {
            if sent.is_err() {
                return HandlerOutcome::Gone;
            }
            answer.await.unwrap_or(HandlerOutcome::Gone)
        }
    }

    /// Calls `func(arg)` on the Lua thread and waits for it to return.
    pub async fn callback(&self, func: FnId, arg: Json) -> Result<(), Fault> {
        self.call(func, vec![arg]).await
    }

    /// Calls `func(args...)` on the Lua thread and waits for it to return; `Err` carries what it
    /// raised.
    pub fn call(
        &self,
        func: FnId,
        args: Vec<Json>,
    ) -> impl std::future::Future<Output = Result<(), Fault>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let sent = self.jobs.send(Job::Callback {
            func,
            args,
            reply: Reply::To(reply),
        });
        async move {
            sent.map_err(|_| Fault::from(GONE))?;
            answer.await.map_err(|_| Fault::from(GONE))?
        }
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
    /// that the program has ended); [`crate::script::Detached`] is the same without Lua.
    pub fn detached() -> LuaBridge {
        channel().0
    }
}

impl Script for LuaBridge {
    fn call_handler(
        &self,
        func: FnId,
        args: Json,
        cx: ToolContext,
    ) -> BoxFuture<'static, HandlerOutcome> {
        Box::pin(self.tool(func, args, ToolCtx::Call(cx)))
    }

    fn call(&self, func: FnId, args: Vec<Json>) -> BoxFuture<'static, Result<(), Fault>> {
        Box::pin(LuaBridge::call(self, func, args))
    }

    fn post(&self, func: FnId, who: String, args: Vec<Json>) {
        LuaBridge::post(self, func, who, args)
    }

    fn run_source(
        &self,
        func: FnId,
        ai: String,
        workspace: Option<String>,
    ) -> BoxFuture<'static, Result<(), Fault>> {
        let (reply, answer) = oneshot::channel();
        let sent = self.jobs.send(Job::Source {
            func,
            ai,
            workspace,
            reply,
        });
        Box::pin(async move {
            sent.map_err(|_| Fault::from(GONE))?;
            answer.await.map_err(|_| Fault::from(GONE))?
        })
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
    // A callback's arguments are as many as it is given.
    let Ok(protected_callback) = lua
        .load("local f, h = ... return xpcall(f, h, select(3, ...))")
        .set_name("=colony.callback")
        .into_function()
    else {
        return;
    };
    while let Some(job) = jobs.0.recv().await {
        let lua = lua.clone();
        let protected = protected.clone();
        let protected_callback = protected_callback.clone();
        let handler = handler.clone();
        tokio::task::spawn_local(async move {
            match job {
                Job::Tool {
                    func,
                    args,
                    ctx,
                    reply,
                } => {
                    let (ctx, provenance, workspace, deadline) = match ctx {
                        ToolCtx::Call(cx) => {
                            let (provenance, workspace, deadline) =
                                (cx.provenance.clone(), cx.workspace.clone(), cx.deadline);
                            (Ctx::Call(cx), provenance, workspace, deadline)
                        }
                        ToolCtx::Table(json) => (Ctx::Table(json), None, None, None),
                    };
                    let run = run_tool(&lua, (&protected, &handler), func, args, ctx);
                    // The model calls a handler makes are paid by the resident whose turn
                    // called it.
                    let payer = provenance.as_ref().and_then(|p| payer(&lua, &p.to));
                    let run = within(workspace, provenance, run);
                    let run = crate::infer::spending::charged_to(payer, run);
                    // The watchdog asks whether the caller is still waiting (from its own
                    // thread too), the select waits for it to stop: both look at the one reply.
                    let reply = std::sync::Arc::new(std::sync::Mutex::new(Some(reply)));
                    let waiting = reply.clone();
                    let limit = super::watchdog::Limit {
                        deadline,
                        abandoned: Some(Box::new(move || {
                            let reply = waiting.lock().unwrap_or_else(|e| e.into_inner());
                            reply.as_ref().is_none_or(|r| r.is_closed())
                        })),
                        ..Default::default()
                    };
                    let run = super::watchdog::guarded(&lua, limit, run);
                    let gave_up = std::future::poll_fn(|cx| {
                        match reply.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                            Some(r) => r.poll_closed(cx),
                            None => std::task::Poll::Ready(()),
                        }
                    });
                    tokio::select! {
                        outcome = run => {
                            let taken = reply.lock().unwrap_or_else(|e| e.into_inner()).take();
                            if let Some(reply) = taken {
                                let _ = reply.send(outcome);
                            }
                        }
                        // The caller gave up (a deadline): dropping `run` stops the handler.
                        _ = gave_up => {}
                    }
                }
                Job::Source {
                    func,
                    ai,
                    workspace,
                    mut reply,
                } => {
                    let payer = payer(&lua, &ai);
                    let protected = (&protected_callback, &handler);
                    let run = within(workspace, None, run_source(&lua, protected, func, ai));
                    let run = crate::infer::spending::charged_to(payer, run);
                    let run = super::watchdog::as_callback(&lua, run);
                    tokio::select! {
                        ended = run => { let _ = reply.send(ended); }
                        // The source was ended (its resident left, the watch ended).
                        _ = reply.closed() => {}
                    }
                }
                Job::Callback { func, args, reply } => {
                    let run = run_callback(&lua, (&protected_callback, &handler), func, args);
                    let result = super::watchdog::as_callback(&lua, run).await;
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

/// Who pays for the model calls of work done for resident `ai`: its budget and usage.
fn payer(lua: &Lua, ai: &str) -> Option<crate::infer::spending::Payer> {
    let life = lua.app_data_ref::<crate::residents::Lifecycle>()?;
    life.route().payer_for(ai)
}

/// `run` inside the workspace its `store.*` calls see and the provenance
/// `ai.inbound_provenance()` answers.
async fn within<T>(
    workspace: Option<String>,
    provenance: Option<Provenance>,
    run: impl std::future::Future<Output = T>,
) -> T {
    let run = async {
        match workspace {
            Some(w) => super::store::WORKSPACE.scope(w, run).await,
            None => run.await,
        }
    };
    match provenance {
        Some(p) => PROVENANCE.scope(p, run).await,
        None => run.await,
    }
}

/// A handler's `ctx` before it is a table.
enum Ctx {
    Call(ToolContext),
    Table(Json),
}

/// The `ctx` table of a turn's call: `call_id`, `name`, `step`, and in a resident's turn
/// `origin`, `hop`, `ai` (the mail it serves) and `workspace`.
fn ctx_table(lua: &Lua, cx: ToolContext) -> mlua::Result<Table> {
    use super::fields::{self, Field};
    let mut record = vec![
        (c"call_id", Field::Str(&cx.call_id)),
        (c"name", Field::Str(&cx.name)),
        (c"step", Field::Int(cx.step.into())),
    ];
    if let Some(p) = &cx.provenance {
        record.push((c"origin", Field::Str(&p.origin)));
        record.push((c"hop", Field::Int(p.hop.into())));
        record.push((c"ai", Field::Str(&p.to)));
    }
    if let Some(w) = &cx.workspace {
        record.push((c"workspace", Field::Str(w)));
    }
    // One protected call for the plain fields (a table is made for every call).
    let t = fields::record(lua, &record, None)?;
    super::mcp_export::add_ctx(lua, &t, &cx.call_id)?;
    Ok(t)
}

/// Runs the source `func(ai)` once, protected as a callback is; `Err` is what it raised.
async fn run_source(
    lua: &Lua,
    protected: (&Function, &Function),
    func: FnId,
    ai: String,
) -> Result<(), Fault> {
    run_protected(lua, protected, func, "source", vec![Json::String(ai)]).await
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
    ctx: Ctx,
) -> HandlerOutcome {
    let Some(handler) = function(lua, func) else {
        return HandlerOutcome::Raised("the tool's handler is gone".into());
    };
    let call = async {
        let args = from_json(lua, &args)?;
        let ctx = match ctx {
            Ctx::Call(cx) => Value::Table(ctx_table(lua, cx)?),
            Ctx::Table(json) => from_json(lua, &json)?,
        };
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
            // Stopped with the program (SIGINT, SIGTERM, --max-time): cut off, as a handler
            // the program's end drops is, so the turn ends with it. As an error the model read,
            // the turn went on calling the model, its tool stopped at once each time, up to its
            // max_steps: paid calls to a program that was stopping.
            Some(super::watchdog::Stop::Interrupted(_)) => return HandlerOutcome::Gone,
            _ => return HandlerOutcome::Raised(super::fault(&e)),
        },
    };
    let mut values = values.into_iter();
    let ok = matches!(values.next(), Some(Value::Boolean(true)));
    let first = values.next().unwrap_or(Value::Nil);
    if !ok {
        return failed(lua, first);
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
        // `json.null`: JSON's null, as a table holding it would send.
        Value::LightUserData(p) if p.0.is_null() => HandlerOutcome::Value("null".into()),
        other => HandlerOutcome::Raised(
            format!(
                "the handler returned a {}, not a string or a table",
                other.type_name()
            )
            .into(),
        ),
    }
}

/// Whether a returned table is the text-with-files form: a table `files`, a string `text` or
/// none (a chart or a screenshot has nothing to add: `{ files = {...} }` was sent as the JSON
/// `{"files":[...]}`, its files never attached), and no other key. A string `files` is that
/// form with one path given for the list: taken as it, so reading its files refuses it (it was
/// sent as the JSON `{"files":"chart.png","text":...}`, nothing attached).
fn is_attached(t: &mlua::Table) -> bool {
    let mut keys = 0;
    for pair in t.pairs::<Value, Value>() {
        let Ok((k, v)) = pair else { return false };
        match (k, v) {
            (Value::String(k), Value::String(_)) if k == "text" => keys |= 1,
            (Value::String(k), Value::Table(_)) if k == "files" => keys |= 2,
            (Value::String(k), Value::String(_)) if k == "files" => keys |= 4,
            _ => return false,
        }
    }
    keys & 6 != 0
}

/// A thrown value as text: a table is shown as JSON where it can be.
fn describe_thrown(lua: &Lua, value: Value) -> String {
    // An error object of the script's own says itself through `__tostring`, as it does when
    // the main chunk raises it (a tool's caller read "a table was thrown: {}").
    if let Some(text) = super::own_tostring(&value) {
        return text;
    }
    let type_name = value.type_name();
    match to_json(lua, value) {
        Ok(json) => format!("a {type_name} was thrown: {json}"),
        Err(_) => format!("a {type_name} was thrown"),
    }
}

/// How a protected call that failed failed, from the traced handler's `{ err, message,
/// traceback }`: raised (a string, an error colony raised), or a value thrown.
fn failed(lua: &Lua, first: Value) -> HandlerOutcome {
    // Lua calls no message handler for a memory error: the bare error comes back.
    let Value::Table(t) = first else {
        return HandlerOutcome::Raised(super::memory_or(&first).into());
    };
    let raised = t.get::<Value>(1).unwrap_or(Value::Nil);
    let fault = Fault {
        message: t.get("message").unwrap_or_default(),
        traceback: t.get("traceback").ok(),
        during: None,
        spun: false,
    };
    match raised {
        Value::String(_) | Value::Error(_) => HandlerOutcome::Raised(fault),
        other => HandlerOutcome::Thrown(describe_thrown(lua, other)),
    }
}

/// A callback (`deliver_to`, a watch's hook), protected as a tool's handler is: a table it
/// throws is described (`a table was thrown: {...}`), where mlua's error said `table:
/// 0x388dd682b80`.
async fn run_callback(
    lua: &Lua,
    protected: (&Function, &Function),
    func: FnId,
    args: Vec<Json>,
) -> Result<(), Fault> {
    run_protected(lua, protected, func, "callback", args).await
}

/// Calls the script's function `func` (a `what`) in `xpcall` with the traced handler.
async fn run_protected(
    lua: &Lua,
    (protected, traced): (&Function, &Function),
    func: FnId,
    what: &str,
    args: Vec<Json>,
) -> Result<(), Fault> {
    let f = function(lua, func).ok_or_else(|| Fault::from(format!("the {what} is gone")))?;
    let mut call = args
        .iter()
        .map(|a| from_json(lua, a))
        .collect::<mlua::Result<Vec<Value>>>()
        .map_err(|e| Fault::from(super::plain(&e)))?;
    call.insert(0, Value::Function(f));
    call.insert(1, Value::Function(traced.clone()));
    let values = protected
        .call_async::<MultiValue>(MultiValue::from_iter(call))
        .await
        .map_err(|e| super::fault(&e))?;
    let mut values = values.into_iter();
    if matches!(values.next(), Some(Value::Boolean(true))) {
        return Ok(());
    }
    match failed(lua, values.next().unwrap_or(Value::Nil)) {
        HandlerOutcome::Raised(fault) => Err(fault),
        HandlerOutcome::Thrown(thrown) => Err(Fault::from(thrown)),
        _ => Err(Fault::from(format!("the {what} failed"))),
    }
}
