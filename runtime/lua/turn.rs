//! The turn part of the `ai` module: `ai.take_turn`, `ai.run` and `ai.infer_with_tools` (the
//! same turn under older names, kept as aliases), reading a turn's options into a
//! [`TurnSpec`] and its outcome back into a table. Tools are [`super::tools`].
//!
//! A script's own turns run on the Lua thread (the model calls are I/O); tool handlers and
//! callbacks are reached through the VM's [`LuaBridge`], each in its own coroutine, so the calls
//! of one step run concurrently.

use std::ffi::CStr;

use mlua::{Function, Lua, Table, Value};

use super::ai::{core, read_ask_from};
use super::bridge::{self, FnId, LuaBridge};
use super::convert::{error_table, to_json};
use super::fields::{self, Field};
use super::messages::{history_table, read_history};
use super::options::Options;
use super::tools::read_tools;
use crate::turn::{self, Compaction, DEFAULT_MAX_STEPS, EventKind, TurnOutcome, TurnSpec};
use crate::vocab::{Message, Usage};

pub fn register(lua: &Lua, ai: &Table) -> mlua::Result<()> {
    ai.set(
        "take_turn",
        lua.create_async_function(|lua, opts: Value| async move {
            let opts = super::convert::arg(&lua, "ai.take_turn", 1, opts)?;
            let (outcome, servers) =
                run_turn(&lua, opts, "ai.take_turn", DEFAULT_MAX_STEPS).await?;
            turn_table(&lua, outcome, servers, c"reply", c"tool_events")
        })?,
    )?;
    ai.set(
        "infer_with_tools",
        lua.create_async_function(|lua, opts: Value| async move {
            let opts = super::convert::arg(&lua, "ai.infer_with_tools", 1, opts)?;
            let (outcome, servers) =
                run_turn(&lua, opts, "ai.infer_with_tools", DEFAULT_MAX_STEPS).await?;
            turn_table(&lua, outcome, servers, c"reply", c"tool_events")
        })?,
    )?;
    ai.set(
        "run",
        lua.create_async_function(|lua, opts: Value| async move {
            let opts = super::convert::arg(&lua, "ai.run", 1, opts)?;
            let (outcome, servers) = run_turn(&lua, opts, "ai.run", DEFAULT_MAX_STEPS + 1).await?;
            turn_table(&lua, outcome, servers, c"text", c"tools")
        })?,
    )?;
    Ok(())
}

fn bad(who: &str, what: impl std::fmt::Display) -> mlua::Error {
    super::convert::misuse(format!("{who}: {what}"))
}

/// Where the audit lines of a script's own tool calls wait to share a transaction
/// (`store::audit_batch`): one per VM, so every turn on its thread shares it.
pub struct ScriptAudit(pub std::sync::Arc<crate::store::audit_batch::AuditBatch>);

/// Options a turn takes beside those of `ai.ask`.
const TURN_OPTIONS: &[&str] = &[
    "messages",
    "prompt",
    "files",
    "max_steps",
    "allow",
    "deny",
    "pin",
    "on_step",
    "on_tool",
    "compact",
    "context_window",
    "compact_at",
    "compact_prompt",
    "mcp",
    "dynamic_mcp",
    "middleware",
    "on_elicit",
];

/// What a turn reports of its MCP servers besides the outcome.
#[derive(Default)]
pub(crate) struct McpReport {
    servers: Option<Vec<crate::mcp::toolset::ServerReport>>,
    dynamic: Option<Vec<crate::mcp::dynamic::LiveServer>>,
}

/// Unregisters a turn's callbacks however the turn ends.
struct Registered<'a> {
    lua: &'a Lua,
    ids: Vec<FnId>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        for id in &self.ids {
            bridge::unregister(self.lua, *id);
        }
    }
}

async fn run_turn(
    lua: &Lua,
    opts: Table,
    who: &str,
    default_steps: u32,
) -> mlua::Result<(TurnOutcome, McpReport)> {
    let opts = Options::read(lua, opts, who)?;
    let tools_value = opts.get::<Value>("tools")?;
    // `read_ask` reads the shared options; the turn's tools are read below, handlers and all.
    let (mut ask, stream) = read_ask_from(lua, &opts, who, TURN_OPTIONS)?;
    let mut servers = read_servers(lua, opts.get::<Value>("mcp")?, who)?;
    super::mcp_client::apply_elicit(lua, opts.table(), &mut servers, who)?;
    let dynamic_allow = names(&opts, "dynamic_mcp", who)?;
    // A URL prefix lets the model reach that host: the program must be allowed to.
    for entry in &dynamic_allow {
        super::mcp::check_url(lua, &format!("{who}: dynamic_mcp"), entry)?;
    }
    let mut messages: Vec<Message> = match opts.get::<Value>("messages")? {
        Value::Nil => Vec::new(),
        v => read_history(lua, v, who)?,
    };
    let files = super::files::read_files(lua, opts.get("files")?, &format!("{who}: files"))?;
    if let Some(prompt) = opts.get::<Option<String>>("prompt")? {
        let mut message = Message::user(prompt);
        message
            .parts
            .extend(files.into_iter().map(crate::vocab::Part::File));
        messages.push(message);
    } else if !files.is_empty() {
        return Err(bad(
            who,
            "files ride on the prompt: give a prompt (or put them on a history entry)",
        ));
    }
    if messages.is_empty() {
        return Err(bad(who, "give a prompt or messages"));
    }
    ask.messages = messages;
    let mut spec = TurnSpec::new(ask);
    spec.max_steps = match opts.get::<Option<f64>>("max_steps") {
        Ok(Some(n)) => super::convert::count_option(who, "max_steps", n)?,
        Ok(None) => default_steps,
        Err(_) => return Err(bad(who, "max_steps must be a number")),
    };
    let mut registered = Registered {
        lua,
        ids: Vec::new(),
    };
    spec.tools = read_tools(lua, tools_value, who, &mut registered.ids)?;
    spec.allow = names(&opts, "allow", who)?;
    spec.deny = names(&opts, "deny", who)?;
    if let Some(pin) = opts.get::<Option<Table>>("pin")? {
        match to_json(lua, Value::Table(pin))? {
            serde_json::Value::Object(map) => spec.pin = map,
            _ => return Err(bad(who, "pin must be a table of argument names to values")),
        }
    }
    spec.compaction = read_compaction(&opts, who)?;
    let layers = super::middleware::read_layers(opts.get::<Value>("middleware")?, who)?;
    if let Some(f) = stream {
        let id = bridge::register(lua, f);
        registered.ids.push(id);
        spec.on_text = Some(id);
    }
    if let Some(f) = opts.get::<Option<Function>>("on_step")? {
        let id = bridge::register(lua, f);
        registered.ids.push(id);
        spec.on_step = Some(id);
    }
    if let Some(f) = opts.get::<Option<Function>>("on_tool")? {
        let id = bridge::register(lua, f);
        registered.ids.push(id);
        spec.on_tool = Some(id);
    }
    // A script's own tool calls go to the audit log too, as `script`.
    // Queued in the VM's batch: the turns in flight on this thread share a transaction.
    if let Some(store) = lua.app_data_ref::<super::store::ProgramStore>() {
        let hooks = crate::residents::persist::ResidentHooks::new(
            store.0.clone(),
            "script",
            false,
            Vec::new(),
            Vec::new(),
        );
        let hooks = match lua.app_data_ref::<ScriptAudit>() {
            Some(lines) => hooks.batched(lines.0.clone()),
            None => hooks,
        };
        spec.hooks = Some(std::sync::Arc::new(hooks));
    }
    let core = core(lua);
    let bridge = lua
        .app_data_ref::<LuaBridge>()
        .expect("the VM has a bridge")
        .clone();
    // Every server at once; one that fails is reported and the turn goes on with the others.
    let opened = if servers.is_empty() {
        None
    } else {
        let mut taken = spec.tools.iter().map(|t| t.spec.name.clone()).collect();
        Some(Box::pin(crate::mcp::toolset::open(servers, &mut taken)).await)
    };
    if let Some(o) = &opened {
        spec.tools.extend(o.tools());
    }
    let dynamic = if dynamic_allow.is_empty() {
        None
    } else {
        let reserved = spec.tools.iter().map(|t| t.spec.name.clone()).collect();
        let set = crate::mcp::dynamic::DynamicSet::new(
            dynamic_allow,
            core.config().mcp.clone(),
            reserved,
        );
        spec.dynamic = Some(set.clone());
        Some(set)
    };
    // `middleware = {...}`: the script's own turns get retries, a breaker and context as a
    // resident's do. A breaker's state is kept in the store (`ai/breaker/script`), so it
    // carries from one turn to the next.
    let stack = (!layers.is_empty()).then(|| {
        super::middleware::build_stack(
            core.clone(),
            &layers,
            &bridge,
            super::residents::lifecycle(lua).route(),
            "ai/breaker/script",
        )
    });
    // Boxed, as are the MCP futures above and below: this future is moved whole into the box
    // mlua makes of every call of `ai.run`, so what it holds inline is copied on every turn.
    let outcome = match &stack {
        Some(stack) => Box::pin(turn::take_turn(&core, &**stack, &bridge, spec)).await,
        None => Box::pin(turn::take_turn(&core, &core, &bridge, spec)).await,
    };
    drop(registered);
    let mut report = McpReport::default();
    if let Some(o) = opened {
        Box::pin(o.close()).await;
        report.servers = Some(o.servers);
    }
    if let Some(d) = dynamic {
        report.dynamic = Some(d.live());
        Box::pin(d.close()).await;
    }
    Ok((outcome, report))
}

/// `mcp = { { name, url } | { name, command, args, env, cwd } | "configured-name", ... }`.
pub(crate) fn read_servers(
    lua: &Lua,
    value: Value,
    who: &str,
) -> mlua::Result<Vec<crate::mcp::ServerSpec>> {
    let list = match value {
        Value::Nil => return Ok(Vec::new()),
        Value::Table(t) => t,
        other => {
            return Err(bad(
                who,
                format!("mcp must be a list of servers, not {}", other.type_name()),
            ));
        }
    };
    let mut specs: Vec<crate::mcp::ServerSpec> = Vec::new();
    for (i, v) in list.sequence_values::<Value>().enumerate() {
        let spec = match v? {
            // A configured name that is not (or no longer) configured fails like a server that
            // does not answer: reported in `servers`, and the turn goes on with the others.
            Value::String(name) => {
                let name = name.to_string_lossy();
                super::mcp::named(lua, &name).unwrap_or_else(|e| crate::mcp::ServerSpec {
                    name: name.clone(),
                    transport: crate::mcp::Transport::Unavailable {
                        reason: e.to_string(),
                    },
                    roots: Vec::new(),
                    elicit: None,
                    auth: None,
                    resources: false,
                    sampling: None,
                })
            }
            v => super::mcp::read_spec(lua, v, &format!("{who}: mcp[{}]", i + 1))?,
        };
        if specs.iter().any(|s| s.name == spec.name) {
            return Err(bad(
                who,
                format!("mcp: two servers are named {:?}", spec.name),
            ));
        }
        specs.push(spec);
    }
    Ok(specs)
}

/// The `servers` field of a turn's result: how each MCP server fared.
pub(crate) fn servers_table(
    lua: &Lua,
    reports: &[crate::mcp::toolset::ServerReport],
) -> mlua::Result<Table> {
    let list = lua.create_table()?;
    for r in reports {
        let row = lua.create_table()?;
        row.set("name", r.name.as_str())?;
        row.set("phase", r.phase)?;
        if let Some(v) = &r.version {
            row.set("version", v.as_str())?;
        }
        if let Some(e) = &r.error {
            row.set("error", error_table(lua, e.kind(), &e.to_string())?)?;
        }
        set_names(lua, &row, "tools", &r.tools)?;
        set_names(lua, &row, "dropped", &r.dropped)?;
        list.push(row)?;
    }
    Ok(list)
}

fn names(opts: &Options, key: &str, who: &str) -> mlua::Result<Vec<String>> {
    match opts.get::<Value>(key)? {
        Value::Nil => Ok(Vec::new()),
        Value::String(s) => Ok(vec![s.to_string_lossy()]),
        Value::Table(t) => t
            .sequence_values::<String>()
            .collect::<mlua::Result<_>>()
            .map_err(|_| bad(who, format!("{key} must be a list of tool names or globs"))),
        other => Err(bad(who, format!("{key} cannot be a {}", other.type_name()))),
    }
}

pub(crate) fn read_compaction(opts: &Options, who: &str) -> mlua::Result<Compaction> {
    let mut c = Compaction::default();
    match opts.get::<Option<String>>("compact")?.as_deref() {
        None | Some("client") => {}
        Some("off") => c.enabled = false,
        Some(other) => {
            return Err(bad(
                who,
                format!("compact = {other:?} (expected \"client\" or \"off\")"),
            ));
        }
    }
    // A window of 0, a negative one or NaN was read as 1 token: every turn then compacted, and
    // with tools failed ("the summary came back empty").
    let window = match opts.get::<Value>("context_window")? {
        Value::Nil => None,
        Value::Integer(n) => Some(n as f64),
        Value::Number(n) => Some(n),
        other => {
            return Err(bad(
                who,
                format!(
                    "context_window must be a number of tokens, not {}",
                    other.type_name()
                ),
            ));
        }
    };
    if let Some(w) = window {
        if !(w.is_finite() && w >= 1.0 && w.fract() == 0.0) {
            return Err(bad(
                who,
                format!(
                    "context_window must be a whole number of tokens from 1, not {}",
                    crate::duration::number_text(w)
                ),
            ));
        }
        c.context_window = w as u64;
    }
    if let Some(at) = opts.get::<Option<f64>>("compact_at")? {
        if !(0.0..=1.0).contains(&at) {
            return Err(bad(
                who,
                format!("compact_at = {at} (expected a fraction between 0 and 1)"),
            ));
        }
        c.compact_at = at;
    }
    if let Some(p) = opts.get::<Option<String>>("compact_prompt")? {
        c.prompt = p.into();
    }
    Ok(c)
}

pub fn usage_table(lua: &Lua, u: &Usage) -> mlua::Result<Table> {
    fields::record(lua, &usage_fields(u), None)
}

fn usage_fields(u: &Usage) -> Vec<(&'static CStr, Field<'static>)> {
    vec![
        (c"input", Field::count(u.input)),
        (c"output", Field::count(u.output)),
        (c"cache_read", Field::count(u.cache_read)),
        (c"cache_write", Field::count(u.cache_write)),
        (c"reasoning", Field::count(u.reasoning)),
    ]
}

/// A turn's outcome as a Lua table. `take_turn` names the reply `reply` and the events
/// `tool_events`; `ai.run` names them `text` and `tools`. Made in one protected call
/// ([`fields`]): it is built on every turn.
fn turn_table(
    lua: &Lua,
    o: TurnOutcome,
    mcp: McpReport,
    reply_key: &'static CStr,
    events_key: &'static CStr,
) -> mlua::Result<Table> {
    let events = o
        .tool_events
        .iter()
        .map(|e| {
            Field::Record(vec![
                (c"step", Field::Int(e.step.into())),
                (c"name", Field::Str(&e.name)),
                (c"call_id", Field::Str(&e.call_id)),
                (c"kind", Field::Str(kind_name(e.kind))),
                (c"ok", Field::Bool(e.kind == EventKind::Ok)),
                (c"outcome", Field::Str(&e.outcome)),
                (
                    c"duration_ms",
                    Field::Num(e.duration.as_secs_f64() * 1000.0),
                ),
            ])
        })
        .collect();
    // The transcript is built as Lua tables when first read: a loop that only wants the reply
    // (most of them) does not pay for it on every turn.
    let messages = o.messages;
    let lazy = lua.create_table()?;
    lazy.set(
        "__index",
        lua.create_function(move |lua, (t, key): (Table, Value)| {
            if matches!(&key, Value::String(s) if s == "messages") {
                let history = history_table(lua, &messages)?;
                t.raw_set("messages", &history)?;
                return Ok(Value::Table(history));
            }
            Ok(Value::Nil)
        })?,
    )?;
    let t = fields::record(
        lua,
        &[
            (reply_key, Field::Str(&o.reply)),
            (c"stop", Field::Str(o.stop.as_str())),
            (c"steps", Field::Int(o.steps.into())),
            (c"usage", Field::Record(usage_fields(&o.usage))),
            (c"compactions", Field::Int(o.compactions.into())),
            (events_key, Field::List(events)),
        ],
        Some(&lazy),
    )?;
    if let Some(e) = &o.error {
        t.raw_set("error", super::convert::turn_error(lua, e)?)?;
    }
    if let Some(servers) = &mcp.servers {
        t.raw_set("servers", servers_table(lua, servers)?)?;
    }
    if let Some(live) = &mcp.dynamic {
        let list = lua.create_table()?;
        for l in live {
            let row = lua.create_table()?;
            row.set("name", l.name.as_str())?;
            row.set("server", l.server.as_str())?;
            if let Some(v) = &l.version {
                row.set("version", v.as_str())?;
            }
            set_names(lua, &row, "tools", &l.tools)?;
            set_names(lua, &row, "dropped", &l.dropped)?;
            list.push(row)?;
        }
        t.raw_set("dynamic_mcp", list)?;
    }
    Ok(t)
}

fn kind_name(kind: EventKind) -> &'static str {
    kind.as_str()
}

/// `row[key]` = the names as a Lua list (a server's tools, or those it left out).
fn set_names(lua: &Lua, row: &Table, key: &str, names: &[String]) -> mlua::Result<()> {
    row.set(
        key,
        lua.create_sequence_from(names.iter().map(String::as_str))?,
    )
}
