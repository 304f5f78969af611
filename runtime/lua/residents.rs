//! The resident part of the `ai` module: `ai.route`, `ai.spawn`, `ai.mail`, `ai.dismiss`,
//! `ai.residents`, `ai.watch`, `ai.stop`, `ai.inbound_provenance`, and the sources.
//!
//! The route and the residents live on the core ([`crate::residents`]); this file reads the
//! script's tables into specs, and runs what must stay on the Lua thread: sources (each a local
//! task under its own restart policy, named `<ai>/source/<n>`) and the watch loop, which calls
//! `on_crash` / `on_fail` / `on_blocked` and ends on `ai.stop`, when every resident is gone, when
//! the program has settled (idle or blocked, [`crate::residents::Settled`]), or on SIGINT/SIGTERM.
//!
//! Residents spawned before `ai.watch` wait in a list and register, in order, when the watch
//! comes up; mail posted before that answers `no_recipient`.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use mlua::{Function, Lua, MultiValue, Table, Value};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::ai::read_ask;
use super::bridge::{self, LuaBridge};
use super::convert::{check_fields, flag, misuse};
use super::middleware::{Layer, build_stack, read_layers};
use super::turn::{read_compaction, read_tools};
use crate::core::{Ask, Core};
use crate::residents::mail::CAPACITY;
use crate::residents::middleware::SharedInfer;
use crate::residents::resident::DEFAULT_MAX_HOP;
use crate::residents::route::supervise_exit;
use crate::residents::supervision::{Decision, Exit, Supervisor};
use crate::residents::{
    Deliver, Delivery, Listener, Mail, ResidentSpec, Restart, RestartPolicy, Route, RouteEvent,
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
    /// The application mails the program's residents from outside: the watch does not end
    /// when they are all idle.
    pub mails_in: bool,
}

/// The host's tools, by name, in the VM's app data.
pub struct HostTools(pub HashMap<String, ToolDef>);

/// A program's residents: its route and what is Lua-side about them.
pub struct Program {
    pub route: Route,
    /// The core the residents use (the shared pool, not the Lua thread's own).
    core: Core,
    state: RefCell<State>,
    /// Held for an embedding application that mails in ([`HostSetup::mails_in`]).
    _host: Option<Listener>,
}

struct State {
    route_opened: bool,
    template: Ask,
    layers: Vec<Layer>,
    stack: Option<SharedInfer>,
    pending: Vec<Pending>,
    /// The names in `pending`, so a spawn checks for a taken name at once: a scan of the list
    /// made spawning n residents before the watch take time in n².
    pending_names: HashSet<String>,
    sources: HashMap<String, Vec<AbortHandle>>,
    watch: Watch,
    host: Option<mpsc::UnboundedSender<Delivery>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Watch {
    NotYet,
    Running,
    Ended,
}

struct Pending {
    spec: ResidentSpec,
    sources: Vec<Source>,
}

struct Source {
    func: Function,
    policy: RestartPolicy,
}

impl Program {
    pub fn new(
        core: Core,
        bridge: LuaBridge,
        host: &HostSetup,
        store: std::sync::Arc<dyn crate::store::Store>,
    ) -> Program {
        let route = Route::with_store(core.clone(), bridge, Some(store));
        Program {
            _host: host.mails_in.then(|| route.listen()),
            route,
            core,
            state: RefCell::new(State {
                route_opened: false,
                template: Ask::default(),
                layers: Vec::new(),
                stack: None,
                pending: Vec::new(),
                pending_names: HashSet::new(),
                sources: HashMap::new(),
                watch: Watch::NotYet,
                host: host.deliveries.clone(),
            }),
        }
    }
}

impl Program {
    /// Ends the sources forked for `ai`.
    fn end_sources(&self, ai: &str) {
        if let Some(handles) = self.state.borrow_mut().sources.remove(ai) {
            for h in handles {
                h.abort();
            }
        }
    }

    /// Ends `ai`'s sources after a report that it is gone, unless the name was hired again
    /// meanwhile (the sources under that name are then the new resident's).
    fn end_sources_of_gone(&self, ai: &str) {
        if self.route.resident(ai).is_none() {
            self.end_sources(ai);
        }
    }
}

fn program(lua: &Lua) -> mlua::AppDataRef<'_, Program> {
    lua.app_data_ref::<Program>().expect("the VM has a program")
}

fn bridge_of(lua: &Lua) -> LuaBridge {
    lua.app_data_ref::<LuaBridge>()
        .expect("the VM has a bridge")
        .clone()
}

pub fn register(lua: &Lua, ai: &Table) -> mlua::Result<()> {
    ai.set(
        "route",
        lua.create_function(|lua, opts: Option<Table>| route(lua, opts))?,
    )?;
    ai.set(
        "spawn",
        // Async only to open `mcp` servers first: without them the future is ready at once and
        // nothing yields.
        lua.create_async_function(|lua, opts: Table| async move {
            let servers = super::turn::read_servers(&lua, opts.get::<Value>("mcp")?, "ai.spawn")?;
            if servers.is_empty() {
                return Ok((spawn(&lua, opts, Vec::new())?, Value::Nil));
            }
            // An MCP tool may not take the name of one of the resident's own tools.
            let mut taken = own_tool_names(&opts);
            // The resident keeps its connections for the life of the program (its tools hold them).
            let opened = crate::mcp::toolset::open(servers, &mut taken).await;
            super::mcp::hold(&lua, &opened.connections);
            let name = spawn(&lua, opts, opened.tools)?;
            let report = super::turn::servers_table(&lua, &opened.servers)?;
            Ok((name, Value::Table(report)))
        })?,
    )?;
    ai.set(
        "mail",
        lua.create_function(|lua, opts: Table| mail(lua, opts))?,
    )?;
    ai.set(
        "dismiss",
        lua.create_function(|lua, name: String| dismiss(lua, &name))?,
    )?;
    ai.set("residents", lua.create_function(|lua, ()| residents(lua))?)?;
    ai.set(
        "unblock",
        lua.create_function(|lua, name: String| {
            let answer = match program(lua).route.unblock(&name) {
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
        lua.create_function(|lua, reason: Option<String>| {
            program(lua)
                .route
                .stop(reason.unwrap_or_else(|| "ai.stop".into()));
            Ok(())
        })?,
    )?;
    // `ai.stopping()`: the stop's reason once the program is stopping (a tool finishing during
    // the grace period can wrap up), else nil.
    ai.set(
        "stopping",
        lua.create_function(|lua, ()| Ok(program(lua).route.stop_reason()))?,
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
        lua.create_async_function(
            |lua, opts: Option<Table>| async move { watch(&lua, opts).await },
        )?,
    )?;
    Ok(())
}

fn bad(who: &str, what: impl std::fmt::Display) -> mlua::Error {
    misuse(format!("{who}: {what}"))
}

/// `ai.route{ provider / use / model ..., middleware = {...} }`: the defaults every resident
/// starts from. Once, before the first `ai.spawn`.
fn route(lua: &Lua, opts: Option<Table>) -> mlua::Result<()> {
    let who = "ai.route";
    let p = program(lua);
    let mut st = p.state.borrow_mut();
    if st.route_opened {
        return Err(bad(who, "the route is already open (call ai.route once)"));
    }
    if !st.pending.is_empty() || !p.route.is_empty() {
        return Err(bad(who, "call ai.route before the first ai.spawn"));
    }
    let middleware = match &opts {
        Some(t) => t.get::<Value>("middleware")?,
        None => Value::Nil,
    };
    let (template, stream) = read_ask(lua, opts, who, &["middleware"])?;
    if stream.is_some() {
        return Err(bad(who, "stream is not a route setting"));
    }
    st.layers = read_layers(middleware, who)?;
    st.template = template;
    st.route_opened = true;
    Ok(())
}

const SPAWN_FIELDS: &[&str] = &[
    "name",
    "tools",
    "sources",
    "deliver_to",
    "max_steps",
    "workspace",
    "persist_conversation",
    "middleware",
    "restart",
    "max_restarts",
    "restart_window_ms",
    "max_hop",
    "mailbox",
    "compact",
    "context_window",
    "compact_at",
    "compact_prompt",
    "mcp",
];

/// `ai.spawn{ name, system?, tools?, sources?, deliver_to?, max_steps?, middleware?, restart?,
/// max_hop?, mailbox?, mcp?, use / provider / model ... }` → the name, and with `mcp` the servers' report.
fn spawn(lua: &Lua, opts: Table, mcp_tools: Vec<crate::turn::ToolDef>) -> mlua::Result<String> {
    let who = "ai.spawn";
    let name: String = opts
        .get::<Option<String>>("name")
        .ok()
        .flatten()
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| bad(who, "name (a non-empty string) is required"))?;
    let who = &format!("ai.spawn {name:?}");
    if name.contains('/') {
        return Err(bad(who, "a name cannot contain '/'"));
    }
    let persist = flag(&opts, "persist_conversation", who)?.unwrap_or(false);
    let workspace = opts
        .get::<Option<String>>("workspace")
        .map_err(|_| bad(who, "workspace must be a name (a string)"))?;
    let tools_value = opts.get::<Value>("tools")?;
    let sources_value = opts.get::<Value>("sources")?;
    let deliver_value = opts.get::<Value>("deliver_to")?;
    let middleware = opts.get::<Value>("middleware")?;
    let (own, stream) = read_ask(lua, Some(opts.clone()), who, SPAWN_FIELDS)?;
    if stream.is_some() {
        return Err(bad(
            who,
            "stream is not a resident setting (use deliver_to)",
        ));
    }
    let mut inline = Vec::new();
    let mut tools = read_tools(lua, tools_value, who, &mut inline)?;
    tools.extend(mcp_tools);
    let restart = read_policy(&opts, who, Restart::Permanent)?;
    let max_steps = positive(&opts, who, "max_steps")?.unwrap_or(8);
    let max_hop = match opts.get::<Option<f64>>("max_hop") {
        Ok(Some(n)) if n >= 0.0 => n as u32,
        Ok(None) => DEFAULT_MAX_HOP,
        _ => return Err(bad(who, "max_hop must be a count (0 or more)")),
    };
    let mailbox = positive(&opts, who, "mailbox")?.map_or(CAPACITY, |n| n as usize);
    let compaction = read_compaction(&opts, who)?;
    let sources = read_sources(&sources_value, who)?;
    let p = program(lua);
    let bridge = bridge_of(lua);
    let deliver = match deliver_value {
        Value::Nil => Deliver::Nobody,
        Value::Function(f) => Deliver::Script(
            std::sync::Arc::new(bridge.clone()),
            bridge::register(lua, f),
        ),
        Value::String(s) if s == "host" => match &p.state.borrow().host {
            Some(tx) => Deliver::Channel(tx.clone()),
            None => Deliver::Stdout,
        },
        other => {
            return Err(bad(
                who,
                format!(
                    "deliver_to must be a function(reply, info) or \"host\", not {}",
                    other.type_name()
                ),
            ));
        }
    };
    let layers = read_layers(middleware.clone(), who)?;
    let stack = if matches!(middleware, Value::Nil) {
        let mut st = p.state.borrow_mut();
        let layers = st.layers.clone();
        st.stack
            .get_or_insert_with(|| {
                build_stack(
                    p.core.clone(),
                    &layers,
                    &bridge,
                    p.route.store(),
                    "ai/breaker",
                )
            })
            .clone()
    } else {
        let key = format!("ai/breaker/{name}");
        build_stack(p.core.clone(), &layers, &bridge, p.route.store(), &key)
    };
    let ask = merge(&p.state.borrow().template, own);
    let spec = ResidentSpec {
        name: name.clone(),
        ask,
        tools,
        max_steps,
        max_hop,
        mailbox,
        compaction,
        deliver,
        restart,
        stack,
        persist,
        workspace,
    };
    let watching = p.state.borrow().watch == Watch::Running;
    if watching {
        hire(&p, spec, sources).map_err(|e| bad(who, e))?;
    } else {
        let mut st = p.state.borrow_mut();
        if st.watch == Watch::Ended {
            return Err(bad(who, "the watch has ended"));
        }
        if !st.pending_names.insert(name.clone()) {
            return Err(bad(who, format!("an AI named {name:?} is already spawned")));
        }
        st.pending.push(Pending { spec, sources });
    }
    Ok(name)
}

/// The route's settings under the resident's own: each field the resident sets wins.
fn merge(route: &Ask, own: Ask) -> Ask {
    let r = &route.overrides;
    let o = own.overrides;
    Ask {
        overrides: crate::config::Overrides {
            use_type: o.use_type.or_else(|| r.use_type.clone()),
            provider: o.provider.or_else(|| r.provider.clone()),
            model: o.model.or_else(|| r.model.clone()),
            key: o.key.or_else(|| r.key.clone()),
            base_url: o.base_url.or_else(|| r.base_url.clone()),
            timeout: o.timeout.or(r.timeout),
            max_tokens: o.max_tokens.or(r.max_tokens),
            temperature: o.temperature.or(r.temperature),
        },
        system: own.system.or_else(|| route.system.clone()),
        messages: Vec::new(),
        tools: Vec::new(),
        tool_choice: own.tool_choice,
        stop_sequences: if own.stop_sequences.is_empty() {
            route.stop_sequences.clone()
        } else {
            own.stop_sequences
        },
        extra: own.extra.or_else(|| route.extra.clone()),
    }
}

fn positive(opts: &Table, who: &str, key: &str) -> mlua::Result<Option<u32>> {
    match opts.get::<Option<f64>>(key) {
        Ok(Some(n)) if n >= 1.0 => Ok(Some(n as u32)),
        Ok(None) => Ok(None),
        _ => Err(bad(
            who,
            format!("{key} must be a whole number of 1 or more"),
        )),
    }
}

/// `restart = "permanent" | "transient" | "temporary"`, `max_restarts`, `restart_window_ms`.
fn read_policy(t: &Table, who: &str, default: Restart) -> mlua::Result<RestartPolicy> {
    let restart = match t.get::<Value>("restart")? {
        Value::Nil => default,
        Value::String(s) => Restart::parse(&s.to_string_lossy()).ok_or_else(|| {
            bad(
                who,
                format!(
                    "restart = {:?} (expected \"permanent\", \"transient\" or \"temporary\")",
                    s.to_string_lossy()
                ),
            )
        })?,
        other => {
            return Err(bad(
                who,
                format!("restart cannot be a {}", other.type_name()),
            ));
        }
    };
    let mut policy = RestartPolicy::new(restart);
    match t.get::<Option<f64>>("max_restarts") {
        Ok(Some(n)) if n >= 0.0 => policy.max_restarts = n as u32,
        Ok(None) => {}
        _ => return Err(bad(who, "max_restarts must be a count (0 or more)")),
    }
    match t.get::<Option<f64>>("restart_window_ms") {
        Ok(Some(ms)) if ms > 0.0 => {
            policy.window = super::convert::millis_option(who, "restart_window_ms", ms)?
        }
        Ok(None) => {}
        _ => {
            return Err(bad(
                who,
                "restart_window_ms must be a number of milliseconds",
            ));
        }
    }
    Ok(policy)
}

/// `sources = { f, { f, restart = "permanent", max_restarts = 5 }, ... }`. A source is restarted
/// only after a crash unless it says otherwise (`transient`): one that returns has finished.
fn read_sources(value: &Value, who: &str) -> mlua::Result<Vec<Source>> {
    let list = match value {
        Value::Nil => return Ok(Vec::new()),
        Value::Table(t) => t,
        other => {
            return Err(bad(
                who,
                format!(
                    "sources must be a list of functions, not {}",
                    other.type_name()
                ),
            ));
        }
    };
    let mut sources = Vec::new();
    for (i, v) in list.sequence_values::<Value>().enumerate() {
        let at = format!("{who}: sources[{}]", i + 1);
        match v? {
            Value::Function(func) => sources.push(Source {
                func,
                policy: RestartPolicy::new(Restart::Transient),
            }),
            Value::Table(t) => {
                for pair in t.pairs::<Value, Value>() {
                    let (k, _) = pair?;
                    let ok = match &k {
                        Value::Integer(1) => true,
                        Value::String(s) => {
                            matches!(
                                s.to_string_lossy().as_str(),
                                "restart" | "max_restarts" | "restart_window_ms"
                            )
                        }
                        _ => false,
                    };
                    if !ok {
                        return Err(misuse(format!(
                            "{at}: a source table is {{ function, restart?, max_restarts?, restart_window_ms? }}"
                        )));
                    }
                }
                let func: Function = t
                    .get(1)
                    .map_err(|_| misuse(format!("{at}: the first entry must be the function")))?;
                let policy = read_policy(&t, &at, Restart::Transient)?;
                sources.push(Source { func, policy });
            }
            other => {
                return Err(misuse(format!(
                    "{at} must be a function, not {}",
                    other.type_name()
                )));
            }
        }
    }
    Ok(sources)
}

/// Registers a resident on the route and forks its sources.
fn hire(p: &Program, spec: ResidentSpec, sources: Vec<Source>) -> Result<(), String> {
    let name = spec.name.clone();
    let workspace = spec.workspace.clone();
    p.route.spawn(spec).map_err(|e| e.to_string())?;
    let handles: Vec<AbortHandle> = sources
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let id = format!("{name}/source/{}", i + 1);
            // Listening from now: the program cannot settle before the source has run.
            let run = run_source(p.route.clone(), p.route.listen(), id, name.clone(), s);
            match &workspace {
                Some(w) => tokio::task::spawn_local(super::store::WORKSPACE.scope(w.clone(), run)),
                None => tokio::task::spawn_local(run),
            }
            .abort_handle()
        })
        .collect();
    p.state.borrow_mut().sources.insert(name, handles);
    Ok(())
}

/// One source under its restart policy. `self` is the AI's name. While it runs it may mail:
/// `_listening` is dropped when it ends (or is aborted).
async fn run_source(route: Route, _listening: Listener, id: String, ai: String, source: Source) {
    let mut supervisor = Supervisor::new(source.policy);
    loop {
        let exit = match source.func.call_async::<()>(ai.as_str()).await {
            Ok(()) => Exit::Normal,
            Err(e) => Exit::Crashed(super::fault(&e)),
        };
        if route.stopping() {
            return;
        }
        match supervise_exit(&mut supervisor, exit, &id, &ai, &|e| route.report(e)) {
            Decision::Restart => continue,
            Decision::Done | Decision::Failed => return,
        }
    }
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
        opts.get::<Option<String>>(key)
            .ok()
            .flatten()
            .ok_or_else(|| bad(who, format!("{key} (a string) is required")))
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
    let (to, hop) = (m.to.clone(), m.hop);
    let route = &program(lua).route;
    match route.mail(m) {
        Ok(()) => Ok(MultiValue::from_iter([Value::Boolean(true)])),
        Err(e) => Ok(MultiValue::from_iter([
            Value::Nil,
            Value::String(lua.create_string(route.refusal(e, &to, hop))?),
        ])),
    }
}

/// `ai.dismiss(name)` → `true`, or `nil, 'no_recipient: "name"'`.
fn dismiss(lua: &Lua, name: &str) -> mlua::Result<MultiValue> {
    let p = program(lua);
    let removed_pending = {
        let mut st = p.state.borrow_mut();
        let before = st.pending.len();
        let persisted = st
            .pending
            .iter()
            .any(|q| q.spec.name == name && q.spec.persist);
        st.pending.retain(|q| q.spec.name != name);
        st.pending_names.remove(name);
        if persisted
            && let Some(store) = p.route.store()
            && let Err(e) = store.clear_cell(name)
        {
            tracing::error!(ai = %name, "cannot clear its saved conversation: {e}");
        }
        st.pending.len() != before
    };
    let dismissed = p.route.dismiss(name);
    p.end_sources(name);
    if dismissed || removed_pending {
        Ok(MultiValue::from_iter([Value::Boolean(true)]))
    } else {
        Ok(MultiValue::from_iter([
            Value::Nil,
            Value::String(lua.create_string(format!("no_recipient: {name:?}"))?),
        ]))
    }
}

/// `ai.residents()` → `{ { name, state, conversation, held, dropped, restarts, refused, served,
/// error? }, ... }` (`error` while blocked), spawned ones not yet registered (before the watch)
/// with state `pending`.
fn residents(lua: &Lua) -> mlua::Result<Table> {
    let p = program(lua);
    let list = lua.create_table()?;
    for r in p.route.residents() {
        let t = lua.create_table()?;
        t.set("name", r.name)?;
        t.set("state", r.state.as_str())?;
        t.set("conversation", r.conversation)?;
        t.set("held", r.held)?;
        t.set("dropped", r.dropped)?;
        t.set("restarts", r.restarts)?;
        t.set("refused", r.refused)?;
        t.set("served", r.served)?;
        if let Some(e) = &r.error {
            t.set("error", turn_error(lua, e)?)?;
        }
        list.push(t)?;
    }
    for q in &p.state.borrow().pending {
        let t = lua.create_table()?;
        t.set("name", q.spec.name.as_str())?;
        t.set("state", "pending")?;
        t.set("conversation", 0)?;
        t.set("held", 0)?;
        t.set("dropped", 0)?;
        t.set("restarts", 0)?;
        t.set("refused", 0)?;
        t.set("served", 0)?;
        list.push(t)?;
    }
    Ok(list)
}

/// A blocked resident's error as the Lua API's errors are: `{ kind, message, status?,
/// transient = false }`, `tostring` giving `kind: message`.
fn turn_error(lua: &Lua, e: &crate::turn::TurnError) -> mlua::Result<Table> {
    let t = super::convert::error_table(lua, &e.kind, &e.message)?;
    t.set("transient", false)?;
    if let Some(status) = e.status {
        t.set("status", status)?;
    }
    Ok(t)
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
    let mut grace = crate::residents::route::DEFAULT_GRACE;
    let mut until_idle = true;
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
        until_idle = flag(opts, "until_idle", who)?.unwrap_or(true);
        match opts.get::<Option<f64>>("grace_ms") {
            Ok(Some(ms)) if ms >= 0.0 => {
                // More than a day is "wait for them": the deadline must still be a time.
                grace = super::convert::millis_option(who, "grace_ms", ms)?
                    .min(Duration::from_secs(86_400))
            }
            Ok(None) => {}
            _ => return Err(bad(who, "grace_ms must be a number of milliseconds")),
        }
    }
    let (route, mut events) = {
        let p = program(lua);
        let mut st = p.state.borrow_mut();
        if st.watch != Watch::NotYet {
            return Err(bad(who, "the watch runs once per program"));
        }
        st.watch = Watch::Running;
        let Some(events) = p.route.events() else {
            return Err(bad(
                who,
                "the route's events were taken by the host application: only one watcher can have them",
            ));
        };
        let pending = std::mem::take(&mut st.pending);
        drop(st);
        p.route.set_grace(grace);
        // Everyone registers before the route opens, so no early mail finds a name missing.
        // Their sources, forked here, first run once this function waits.
        for q in pending {
            let name = q.spec.name.clone();
            hire(&p, q.spec, q.sources).map_err(|e| bad(&format!("ai.spawn {name:?}"), e))?;
        }
        p.route.open();
        (p.route.clone(), events)
    };
    if route.is_empty() {
        route.stop("there are no residents");
    }
    let mut terminate = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut interrupt = signal(tokio::signal::unix::SignalKind::interrupt())?;
    let reason = loop {
        tokio::select! {
            biased;
            reason = route.stopped() => break reason,
            _ = terminate.recv() => route.stop("SIGTERM"),
            _ = interrupt.recv() => route.stop("SIGINT"),
            Some(event) = events.recv() => on_event(lua, event, &hooks).await,
            // Idle or blocked with nothing left to bring mail: the program has ended by itself.
            _ = route.changed(), if until_idle => {
                // Hooks first: on_blocked may unblock the resident it is told of.
                route.settle_when(|| events.is_empty());
            }
        }
    };
    // No new turns start; sources end now; turns in flight get the grace period.
    {
        let p = program(lua);
        let mut st = p.state.borrow_mut();
        for (_, handles) in st.sources.drain() {
            for h in handles {
                h.abort();
            }
        }
        st.watch = Watch::Ended;
    }
    let cut = route.shutdown(grace).await;
    if cut > 0 {
        tracing::warn!("{cut} resident(s) were still busy after the grace period and were stopped");
    }
    // Failures reported while stopping still reach the callbacks.
    while let Ok(event) = events.try_recv() {
        on_event(lua, event, &hooks).await;
    }
    Ok(reason)
}

fn signal(kind: tokio::signal::unix::SignalKind) -> mlua::Result<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(kind)
        .map_err(|e| mlua::Error::runtime(format!("ai.watch: cannot listen for signals: {e}")))
}

async fn on_event(lua: &Lua, event: RouteEvent, hooks: &Hooks) {
    let (f, hook, id, ai, message) = match event {
        RouteEvent::Crashed { id, ai, message } => {
            (hooks.on_crash.as_ref(), "on_crash", id, ai, message)
        }
        RouteEvent::Failed { id, ai, message } => {
            // A failed resident's sources end with it.
            if id == ai {
                program(lua).end_sources_of_gone(&ai);
            }
            (hooks.on_fail.as_ref(), "on_fail", id, ai, message)
        }
        RouteEvent::Gone { ai } => {
            program(lua).end_sources_of_gone(&ai);
            return;
        }
        RouteEvent::Blocked { ai, error } => {
            if let Some(f) = &hooks.on_blocked {
                let told = match turn_error(lua, &error) {
                    Ok(err) => f.call_async::<()>((ai.as_str(), err)).await,
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
        && let Err(e) = f
            .call_async::<()>((id.as_str(), ai.as_str(), message.as_str()))
            .await
    {
        tracing::warn!("[{id}] {hook} raised: {}", super::fault(&e));
    }
}

/// The names of the tools an `ai.spawn` table lists (tool values, definitions, or names).
fn own_tool_names(opts: &Table) -> std::collections::HashSet<String> {
    use mlua::ObjectLike;
    let Ok(Value::Table(tools)) = opts.get::<Value>("tools") else {
        return Default::default();
    };
    tools
        .sequence_values::<Value>()
        .flatten()
        .filter_map(|v| match v {
            Value::String(s) => Some(s.to_string_lossy()),
            Value::Table(t) => t.get::<Option<String>>("name").ok().flatten(),
            Value::UserData(u) => u.get::<Option<String>>("name").ok().flatten(),
            _ => None,
        })
        .collect()
}
