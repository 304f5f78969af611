//! The `mcp` module: `mcp.connect`, `mcp.connect_named`, `mcp.tools`, `mcp.call`, `mcp.servers`,
//! `mcp.close`, `mcp.cached_tools`; and the reading of server specs that `ai.take_turn`'s
//! `mcp = {...}` shares.
//!
//! A connection is a userdata holding the shared [`Connection`]; its tools are `ai.tool` values
//! (native handlers), so they go into `tools = {...}` of any turn, resident or `ai.ask`.

use std::sync::Arc;
use std::time::Duration;

use mlua::{Lua, MultiValue, Table, UserData, UserDataFields, Value};

use super::ai::core;
use super::convert::{check_fields, error_table, from_json, misuse, to_json};
use super::tools::ToolValue;
use crate::mcp::spec::ServerConfig;
use crate::mcp::{Connection, McpError, ServerSpec, cache, naming, toolset};

/// `mcp.connect`'s answer.
pub struct ConnValue {
    pub conn: Arc<Connection>,
    /// Whether the script named the server (`mcp.connect(url, { name = ... })`, a table with a
    /// name, `mcp.connect_named`): `mcp.tools` then offers `<name>__<tool>`; a server given
    /// without a name offers its tools under their own names.
    pub named: bool,
}

impl UserData for ConnValue {
    fn add_fields<F: UserDataFields<Self>>(fields: &mut F) {
        fields.add_field_method_get("name", |_, c| Ok(c.conn.name().to_string()));
    }

    fn add_methods<M: mlua::UserDataMethods<Self>>(methods: &mut M) {
        methods.add_meta_method(
            mlua::MetaMethod::Index,
            |_, _, key: Value| -> mlua::Result<()> {
                Err(super::convert::no_field(
                    "an MCP connection",
                    &key,
                    &["name"],
                ))
            },
        );
    }
}

pub fn register(lua: &Lua) -> mlua::Result<Table> {
    let m = lua.create_table()?;
    super::mcp_export::register(lua, &m)?;
    m.set(
        "connect",
        lua.create_async_function(|lua, (target, opts): (Value, Option<Table>)| async move {
            let named = names_server(&target, opts.as_ref())?;
            let spec = connect_spec(&lua, target, opts)?;
            opened(&lua, Connection::open(spec).await, named)
        })?,
    )?;
    m.set(
        "connect_named",
        lua.create_async_function(|lua, name: Value| async move {
            let Value::String(name) = name else {
                return Err(misuse("mcp.connect_named: name must be a string"));
            };
            let name = name.to_string_lossy();
            match named(&lua, &name) {
                Ok(spec) => opened(&lua, Connection::open(spec).await, true),
                Err(e) => fail(&lua, &e),
            }
        })?,
    )?;
    m.set(
        "tools",
        lua.create_async_function(|lua, (conn, opts): (Value, Option<Table>)| async move {
            let who = "mcp.tools";
            let (conn, named) = conn_named(&conn, who)?;
            let mut prefix = named;
            if let Some(opts) = &opts {
                check_fields(opts, who, &["prefix"])?;
                prefix = super::convert::flag(opts, "prefix", who)?.unwrap_or(named);
            }
            match conn.list_tools().await {
                Ok(listed) if prefix => {
                    let mut taken = std::collections::HashSet::new();
                    let (tools, _) = toolset::adopt(&conn, &listed, &mut taken).await;
                    tool_list(&lua, tools)
                }
                Ok(listed) => tool_list(&lua, toolset::adopt_unprefixed(&conn, &listed)),
                Err(e) => fail(&lua, &e),
            }
        })?,
    )?;
    m.set(
        "call",
        lua.create_async_function(|lua, args: MultiValue| async move { call(&lua, args).await })?,
    )?;
    m.set(
        "close",
        lua.create_async_function(|_, conn: Value| async move {
            conn_arg(&conn, "mcp.close")?.close().await;
            Ok(())
        })?,
    )?;
    m.set(
        "servers",
        lua.create_function(|lua, ()| {
            let list = lua.create_table()?;
            for (name, config) in &core(lua).config().mcp {
                let row = lua.create_table()?;
                row.set("name", name.as_str())?;
                if let Some(url) = &config.url {
                    row.set("url", url.as_str())?;
                }
                if let Some(command) = &config.command {
                    row.set("command", command.as_str())?;
                    row.set(
                        "args",
                        lua.create_sequence_from(config.args.iter().map(String::as_str))?,
                    )?;
                }
                list.push(row)?;
            }
            Ok(list)
        })?,
    )?;
    m.set(
        "cached_tools",
        lua.create_function(|lua, opts: Value| {
            let who = "mcp.cached_tools";
            let opts: Option<Table> = super::convert::arg(lua, who, 1, opts)?;
            // Checked with or without a cache: a misspelt option was dropped unsaid until the
            // cache was written.
            if let Some(o) = &opts {
                check_fields(o, who, &["on_elicit"])?;
            }
            cached_tools(lua, opts, who)
        })?,
    )?;
    // Resources and prompts (runtime/lua/mcp_client.rs).
    super::mcp_client::register(lua, &m)?;
    Ok(m)
}

/// `mcp.cached_tools{ on_elicit? }`: the tools of the cache `colony tools refresh` wrote, their
/// servers opened as a turn needs them; none without a cache.
fn cached_tools(lua: &Lua, opts: Option<Table>, who: &str) -> mlua::Result<Value> {
    match cache::load() {
        Ok(Some(c)) => {
            // `{ on_elicit = fn }`: who answers these servers' questions (a front end's
            // person at the terminal).
            let elicit = match &opts {
                Some(o) => super::mcp_client::elicit_hook(lua, o.get("on_elicit")?, who)?,
                None => None,
            };
            let core = super::ai::core(lua);
            let prepare = |mut spec: ServerSpec| {
                if spec.elicit.is_none() {
                    spec.elicit = elicit.clone();
                }
                wired(lua, spec)
            };
            let (tools, conns) = cache::tools(&c, &core.config().mcp, &prepare);
            hold(lua, &conns);
            tool_list(lua, tools).map(|mut v| v.pop_front().unwrap_or(Value::Nil))
        }
        Ok(None) => Ok(Value::Table(lua.create_table()?)),
        Err(e) => {
            tracing::warn!("the MCP tool cache cannot be read: {e}");
            Ok(Value::Table(lua.create_table()?))
        }
    }
}

/// Keeps `conns` (opened beyond one turn: `mcp.connect`, `ai.spawn`'s servers, the cached
/// tools') for the program's life: when the script ends, those still alive are shut down in
/// order instead of killed ([`crate::residents::Lifecycle::keep_servers`]).
pub fn hold<'a>(lua: &Lua, conns: impl IntoIterator<Item = &'a Arc<Connection>>) {
    if let Some(life) = lua.app_data_ref::<crate::residents::Lifecycle>() {
        life.keep_servers(conns);
    }
}

fn opened(
    lua: &Lua,
    r: Result<Arc<Connection>, McpError>,
    named: bool,
) -> mlua::Result<MultiValue> {
    if let Ok(conn) = &r {
        hold(lua, [conn]);
    }
    match r {
        Ok(conn) => Ok(MultiValue::from_iter([Value::UserData(
            lua.create_userdata(ConnValue { conn, named })?,
        )])),
        Err(e) => fail(lua, &e),
    }
}

pub(super) fn fail(lua: &Lua, e: &McpError) -> mlua::Result<MultiValue> {
    Ok(MultiValue::from_iter([
        Value::Nil,
        Value::Table(error_table(lua, e.kind(), &e.to_string())?),
    ]))
}

fn tool_list(lua: &Lua, tools: Vec<crate::turn::ToolDef>) -> mlua::Result<MultiValue> {
    let list = lua.create_table()?;
    for t in tools {
        list.push(lua.create_userdata(ToolValue(t))?)?;
    }
    Ok(MultiValue::from_iter([Value::Table(list)]))
}

pub(super) fn conn_arg(v: &Value, who: &str) -> mlua::Result<Arc<Connection>> {
    conn_named(v, who).map(|(conn, _)| conn)
}

/// The connection, and whether the script named its server.
fn conn_named(v: &Value, who: &str) -> mlua::Result<(Arc<Connection>, bool)> {
    match v {
        Value::UserData(ud) => ud
            .borrow::<ConnValue>()
            .map(|c| (c.conn.clone(), c.named))
            .map_err(|_| misuse(format!("{who}: conn must be a connection from mcp.connect"))),
        other => Err(misuse(format!(
            "{who}: conn must be a connection from mcp.connect, not {}",
            other.type_name()
        ))),
    }
}

/// A configured server by name.
pub fn named(lua: &Lua, name: &str) -> Result<ServerSpec, McpError> {
    let config = core(lua).config().mcp.get(name).cloned().ok_or_else(|| {
        McpError::Config(format!(
            "no MCP server named {name:?} is configured (colony mcp add)"
        ))
    })?;
    config.into_spec(name).map(|spec| wired(lua, spec))
}

/// A spec whose `sampling` names a use-type, answered through this program's core.
fn wired(lua: &Lua, mut spec: ServerSpec) -> ServerSpec {
    if let Some(s) = &spec.sampling {
        spec.sampling = Some(s.wired(&core(lua)));
    }
    spec
}

const SPEC_FIELDS: &[&str] = &[
    "name",
    "url",
    "headers",
    "command",
    "args",
    "env",
    "cwd",
    "roots",
    "on_elicit",
    "auth",
    "resources",
    "sampling",
];

/// `mcp.connect(url_or_spec, opts?)`: a URL (opts may give `name`, `headers`, `roots`), or a table.
fn connect_spec(lua: &Lua, target: Value, opts: Option<Table>) -> mlua::Result<ServerSpec> {
    let who = "mcp.connect";
    match target {
        Value::String(url) => {
            let url = url.to_string_lossy();
            // A configured server's name given for a URL: said so, with the call that takes a
            // name (it read "server mcp: time is not a URL: relative URL without a base").
            if !url.contains("://") && super::ai::core(lua).config().mcp.contains_key(&url) {
                return Err(misuse(format!(
                    "{who}: {url:?} is a configured server's name, not a URL: \
                     mcp.connect_named({url:?}) connects to it"
                )));
            }
            let spec = lua.create_table()?;
            if let Some(o) = &opts {
                check_fields(
                    o,
                    who,
                    &[
                        "name",
                        "headers",
                        "roots",
                        "on_elicit",
                        "auth",
                        "resources",
                        "sampling",
                    ],
                )?;
                for pair in o.pairs::<Value, Value>() {
                    let (k, v) = pair?;
                    spec.set(k, v)?;
                }
            }
            spec.set("url", url)?;
            read_spec(lua, Value::Table(spec), who)
        }
        Value::Table(t) => {
            if let Some(o) = opts {
                check_fields(&o, who, &["name", "on_elicit"])?;
                if let Some(n) = o.get::<Option<String>>("name")? {
                    t.set("name", n)?;
                }
                if let f @ Value::Function(_) = o.get::<Value>("on_elicit")? {
                    t.set("on_elicit", f)?;
                }
            }
            read_spec(lua, Value::Table(t), who)
        }
        other => Err(misuse(format!(
            "{who}: expected a URL or a table {{ command, args, env, cwd }}, not {}",
            other.type_name()
        ))),
    }
}

/// Whether `mcp.connect(target, opts)` names its server (`opts.name`, or a table's `name`).
fn names_server(target: &Value, opts: Option<&Table>) -> mlua::Result<bool> {
    let in_opts = match opts {
        Some(o) => !matches!(o.get::<Value>("name")?, Value::Nil),
        None => false,
    };
    let in_table = match target {
        Value::Table(t) => !matches!(t.get::<Value>("name")?, Value::Nil),
        _ => false,
    };
    Ok(in_opts || in_table)
}

/// One server as Lua describes it: a table `{ name?, url, headers? }` or `{ name?, command,
/// args?, env?, cwd? }` (with `roots?`), or a string naming a configured server.
pub fn read_spec(lua: &Lua, v: Value, who: &str) -> mlua::Result<ServerSpec> {
    let t = match v {
        Value::String(name) => {
            let name = name.to_string_lossy();
            return named(lua, &name).map_err(|e| misuse(format!("{who}: {e}")));
        }
        Value::Table(t) => t,
        other => {
            return Err(misuse(format!(
                "{who}: a server is a table {{ name, url }} or {{ name, command, args }}, or a configured name, not {}",
                other.type_name()
            )));
        }
    };
    check_fields(&t, who, SPEC_FIELDS)?;
    // The hook is a function, not JSON: read apart from the rest, on a copy of the table.
    let copy = lua.create_table()?;
    for pair in t.pairs::<Value, Value>() {
        let (k, v) = pair?;
        copy.set(k, v)?;
    }
    let elicit = super::mcp_client::take_elicit(lua, &copy, who)?;
    let authorizer = super::mcp_client::take_authorizer(lua, &copy, who)?;
    let json = to_json(lua, Value::Table(copy))?;
    let name = match json.get("name") {
        Some(serde_json::Value::String(n)) => {
            if let Some(why) = naming::server_name_problem(n) {
                return Err(misuse(format!("{who}: server name {n:?}: {why}")));
            }
            n.clone()
        }
        Some(_) => return Err(misuse(format!("{who}: name must be a string"))),
        None => default_name(&json),
    };
    let mut fields = json.clone();
    if let Some(map) = fields.as_object_mut() {
        map.remove("name");
        // An empty Lua table reads as an array: these are maps.
        for key in ["headers", "env"] {
            if map
                .get(key)
                .is_some_and(|v| v.as_array().is_some_and(Vec::is_empty))
            {
                map.remove(key);
            }
        }
    }
    if let Some(v) = fields.get("sampling").filter(|v| !v.is_string()) {
        return Err(misuse(format!(
            "{who}: server {name}: sampling is the name of the use-type that answers (\"helper\"), not {}",
            json_type(v)
        )));
    }
    if let Some(v) = fields.get("resources").filter(|v| !v.is_boolean()) {
        return Err(misuse(format!(
            "{who}: server {name}: resources is true or false, not {}",
            json_type(v)
        )));
    }
    let config: ServerConfig =
        serde_json::from_value(fields).map_err(|e| misuse(format!("{who}: server {name}: {e}")))?;
    // A server the script starts itself is a process it runs, one it names by URL a host it
    // reaches (with headers and arguments of its choosing); configured servers are colony's.
    if let Some(command) = &config.command {
        super::sandbox::check_run(lua, who, command)?;
    }
    if let Some(url) = &config.url {
        check_url(lua, who, url)?;
    }
    let mut spec = config
        .into_spec(&name)
        .map_err(|e| misuse(format!("{who}: {e}")))?;
    spec.elicit = elicit;
    if let Some(a) = authorizer {
        spec.auth.get_or_insert_with(Default::default).authorizer = Some(a);
    }
    Ok(wired(lua, spec))
}

/// Checks that the program may reach the MCP server at `url` (`--allow-net`). A URL that does
/// not parse, or is not HTTP, is left to the connection, which says so.
pub fn check_url(lua: &Lua, who: &str, url: &str) -> mlua::Result<()> {
    match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {
            super::sandbox::check_net(lua, who, &parsed)
        }
        _ => Ok(()),
    }
}

/// The Lua type a JSON value came from, for errors.
fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "nil",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) | serde_json::Value::Object(_) => "a table",
    }
}

/// A name for a server given without one: the URL's host, or the command's file name.
fn default_name(json: &serde_json::Value) -> String {
    if let Some(url) = json.get("url").and_then(|v| v.as_str())
        && let Ok(u) = reqwest::Url::parse(url)
    {
        return naming::sanitize(u.host_str().unwrap_or("mcp"));
    }
    if let Some(cmd) = json.get("command").and_then(|v| v.as_str()) {
        let stem = std::path::Path::new(cmd)
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_else(|| "mcp".into());
        return naming::sanitize(&stem);
    }
    "mcp".into()
}

/// `text, err = mcp.call(conn, name, args)`, or `result, err = mcp.call{ conn, name, args,
/// timeout? }` with `result = { text, structured, is_error }`.
async fn call(lua: &Lua, args: MultiValue) -> mlua::Result<MultiValue> {
    let who = "mcp.call";
    let mut it = args.into_iter();
    let first = it.next().unwrap_or(Value::Nil);
    let (conn, name, call_args, timeout, table_form) = match first {
        Value::Table(t) => {
            check_fields(&t, who, &["conn", "name", "args", "timeout"])?;
            let conn = conn_arg(&t.get::<Value>("conn")?, who)?;
            let name: String = t.get("name").map_err(|_| {
                misuse(format!(
                    "{who}: name must be a string (the server's tool name)"
                ))
            })?;
            let timeout = t
                .get::<Option<f64>>("timeout")
                .map_err(|_| misuse(format!("{who}: timeout is seconds (a number)")))?;
            (conn, name, t.get::<Value>("args")?, timeout, true)
        }
        conn => {
            let conn = conn_arg(&conn, who)?;
            let name = match it.next() {
                Some(Value::String(s)) => s.to_string_lossy(),
                _ => {
                    return Err(misuse(format!(
                        "{who}: name must be a string (the server's tool name)"
                    )));
                }
            };
            (conn, name, it.next().unwrap_or(Value::Nil), None, false)
        }
    };
    let call_args = match call_args {
        Value::Nil => serde_json::json!({}),
        v @ Value::Table(_) => match to_json(lua, v)? {
            serde_json::Value::Array(a) if a.is_empty() => serde_json::json!({}),
            v => v,
        },
        other => {
            return Err(misuse(format!(
                "{who}: args must be a table, not {}",
                other.type_name()
            )));
        }
    };
    let deadline = match timeout {
        // Capped at the longest a call may ask for.
        Some(s) => super::convert::seconds_option(who, "timeout", s)?
            .max(Duration::from_millis(1))
            .min(toolset::CALL_DEADLINE + toolset::MAX_EXTRA),
        None => toolset::deadline_for(&call_args),
    };
    let name = match own_name(&conn, &name).await {
        Ok(n) => n,
        Err(e) => return fail(lua, &e),
    };
    let out = match conn.call(&name, call_args, deadline).await {
        Ok(out) => out,
        Err(e) => return fail(lua, &e),
    };
    // What a person reads: the content blocks (the structured value only when there are none).
    let text = match (&out.structured, out.content.is_empty()) {
        (Some(_), true) => out.text.as_str(),
        _ => out.content.as_str(),
    };
    if table_form {
        let t = lua.create_table()?;
        t.set("text", out.text.as_str())?;
        t.set("content", text)?;
        if let Some(s) = &out.structured {
            t.set("structured", from_json(lua, s)?)?;
        }
        t.set("is_error", out.is_error)?;
        if let Some(files) = super::files::files_table(lua, &out.files)? {
            t.set("files", files)?;
        }
        return Ok(MultiValue::from_iter([Value::Table(t)]));
    }
    if out.is_error {
        return Ok(MultiValue::from_iter([
            Value::Nil,
            Value::Table(error_table(lua, "tool_error", text)?),
        ]));
    }
    Ok(MultiValue::from_iter([Value::String(
        lua.create_string(text)?,
    )]))
}

/// The server's own name for a tool `mcp.call` was given: a name from a prefixed
/// `mcp.tools(conn)` list (`<server>__<tool>`) is mapped back, so what a model was offered is
/// what the script may pass on. The tool list is asked for only when the name has the prefix.
async fn own_name(conn: &Connection, name: &str) -> Result<String, McpError> {
    let prefix = format!("{}__", naming::sanitize(conn.name()));
    if !name.starts_with(&prefix) {
        return Ok(name.to_string());
    }
    let listed = conn.list_tools().await?;
    Ok(toolset::own_name(conn, &listed, name)
        .unwrap_or(name)
        .to_string())
}
