//! The turn-level part of the `ai` module: `ai.tool`, `ai.take_turn`, `ai.run`, `ai.infer`,
//! `ai.infer_with_tools`, `ai.infer_structured` and `ai.parallel`.
//!
//! A script's own turns run on the Lua thread (the model calls are I/O); tool handlers and
//! callbacks are reached through the VM's [`LuaBridge`], each in its own coroutine, so the calls
//! of one step run concurrently.

use mlua::{
    Function, Lua, MetaMethod, MultiValue, Table, UserData, UserDataFields, UserDataMethods, Value,
};

use super::ai::{core, read_ask};
use super::bridge::{self, FnId, LuaBridge};
use super::convert::{error_table, from_json, to_json};
use super::messages::{history_table, read_history};
use crate::turn::{self, Compaction, EventKind, Handler, ToolDef, TurnOutcome, TurnSpec};
use crate::vocab::{Message, Usage};

/// A tool made by `ai.tool`: usable in `tools = {...}` of every call. Its handler stays
/// registered with the bridge for the life of the program, so define tools once (at the top
/// level), not inside a loop; a tool given inline as a table lives only for its turn.
pub struct ToolValue(pub ToolDef);

impl UserData for ToolValue {
    /// `tool(args)` runs the handler directly (from another tool, say), arguments checked against
    /// the schema first; it returns what the handler returns.
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_async_meta_method(MetaMethod::Call, |lua, this, args: Value| async move {
            let def = this.0.clone();
            drop(this);
            let json = to_json(&lua, args.clone())?;
            let violations = def.violations(&json);
            if !violations.is_empty() {
                return Err(bad(
                    &def.spec.name,
                    format!(
                        "arguments do not match the schema: {}",
                        violations.join("; ")
                    ),
                ));
            }
            let run = match &def.handler {
                Handler::Lua(id) => {
                    let handler = bridge::function(&lua, *id)
                        .ok_or_else(|| bad(&def.spec.name, "the handler is gone"))?;
                    let ctx = lua.create_table()?;
                    ctx.set("name", def.spec.name.as_str())?;
                    return handler.call_async::<MultiValue>((args, ctx)).await;
                }
                Handler::Native(f) => f(json),
                // Called directly, a tool answers its text (the files are for a model).
                Handler::Attaching(f) => {
                    let run = f(json);
                    Box::pin(async move {
                        run.await
                            .map(|(text, _files)| serde_json::Value::String(text))
                    })
                }
                Handler::ViewFile => {
                    return Err(bad(&def.spec.name, "view_file runs inside a turn"));
                }
            };
            match core(&lua).handle().spawn(run).await {
                Ok(Ok(v)) => Ok(MultiValue::from_iter([from_json(&lua, &v)?])),
                Ok(Err(e)) => Err(mlua::Error::runtime(e)),
                Err(e) => Err(mlua::Error::runtime(format!(
                    "tool {} panicked: {e}",
                    def.spec.name
                ))),
            }
        });
    }

    fn add_fields<F: UserDataFields<Self>>(fields: &mut F) {
        fields.add_field_method_get("name", |_, t| Ok(t.0.spec.name.clone()));
        fields.add_field_method_get("description", |_, t| Ok(t.0.spec.description.clone()));
        fields.add_field_method_get("parameters", |lua, t| from_json(lua, &t.0.spec.parameters));
        fields.add_field_method_get("timeout", |_, t| Ok(t.0.timeout.as_secs_f64()));
        fields.add_field_method_get("exportable", |_, t| Ok(t.0.exportable));
        fields.add_field_method_get("idempotent", |_, t| Ok(t.0.idempotent));
    }
}

pub fn register(lua: &Lua, ai: &Table) -> mlua::Result<()> {
    ai.set(
        "tool",
        lua.create_function(|lua, spec: Table| tool(lua, spec))?,
    )?;
    ai.set(
        "take_turn",
        lua.create_async_function(|lua, opts: Table| async move {
            let (outcome, servers) = run_turn(&lua, opts, "ai.take_turn", 8).await?;
            turn_table(&lua, outcome, servers, "reply", "tool_events")
        })?,
    )?;
    ai.set(
        "infer_with_tools",
        lua.create_async_function(|lua, opts: Table| async move {
            let (outcome, servers) = run_turn(&lua, opts, "ai.infer_with_tools", 8).await?;
            turn_table(&lua, outcome, servers, "reply", "tool_events")
        })?,
    )?;
    ai.set(
        "run",
        lua.create_async_function(|lua, opts: Table| async move {
            let (outcome, servers) = run_turn(&lua, opts, "ai.run", 9).await?;
            turn_table(&lua, outcome, servers, "text", "tools")
        })?,
    )?;
    ai.set(
        "infer_structured",
        lua.create_async_function(|lua, opts: Table| async move { structured(&lua, opts).await })?,
    )?;
    ai.set(
        "parallel",
        lua.create_async_function(|_, fns: MultiValue| async move { parallel(fns).await })?,
    )?;
    Ok(())
}

fn bad(who: &str, what: impl std::fmt::Display) -> mlua::Error {
    super::convert::misuse(format!("{who}: {what}"))
}

const TOOL_FIELDS: &[&str] = &[
    "name",
    "description",
    "parameters",
    "handler",
    "timeout",
    "exportable",
    "idempotent",
    "rate",
];

/// `ai.tool{ name, description, parameters, handler, timeout?, exportable?, idempotent?, rate? }`.
fn tool(lua: &Lua, spec: Table) -> mlua::Result<ToolValue> {
    super::convert::check_fields(&spec, "ai.tool", TOOL_FIELDS)?;
    Ok(ToolValue(tool_def(lua, &spec, "ai.tool")?))
}

fn tool_def(lua: &Lua, spec: &Table, who: &str) -> mlua::Result<ToolDef> {
    let name: String = spec
        .get("name")
        .map_err(|_| bad(who, "a tool needs a name (a string)"))?;
    let description: Option<String> = spec
        .get("description")
        .map_err(|_| bad(who, format!("tool {name}: description must be a string")))?;
    let handler: Function = spec
        .get("handler")
        .map_err(|_| bad(who, format!("tool {name} needs a handler function")))?;
    let parameters = match spec.get::<Value>("parameters")? {
        Value::Nil => serde_json::Value::Null,
        v => to_json(lua, v)?,
    };
    let timeout = match spec.get::<Option<f64>>("timeout") {
        Ok(t) => t
            .map(|s| super::convert::seconds_option(who, &format!("tool {name}: timeout"), s))
            .transpose()?,
        Err(_) => {
            return Err(bad(
                who,
                format!("tool {name}: timeout is seconds (a number)"),
            ));
        }
    };
    let id = bridge::register(lua, handler);
    let mut def = ToolDef::new(
        &name,
        &description.unwrap_or_default(),
        parameters,
        timeout,
        Handler::Lua(id),
    )
    .map_err(|e| {
        bridge::unregister(lua, id);
        bad(who, e)
    })?;
    let who_tool = format!("{who}: tool {name}");
    def.exportable = super::convert::flag(spec, "exportable", &who_tool)?.unwrap_or(false);
    def.idempotent = super::convert::flag(spec, "idempotent", &who_tool)?.unwrap_or(false);
    def.rate = match spec.get::<Value>("rate")? {
        Value::Nil => None,
        Value::String(s) => Some(crate::rate::RateLimit::new(
            crate::rate::Rate::parse(&s.to_string_lossy())
                .map_err(|e| bad(&who_tool, format!("rate: {e}")))?,
        )),
        other => {
            return Err(bad(
                &who_tool,
                format!("rate is a string (\"10/min\"), not a {}", other.type_name()),
            ));
        }
    };
    Ok(def)
}

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
    let tools_value = opts.get::<Value>("tools")?;
    // `read_ask` reads the shared options; the turn's tools are read below, handlers and all.
    let (mut ask, stream) = read_ask(lua, Some(opts.clone()), who, TURN_OPTIONS)?;
    let servers = read_servers(lua, opts.get::<Value>("mcp")?, who)?;
    let dynamic_allow = names(&opts, "dynamic_mcp", who)?;
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
        Ok(n) => n.map(|n| n.max(1.0) as u32).unwrap_or(default_steps),
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
    if let Some(store) = lua.app_data_ref::<super::store::ProgramStore>() {
        spec.hooks = Some(std::sync::Arc::new(
            crate::residents::persist::ResidentHooks::new(
                store.0.clone(),
                "script",
                false,
                Vec::new(),
                0,
            ),
        ));
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
        Some(crate::mcp::toolset::open(servers, &mut taken).await)
    };
    if let Some(o) = &opened {
        spec.tools.extend(o.tools.iter().cloned());
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
        let store = lua
            .app_data_ref::<super::store::ProgramStore>()
            .map(|s| s.0.clone());
        super::middleware::build_stack(
            core.clone(),
            &layers,
            &bridge,
            store.as_ref(),
            "ai/breaker/script",
        )
    });
    let outcome = match &stack {
        Some(stack) => turn::take_turn(&core, &**stack, &bridge, spec).await,
        None => turn::take_turn(&core, &core, &bridge, spec).await,
    };
    drop(registered);
    let mut report = McpReport::default();
    if let Some(o) = opened {
        o.close().await;
        report.servers = Some(o.servers);
    }
    if let Some(d) = dynamic {
        report.dynamic = Some(d.live());
        d.close().await;
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

/// The turn's tools: `ai.tool` values as they are, inline tables made into tools whose handler
/// ids go into `inline` (unregistered when the turn ends).
pub(crate) fn read_tools(
    lua: &Lua,
    value: Value,
    who: &str,
    inline: &mut Vec<FnId>,
) -> mlua::Result<Vec<ToolDef>> {
    let list = match value {
        Value::Nil => return Ok(Vec::new()),
        Value::Table(t) => t,
        other => {
            return Err(bad(
                who,
                format!("tools must be a list, not {}", other.type_name()),
            ));
        }
    };
    let mut tools = Vec::new();
    for (i, entry) in list.sequence_values::<Value>().enumerate() {
        match entry? {
            Value::UserData(ud) => {
                let t = ud
                    .borrow::<ToolValue>()
                    .map_err(|_| bad(who, format!("tools[{}] is not a tool", i + 1)))?;
                tools.push(t.0.clone());
            }
            Value::String(name) => {
                let name = name.to_string_lossy();
                let host = lua.app_data_ref::<super::residents::HostTools>();
                let def = host.as_ref().and_then(|h| h.0.get(&name)).ok_or_else(|| {
                    bad(
                        who,
                        format!(
                            "tools[{}] = {name:?}: no tool of that name was registered by the host",
                            i + 1
                        ),
                    )
                })?;
                tools.push(def.clone());
            }
            Value::Table(t) => {
                let def = tool_def(lua, &t, who)?;
                if let Handler::Lua(id) = def.handler {
                    inline.push(id);
                }
                tools.push(def);
            }
            other => {
                return Err(bad(
                    who,
                    format!(
                        "tools[{}] must be an ai.tool, not {}",
                        i + 1,
                        other.type_name()
                    ),
                ));
            }
        }
    }
    Ok(tools)
}

fn names(opts: &Table, key: &str, who: &str) -> mlua::Result<Vec<String>> {
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

pub(crate) fn read_compaction(opts: &Table, who: &str) -> mlua::Result<Compaction> {
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
    if let Some(w) = opts.get::<Option<f64>>("context_window")? {
        c.context_window = w.max(1.0) as u64;
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
    let t = lua.create_table()?;
    t.set("input", u.input)?;
    t.set("output", u.output)?;
    t.set("cache_read", u.cache_read)?;
    t.set("cache_write", u.cache_write)?;
    t.set("reasoning", u.reasoning)?;
    Ok(t)
}

/// A turn's outcome as a Lua table. `take_turn` names the reply `reply` and the events
/// `tool_events`; `ai.run` names them `text` and `tools`.
fn turn_table(
    lua: &Lua,
    o: TurnOutcome,
    mcp: McpReport,
    reply_key: &str,
    events_key: &str,
) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    if let Some(servers) = &mcp.servers {
        t.set("servers", servers_table(lua, servers)?)?;
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
        t.set("dynamic_mcp", list)?;
    }
    t.set(reply_key, o.reply)?;
    t.set("stop", o.stop.as_str())?;
    t.set("steps", o.steps)?;
    t.set("usage", usage_table(lua, &o.usage)?)?;
    t.set("compactions", o.compactions)?;
    let events = lua.create_table()?;
    for e in &o.tool_events {
        let row = lua.create_table()?;
        row.set("step", e.step)?;
        row.set("name", e.name.as_str())?;
        row.set("call_id", e.call_id.as_str())?;
        row.set("kind", kind_name(e.kind))?;
        row.set("ok", e.kind == EventKind::Ok)?;
        row.set("outcome", e.outcome.as_str())?;
        row.set("duration_ms", e.duration.as_secs_f64() * 1000.0)?;
        events.push(row)?;
    }
    t.set(events_key, events)?;
    if let Some(e) = &o.error {
        t.set("error", error_table(lua, &e.kind, &e.message)?)?;
    }
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
    t.set_metatable(Some(lazy))?;
    Ok(t)
}

fn kind_name(kind: EventKind) -> &'static str {
    kind.as_str()
}

/// `value, err = ai.infer_structured{ schema, prompt | messages, name?, ...ask options }`: a Lua
/// value that validates against `schema`, or `nil, err` (`err.kind` is `schema` for a schema that
/// does not compile, `invalid_output` when the answer still broke it after one correction).
async fn structured(lua: &Lua, opts: Table) -> mlua::Result<MultiValue> {
    let who = "ai.infer_structured";
    let schema = match opts.get::<Value>("schema")? {
        v @ Value::Table(_) => to_json(lua, v)?,
        _ => return Err(bad(who, "schema must be a table (a JSON Schema)")),
    };
    let name: Option<String> = opts.get("name")?;
    let prompt: Option<String> = opts.get("prompt")?;
    let history = opts.get::<Value>("messages")?;
    let (mut ask, _) = read_ask(
        lua,
        Some(opts),
        who,
        &["schema", "name", "prompt", "messages"],
    )?;
    ask.messages = match history {
        Value::Nil => Vec::new(),
        v => read_history(lua, v, who)?,
    };
    if let Some(p) = prompt {
        ask.messages.push(Message::user(p));
    }
    if ask.messages.is_empty() {
        return Err(bad(who, "give a prompt or messages"));
    }
    let core = core(lua);
    match crate::providers::structured::infer_structured(&core, ask, schema, name).await {
        Ok(outcome) => Ok(MultiValue::from_iter([from_json(lua, &outcome.value)?])),
        Err(e) => Ok(MultiValue::from_iter([
            Value::Nil,
            Value::Table(error_table(lua, e.kind(), &e.to_string())?),
        ])),
    }
}

/// `a, b = ai.parallel(f1, f2)`: runs each function in its own coroutine, at once, and returns
/// each one's first result in order. An error in any is raised once all have finished.
async fn parallel(fns: MultiValue) -> mlua::Result<MultiValue> {
    let mut calls = Vec::with_capacity(fns.len());
    for (i, f) in fns.into_iter().enumerate() {
        match f {
            Value::Function(f) => calls.push(async move { f.call_async::<Value>(()).await }),
            other => {
                return Err(bad(
                    "ai.parallel",
                    format!(
                        "argument {} is a {}, not a function",
                        i + 1,
                        other.type_name()
                    ),
                ));
            }
        }
    }
    let results = futures::future::join_all(calls).await;
    results.into_iter().collect::<mlua::Result<MultiValue>>()
}

/// `row[key]` = the names as a Lua list (a server's tools, or those it left out).
fn set_names(lua: &Lua, row: &Table, key: &str, names: &[String]) -> mlua::Result<()> {
    row.set(
        key,
        lua.create_sequence_from(names.iter().map(String::as_str))?,
    )
}
