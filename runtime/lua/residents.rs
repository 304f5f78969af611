//! The resident part of the `ai` module: `ai.route`, `ai.spawn`, `ai.mail`, `ai.dismiss`,
//! `ai.residents`, `ai.unblock`, `ai.watch`, `ai.stop`, `ai.stopping` and
//! `ai.inbound_provenance`.
//!
//! Each is a translation into the program's [`Lifecycle`] (the core keeps the residents, their
//! sources, the watch and the stop); an `ai.spawn` table is read in [`super::resident_spec`].
//! What stays on the Lua thread is calling the watch's hooks (`on_crash`, `on_fail`,
//! `on_blocked`) as the core hands it the route's events.

use std::collections::HashMap;
use std::time::Duration;

use mlua::{Function, Lua, MultiValue, Table, Value};
use tokio::sync::mpsc;

use super::bridge;
use super::convert::{check_fields, flag, misuse};
use super::resident_spec::{own_tool_names, read_spawn};
use crate::residents::{
    Delivered, Delivery, Lifecycle, Mail, RouteEvent, WatchError, WatchOptions,
};
use crate::turn::ToolDef;

/// What an embedding application lends a program: tools written in Rust (named by string in a
/// `tools` list) and the channel that receives `deliver_to = "host"` deliveries.
#[derive(Clone, Default)]
pub struct HostSetup {
    pub tools: Vec<ToolDef>,
    pub deliveries: Option<mpsc::UnboundedSender<Delivery>>,
    /// The program's durable store (its state directory's); `None`: one in memory.
    pub store: Option<std::sync::Arc<dyn crate::store::Store>>,
    /// The program's durable store while it is still being opened (`store` left `None`): the
    /// VM is built meanwhile, and the script runs only once the store is open, or not at all
    /// when it cannot be (`crate::store::opening`).
    pub store_opening: Option<std::sync::Arc<crate::store::opening::OpeningStore>>,
    /// The application mails the program's residents from outside: the watch does not end
    /// when they are all idle.
    pub mails_in: bool,
    /// What the program may reach beyond colony's own calls (default: everything).
    pub permissions: std::sync::Arc<crate::permissions::Permissions>,
    /// The most Lua memory the program may hold, in bytes (default [`super::DEFAULT_MAX_MEMORY`]).
    pub max_memory: Option<usize>,
    /// Raised to stop Lua code that spins (the host's signal handling; the watch raises it on
    /// SIGINT and SIGTERM too).
    pub interrupt: super::watchdog::Interrupt,
    /// Who looks on from outside (`colony serve`): told every turn and route event.
    pub observer: Option<crate::residents::Observer>,
    /// What the program offers as an MCP server (its exportable tools, exported residents,
    /// resources, prompts), for the host that serves them.
    pub exports: Option<crate::mcp::server::Exports>,
    /// Keep the VM answering tool calls after the main chunk returns, until the program is
    /// stopped, when it exports something over MCP (`exports`).
    pub linger: bool,
    /// Where the residents run when several nodes share the program (a cluster).
    pub placement: Option<std::sync::Arc<dyn crate::residents::Placement>>,
    /// The program hears SIGINT and SIGTERM from its start, not only from its watch's
    /// (`colony run`): one before the watch ends it where it waits, so the run ends as any
    /// other and closes its store, where the signal's default action ended the process and
    /// left the store as a crash does. A host with signal handling of its own leaves it unset.
    pub signals_from_start: bool,
    /// The host keeps SIGINT and SIGTERM to itself (an application embedding colony): the
    /// program never listens for them. A listener is tokio's, installed for the process's
    /// life: once a program had listened, Ctrl-C and `kill` no longer ended the application,
    /// even after the program had ended.
    pub leaves_signals: bool,
}

/// In the VM's app data when its host keeps the signals to itself ([`HostSetup::leaves_signals`]).
pub(super) struct SignalsLeft;

/// The host's tools, by name, in the VM's app data.
pub struct HostTools(pub HashMap<String, ToolDef>);

/// The program's lifecycle, from the VM's app data.
pub fn lifecycle(lua: &Lua) -> Lifecycle {
    lua.app_data_ref::<Lifecycle>()
        .expect("the VM has a lifecycle")
        .clone()
}

pub fn register(lua: &Lua, ai: &Table) -> mlua::Result<()> {
    ai.set(
        "route",
        lua.create_function(|lua, opts: Value| {
            super::resident_spec::route(lua, super::convert::arg(lua, "ai.route", 1, opts)?)
        })?,
    )?;
    ai.set(
        "spawn",
        // Async only to open `mcp` servers first: without them the future is ready at once and
        // nothing yields.
        lua.create_async_function(|lua, opts: Value| async move {
            super::store::refuse_inside_update("ai.spawn")?;
            let opts: Table = super::convert::arg(&lua, "ai.spawn", 1, opts)?;
            let mut servers =
                super::turn::read_servers(&lua, opts.get::<Value>("mcp")?, "ai.spawn")?;
            super::mcp_client::apply_elicit(&lua, &opts, &mut servers, "ai.spawn")?;
            if servers.is_empty() {
                return Ok((spawn(&lua, opts, None)?, Value::Nil));
            }
            // An MCP tool may not take the name of one of the resident's own tools.
            let own = own_tool_names(&opts);
            let mut taken = own.clone();
            // The resident keeps its connections for the life of the program (its tools hold them).
            let opened = crate::mcp::toolset::open(servers, &mut taken).await;
            lifecycle(&lua).keep_servers(&opened.connections());
            let report = super::turn::servers_table(&lua, &opened.servers)?;
            let tools = crate::mcp::relisted::Relisted::new(own, opened.by_server);
            let name = spawn(&lua, opts, Some(std::sync::Arc::new(tools)))?;
            Ok((name, Value::Table(report)))
        })?,
    )?;
    ai.set(
        "mail",
        lua.create_function(|lua, opts: Value| {
            super::store::refuse_inside_update("ai.mail")?;
            mail(lua, super::convert::arg(lua, "ai.mail", 1, opts)?)
        })?,
    )?;
    ai.set(
        "dismiss",
        lua.create_function(|lua, name: Value| {
            super::store::refuse_inside_update("ai.dismiss")?;
            dismiss(
                lua,
                &super::convert::arg::<String>(lua, "ai.dismiss", 1, name)?,
            )
        })?,
    )?;
    ai.set("residents", lua.create_function(|lua, ()| residents(lua))?)?;
    ai.set(
        "unblock",
        lua.create_function(|lua, name: Value| {
            let name: String = super::convert::arg(lua, "ai.unblock", 1, name)?;
            let answer = match lifecycle(lua).unblock(&name) {
                Some(was) => Value::Boolean(was),
                None => {
                    return Ok(MultiValue::from_iter([
                        Value::Nil,
                        Value::String(lua.create_string("no_recipient")?),
                    ]));
                }
            };
            Ok(MultiValue::from_iter([answer]))
        })?,
    )?;
    ai.set(
        "stop",
        lua.create_function(|lua, reason: Value| {
            let reason: Option<String> = super::convert::arg(lua, "ai.stop", 1, reason)?;
            lifecycle(lua).stop(reason.unwrap_or_else(|| "ai.stop".into()));
            Ok(())
        })?,
    )?;
    // `ai.stopping()`: the stop's reason once the program is stopping (a tool finishing during
    // the grace period can wrap up), else nil.
    ai.set(
        "stopping",
        lua.create_function(|lua, ()| Ok(lifecycle(lua).stop_reason()))?,
    )?;
    ai.set(
        "inbound_provenance",
        lua.create_function(|lua, ()| match bridge::current_provenance() {
            None => Ok(Value::Nil),
            Some(p) => {
                let t = lua.create_table()?;
                // `ai` names the serving AI plainly; `to` (the same) is kept for older scripts.
                t.set("origin", p.origin)?;
                t.set("hop", p.hop)?;
                t.set("ai", p.to.as_str())?;
                t.set("to", p.to)?;
                Ok(Value::Table(t))
            }
        })?,
    )?;
    ai.set(
        "watch",
        lua.create_async_function(|lua, opts: Value| async move {
            watch(&lua, super::convert::arg(&lua, "ai.watch", 1, opts)?).await
        })?,
    )?;
    Ok(())
}

fn bad(who: &str, what: impl std::fmt::Display) -> mlua::Error {
    misuse(format!("{who}: {what}"))
}

/// `ai.spawn{...}` → the name: the table read, the resident hired.
fn spawn(
    lua: &Lua,
    opts: Table,
    mcp_tools: Option<std::sync::Arc<dyn crate::turn::DynamicTools>>,
) -> mlua::Result<String> {
    let life = lifecycle(lua);
    let offer = super::mcp_export::ResidentOffer::read(&opts)?;
    let (spec, sources) = read_spawn(lua, &life, opts, mcp_tools)?;
    let name = spec.name.clone();
    life.spawn(spec, sources)
        .map_err(|e| bad(&format!("ai.spawn {name:?}"), e))?;
    offer.offer(lua);
    Ok(name)
}

/// `ai.mail{ to, source, content, hop, files? }` → `true`, or `nil, err` where `err` names the
/// refusal and what it concerns: `no_recipient: "wroker"`, `hop_limit: hop 9 to "b" is above its
/// max_hop of 8`, `not_saved: ...`.
fn mail(lua: &Lua, opts: Table) -> mlua::Result<MultiValue> {
    let who = "ai.mail";
    check_fields(
        &opts,
        who,
        &["to", "source", "content", "hop", "files", "id"],
    )?;
    let text = |key: &str| -> mlua::Result<String> {
        match opts.get::<Value>(key)? {
            // Text that is not UTF-8 was said to be missing.
            Value::String(s) => s.to_str().map(|t| t.to_string()).map_err(|_| {
                bad(
                    who,
                    format!("{key} is not UTF-8 text (convert it, or send the bytes as a file)"),
                )
            }),
            _ => Err(bad(who, format!("{key} (a string) is required"))),
        }
    };
    let to = text("to")?;
    let source = text("source")?;
    let content = text("content")?;
    let hop = match opts.get::<Value>("hop")? {
        Value::Integer(n) if (0..=i64::from(u32::MAX)).contains(&n) => n as u32,
        Value::Number(n) if n >= 0.0 && n.fract() == 0.0 && n <= f64::from(u32::MAX) => n as u32,
        Value::Nil => {
            return Err(bad(
                who,
                "hop is required: 0 for a person or a clock, ai.inbound_provenance().hop + 1 when relaying",
            ));
        }
        _ => return Err(bad(who, "hop must be a whole number (0 or more)")),
    };
    let files = super::files::read_files(lua, opts.get("files")?, &format!("{who}: files"))?;
    let mut m = Mail::new(to, source, content, hop);
    m.files = files;
    m.id = opts
        .get::<Option<String>>("id")
        .map_err(|_| bad(who, "id must be a string"))?;
    if let Some(why) = Mail::id_refusal(m.id.as_deref()) {
        return Err(bad(who, why));
    }
    if let Some(why) = Mail::source_refusal(&m.source) {
        return Err(bad(who, why));
    }
    let (to, hop) = (m.to.clone(), m.hop);
    let life = lifecycle(lua);
    match life.mail_once(m) {
        Ok(Delivered::New) => Ok(MultiValue::from_iter([Value::Boolean(true)])),
        // Its id was accepted before: the first is served, not this one. A sender that reused
        // an id for another mail could not tell it was never to be served.
        Ok(Delivered::Repeated) => Ok(MultiValue::from_iter([
            Value::Boolean(true),
            Value::String(lua.create_string("duplicate")?),
        ])),
        Err(e) => Ok(MultiValue::from_iter([
            Value::Nil,
            Value::String(lua.create_string(life.refusal(e, &to, hop))?),
        ])),
    }
}

/// `ai.dismiss(name)` → `true`, or `nil, 'no_recipient: "name"'`.
fn dismiss(lua: &Lua, name: &str) -> mlua::Result<MultiValue> {
    if lifecycle(lua).dismiss(name) {
        Ok(MultiValue::from_iter([Value::Boolean(true)]))
    } else {
        Ok(MultiValue::from_iter([
            Value::Nil,
            Value::String(lua.create_string(format!("no_recipient: {name:?}"))?),
        ]))
    }
}

/// `ai.residents()` → `{ { name, state, conversation, held, dropped, restarts, refused, served,
/// error?, node? }, ... }` (`error` while blocked), spawned ones not yet registered (before the
/// watch) with state `pending`; in a cluster, each with its `node`, those running on another
/// node with state `elsewhere`.
fn residents(lua: &Lua) -> mlua::Result<Table> {
    let list = lua.create_table()?;
    for r in lifecycle(lua).residents() {
        let t = lua.create_table()?;
        t.set("name", r.name)?;
        t.set("state", r.state.as_str())?;
        t.set("conversation", r.conversation)?;
        t.set("held", r.held)?;
        t.set("dropped", r.dropped)?;
        t.set("restarts", r.restarts)?;
        t.set("refused", r.refused)?;
        t.set("served", r.served)?;
        t.set("node", r.node)?;
        if let Some(e) = &r.error {
            // A blocked resident's error: permanent, so `transient` is false.
            t.set("error", super::convert::turn_error(lua, e)?)?;
        }
        list.push(t)?;
    }
    Ok(list)
}

/// The watch's callbacks.
struct Hooks {
    on_crash: Option<Function>,
    on_fail: Option<Function>,
    on_blocked: Option<Function>,
}

/// `reason = ai.watch{ on_crash?, on_fail?, on_blocked?, grace_ms?, until_idle? }`.
async fn watch(lua: &Lua, opts: Option<Table>) -> mlua::Result<String> {
    let who = "ai.watch";
    let mut hooks = Hooks {
        on_crash: None,
        on_fail: None,
        on_blocked: None,
    };
    let mut options = WatchOptions::default();
    if let Some(opts) = &opts {
        check_fields(
            opts,
            who,
            &[
                "on_crash",
                "on_fail",
                "on_blocked",
                "grace_ms",
                "until_idle",
            ],
        )?;
        hooks.on_crash = opts
            .get::<Option<Function>>("on_crash")
            .map_err(|_| bad(who, "on_crash must be a function(id, name, message)"))?;
        hooks.on_fail = opts
            .get::<Option<Function>>("on_fail")
            .map_err(|_| bad(who, "on_fail must be a function(id, name, err)"))?;
        hooks.on_blocked = opts
            .get::<Option<Function>>("on_blocked")
            .map_err(|_| bad(who, "on_blocked must be a function(name, err)"))?;
        options.until_idle = flag(opts, "until_idle", who)?.unwrap_or(true);
        match opts.get::<Option<f64>>("grace_ms") {
            // More than a day is "wait for them": the deadline must still be a time.
            Ok(Some(ms)) if ms > 86_400_000.0 => options.grace = Duration::from_secs(86_400),
            // A negative one or NaN is told as every other duration is ("-1 ms is negative").
            Ok(Some(ms)) => options.grace = super::convert::millis_option(who, "grace_ms", ms)?,
            Ok(None) => {}
            _ => return Err(bad(who, "grace_ms must be a number of milliseconds")),
        }
    }
    options.handles_failures = hooks.on_fail.is_some();
    let hooks = &hooks;
    options.signals = lua.app_data_ref::<SignalsLeft>().is_none();
    // A tool spinning on this thread would keep the watch from hearing a signal: a listener on
    // the core's runtime stops such code through the VM's hook. Kept for the program's life: a
    // main chunk that spins after the watch is stopped too.
    if options.signals {
        listen_for_signals(lua);
    }
    let watched = lifecycle(lua)
        .watch(options, |event| on_event(lua, event, hooks))
        .await;
    // A signal (or `--max-time`) stopped the watch, not the script: what runs after it (a
    // report, a summary) runs to its end, as the watch's return lets it. Another signal then
    // ends the program where it stands.
    if let Some(interrupt) = lua.app_data_ref::<super::watchdog::Interrupt>() {
        interrupt.lower();
    }
    watched.map_err(|e| match e {
        WatchError::Hire(name, e) => bad(&format!("ai.spawn {name:?}"), e),
        WatchError::Signals(e) => {
            mlua::Error::runtime(format!("ai.watch: cannot listen for signals: {e}"))
        }
        e => bad(who, e),
    })
}

/// Starts the program's signal listener ([`super::watchdog::listen`]) unless it runs already:
/// kept in the VM's app data, for the program's life.
pub(super) fn listen_for_signals(lua: &Lua) {
    if lua.app_data_ref::<super::watchdog::Listening>().is_some() {
        return;
    }
    let program = lifecycle(lua);
    let runtime = program.route().core().handle().clone();
    if let Some(listening) = super::watchdog::listen(lua, &runtime, program.downgrade()) {
        lua.set_app_data(listening);
    }
}

/// Calls the hook an event is for.
async fn on_event(lua: &Lua, event: RouteEvent, hooks: &Hooks) {
    let (f, hook, id, ai, message) = match event {
        RouteEvent::Crashed { id, ai, message } => {
            (hooks.on_crash.as_ref(), "on_crash", id, ai, message)
        }
        RouteEvent::Failed { id, ai, message } => {
            (hooks.on_fail.as_ref(), "on_fail", id, ai, message)
        }
        RouteEvent::Gone { .. } | RouteEvent::Notice(_) => return,
        RouteEvent::Blocked { ai, error } => {
            if let Some(f) = &hooks.on_blocked {
                let told = match super::convert::turn_error(lua, &error) {
                    Ok(err) => {
                        let hook = f.call_async::<()>((ai.as_str(), err));
                        super::watchdog::as_callback(lua, hook).await
                    }
                    Err(e) => Err(e),
                };
                if let Err(e) = told {
                    tracing::warn!("[{ai}] on_blocked raised: {}", super::fault(&e));
                }
            }
            return;
        }
    };
    if let Some(f) = f
        && let Err(e) = super::watchdog::as_callback(
            lua,
            f.call_async::<()>((id.as_str(), ai.as_str(), message.as_str())),
        )
        .await
    {
        tracing::warn!("[{id}] {hook} raised: {}", super::fault(&e));
    }
}
