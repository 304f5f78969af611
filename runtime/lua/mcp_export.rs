//! What a program offers as an MCP server, in Lua: `mcp.resource{...}`, `mcp.prompt{...}`,
//! `export = true` on `ai.spawn`, and inside a tool handler called over MCP `ctx.progress` and
//! `ctx.log` (`ctx.sample` and `ctx.elicit` are in [`super::mcp_ask`]). Each only translates
//! into the core's [`Exports`] (the server is [`crate::mcp::server`]); a tool made with
//! `ai.tool{ exportable = true }` is added by [`exported_tool`].

use mlua::{Function, Lua, Table, Value};

use super::bridge;
use super::convert::{check_fields, misuse, to_json};
use crate::mcp::server::exports::{
    PromptArgument, PromptExport, RESIDENT_DEADLINE, ResourceExport,
};
use crate::mcp::server::{Exports, Report, ResidentExport};
use crate::turn::ToolDef;

fn bad(who: &str, what: impl std::fmt::Display) -> mlua::Error {
    misuse(format!("{who}: {what}"))
}

/// The program's exports (a VM its host did not lend any to still keeps them, unread).
fn exports(lua: &Lua) -> Exports {
    if let Some(e) = lua.app_data_ref::<Exports>() {
        return e.clone();
    }
    let e = Exports::default();
    lua.set_app_data(e.clone());
    e
}

pub fn register(lua: &Lua, mcp: &Table) -> mlua::Result<()> {
    mcp.set(
        "resource",
        lua.create_function(|lua, spec: Value| {
            resource(lua, super::convert::arg(lua, "mcp.resource", 1, spec)?)
        })?,
    )?;
    mcp.set(
        "prompt",
        lua.create_function(|lua, spec: Value| {
            prompt(lua, super::convert::arg(lua, "mcp.prompt", 1, spec)?)
        })?,
    )?;
    Ok(())
}

/// `ai.tool{ ..., exportable = true }`: the tool is offered by the program's MCP server.
pub fn exported_tool(lua: &Lua, def: &ToolDef) {
    if def.exportable {
        exports(lua).add_tool(def.clone());
    }
}

fn text(t: &Table, key: &str, who: &str) -> mlua::Result<Option<String>> {
    t.get::<Option<String>>(key)
        .map_err(|_| bad(who, format!("{key} must be a string")))
}

fn required(t: &Table, key: &str, who: &str) -> mlua::Result<String> {
    text(t, key, who)?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad(who, format!("{key} (a non-empty string) is required")))
}

fn function(t: &Table, key: &str, who: &str) -> mlua::Result<Function> {
    t.get::<Function>(key)
        .map_err(|_| bad(who, format!("{key} (a function) is required")))
}

/// `mcp.resource{ uri, name, description?, mime_type?, read = function(args, ctx) }`: a `uri`
/// with `{placeholders}` is a template (`args` holds their values and `uri`). `read` answers the
/// text, or `{ text = ... }` / `{ blob = base64, mime_type = ... }`.
fn resource(lua: &Lua, spec: Table) -> mlua::Result<()> {
    let who = "mcp.resource";
    check_fields(
        &spec,
        who,
        &["uri", "name", "description", "mime_type", "read"],
    )?;
    let uri = required(&spec, "uri", who)?;
    let who = &format!("{who} {uri:?}");
    let name = text(&spec, "name", who)?.unwrap_or_else(|| uri.clone());
    let read = function(&spec, "read", who)?;
    let template = uri.contains('{');
    if template && uri.matches('{').count() != uri.matches('}').count() {
        return Err(bad(who, "a template's {placeholders} must be closed"));
    }
    exports(lua).add_resource(ResourceExport {
        uri,
        name,
        description: text(&spec, "description", who)?,
        mime_type: text(&spec, "mime_type", who)?,
        read: bridge::register(lua, read),
        template,
    });
    Ok(())
}

/// `mcp.prompt{ name, description?, arguments = { { name, description?, required? } ... },
/// get = function(args, ctx), complete = function(args)? }`: `get` answers the text (one user
/// message) or a list of `{ role, content }`; `complete{ argument, value }` a list of strings.
fn prompt(lua: &Lua, spec: Table) -> mlua::Result<()> {
    let who = "mcp.prompt";
    check_fields(
        &spec,
        who,
        &["name", "description", "arguments", "get", "complete"],
    )?;
    let name = required(&spec, "name", who)?;
    let who = &format!("{who} {name:?}");
    let get = function(&spec, "get", who)?;
    let complete = match spec.get::<Value>("complete")? {
        Value::Nil => None,
        Value::Function(f) => Some(bridge::register(lua, f)),
        other => {
            return Err(bad(
                who,
                format!("complete must be a function, not {}", other.type_name()),
            ));
        }
    };
    let mut arguments = Vec::new();
    match spec.get::<Value>("arguments")? {
        Value::Nil => {}
        Value::Table(list) => {
            for (i, a) in list.sequence_values::<Table>().enumerate() {
                let a = a.map_err(|_| bad(who, format!("arguments[{}] must be a table", i + 1)))?;
                let at = format!("{who}: arguments[{}]", i + 1);
                check_fields(&a, &at, &["name", "description", "required"])?;
                arguments.push(PromptArgument {
                    name: required(&a, "name", &at)?,
                    description: text(&a, "description", &at)?,
                    required: super::convert::flag(&a, "required", &at)?.unwrap_or(false),
                });
            }
        }
        other => {
            return Err(bad(
                who,
                format!("arguments must be a list, not {}", other.type_name()),
            ));
        }
    }
    exports(lua).add_prompt(PromptExport {
        name,
        description: text(&spec, "description", who)?,
        arguments,
        get: bridge::register(lua, get),
        complete,
    });
    Ok(())
}

/// `ai.spawn{ ..., export = true | { description?, timeout? } }`: the resident is offered as a
/// tool of its name that mails it and answers its reply. Read before the spawn (so a bad value
/// hires nobody); call [`ResidentOffer::offer`] once it is hired.
pub struct ResidentOffer(Option<ResidentExport>);

impl ResidentOffer {
    pub fn read(opts: &Table) -> mlua::Result<ResidentOffer> {
        let name: String = opts
            .get::<Option<String>>("name")
            .ok()
            .flatten()
            .unwrap_or_default();
        let who = &format!("ai.spawn {name:?}: export");
        let system = opts.get::<Option<String>>("system").ok().flatten();
        let default_description = || match &system {
            Some(s) => format!(
                "Ask {name} (an AI: {})",
                s.chars().take(200).collect::<String>()
            ),
            None => format!("Ask {name} (an AI); its reply is the answer"),
        };
        let export = match opts.get::<Value>("export")? {
            Value::Nil | Value::Boolean(false) => None,
            Value::Boolean(true) => Some(ResidentExport {
                name: name.clone(),
                description: default_description(),
                deadline: RESIDENT_DEADLINE,
            }),
            Value::Table(t) => {
                check_fields(&t, who, &["description", "timeout"])?;
                let deadline = match t.get::<Option<f64>>("timeout") {
                    Ok(Some(s)) => super::convert::seconds_option(who, "timeout", s)?,
                    Ok(None) => RESIDENT_DEADLINE,
                    Err(_) => return Err(bad(who, "timeout is seconds (a number)")),
                };
                Some(ResidentExport {
                    name: name.clone(),
                    description: text(&t, "description", who)?.unwrap_or_else(default_description),
                    deadline,
                })
            }
            other => {
                return Err(bad(
                    who,
                    format!("export is true or a table, not {}", other.type_name()),
                ));
            }
        };
        Ok(ResidentOffer(export))
    }

    pub fn offer(self, lua: &Lua) {
        if let Some(r) = self.0 {
            exports(lua).add_resident(r);
        }
    }
}

/// How long a client whose stream `ctx.close_stream()` closed waits before it comes back.
const CLOSE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Adds `progress(n, total?, message?)` and `log(level, data)` to the `ctx` of a call that
/// came over MCP (its id says so); each answers whether the client was told. So does
/// `close_stream(retry?)` (SSE polling): over Streamable HTTP it closes the call's SSE stream,
/// asking the client to resume it after `retry` seconds (1 by default), and the answer reaches
/// the client there; elsewhere `nil, { kind = "unsupported" }`. `sample` and
/// `elicit` are on every call's `ctx` ([`super::mcp_ask`]): outside MCP they answer
/// `nil, { kind = "unsupported" }`.
pub fn add_ctx(lua: &Lua, ctx: &Table, call_id: &str) -> mlua::Result<()> {
    super::mcp_ask::add_ctx(lua, ctx, exports(lua), call_id)?;
    if !call_id.starts_with("mcp-") {
        return Ok(());
    }
    let id = call_id.to_string();
    ctx.set(
        "progress",
        lua.create_function(
            move |lua, (n, total, message): (f64, Option<f64>, Option<String>)| {
                Ok(exports(lua).report(
                    &id,
                    Report::Progress {
                        progress: n,
                        total,
                        message,
                    },
                ))
            },
        )?,
    )?;
    let id = call_id.to_string();
    ctx.set(
        "close_stream",
        lua.create_async_function(move |lua, retry: Option<f64>| {
            let id = id.clone();
            async move {
                let who = "ctx.close_stream";
                let retry = match retry {
                    Some(s) => super::convert::seconds_option(who, "retry", s)?,
                    None => CLOSE_RETRY,
                };
                match exports(&lua).close_stream(&id, retry).await {
                    Ok(()) => Ok(mlua::MultiValue::from_iter([Value::Boolean(true)])),
                    Err(e) => {
                        let err = super::convert::error_table(
                            &lua,
                            "unsupported",
                            &format!("{who}: {e}"),
                        )?;
                        Ok(mlua::MultiValue::from_iter([Value::Nil, Value::Table(err)]))
                    }
                }
            }
        })?,
    )?;
    let id = call_id.to_string();
    ctx.set(
        "log",
        lua.create_function(move |lua, (level, data): (String, Value)| {
            const LEVELS: &[&str] = &[
                "debug",
                "info",
                "notice",
                "warning",
                "error",
                "critical",
                "alert",
                "emergency",
            ];
            if !LEVELS.contains(&level.as_str()) {
                return Err(bad(
                    "ctx.log",
                    format!("level {level:?} is not one of {}", LEVELS.join(", ")),
                ));
            }
            let data = to_json(lua, data)?;
            Ok(exports(lua).report(&id, Report::Log { level, data }))
        })?,
    )?;
    Ok(())
}
