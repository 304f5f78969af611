//! `ai.tool`: a tool made from a Lua function, and reading a `tools = {...}` list (tool values,
//! inline tables, names of the host's tools) into [`ToolDef`]s.

use mlua::{
    Function, Lua, MetaMethod, MultiValue, Table, UserData, UserDataFields, UserDataMethods, Value,
};

use super::ai::core;
use super::bridge::{self, FnId};
use super::convert::{from_json, to_json};
use crate::turn::{Handler, ToolDef};

pub fn register(lua: &Lua, ai: &Table) -> mlua::Result<()> {
    ai.set(
        "tool",
        lua.create_function(|lua, spec: Value| {
            tool(lua, super::convert::arg(lua, "ai.tool", 1, spec)?)
        })?,
    )?;
    Ok(())
}

/// `name` as the Lua variable a script would hold its tool in, for advice: itself when it is
/// one (`tell`), else `the_tool`.
fn lua_name(name: &str) -> &str {
    let word = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if word { name } else { "the_tool" }
}

fn bad(who: &str, what: impl std::fmt::Display) -> mlua::Error {
    super::convert::misuse(format!("{who}: {what}"))
}

/// A tool made by `ai.tool`: usable in `tools = {...}` of every call. Its handler stays
/// registered with the bridge for the life of the program, so define tools once (at the top
/// level), not inside a loop; a tool given inline as a table lives only for its turn.
pub struct ToolValue(pub ToolDef);

impl UserData for ToolValue {
    /// `tool(args)` runs the handler directly (from another tool, say), arguments checked against
    /// the schema first, within its timeout; it returns what the handler returns.
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_meta_method(MetaMethod::Index, |_, _, key: Value| -> mlua::Result<()> {
            Err(super::convert::no_field("a tool", &key, TOOL_READABLE))
        });
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
                    // Its timeout holds as in a turn: a handler that waits past it is dropped
                    // (an error the caller may catch), one that spins is stopped (`deadline`).
                    let limit = super::watchdog::Limit {
                        deadline: std::time::Instant::now().checked_add(def.timeout),
                        ..Default::default()
                    };
                    // What the handler throws reaches the caller as it was thrown.
                    let run = async {
                        super::thrown::call_async(&lua, &handler, (args, ctx))
                            .await?
                            .map_err(|thrown| super::thrown::throw(&lua, thrown))
                    };
                    let run = super::watchdog::guarded(&lua, limit, run);
                    return match tokio::time::timeout(def.timeout, run).await {
                        // Its own deadline's stop is this call's failure, which the caller may
                        // catch as it catches a handler that waits too long: raised on as a
                        // stop, it ended the whole program through the caller's `pcall`. (A
                        // stop of the program's, an interrupt, still passes every `pcall`.)
                        Ok(Err(e))
                            if matches!(
                                super::watchdog::Stop::of(&e),
                                Some(super::watchdog::Stop::Deadline(_))
                            ) =>
                        {
                            Err(bad(
                                &def.spec.name,
                                format!(
                                    "deadline: it ran past its timeout of {} s without finishing",
                                    def.timeout.as_secs_f64()
                                ),
                            ))
                        }
                        Ok(result) => result,
                        Err(_) => Err(bad(
                            &def.spec.name,
                            format!(
                                "deadline: it did not finish within its timeout of {} s",
                                def.timeout.as_secs_f64()
                            ),
                        )),
                    };
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

/// What a script reads of a tool (`add_fields`); its handler and rate are the tool's own.
const TOOL_READABLE: &[&str] = &[
    "name",
    "description",
    "parameters",
    "timeout",
    "exportable",
    "idempotent",
];

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
    let def = tool_def(lua, &spec, "ai.tool")?;
    super::mcp_export::exported_tool(lua, &def);
    Ok(ToolValue(def))
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
                format!(
                    "rate must be a string such as \"10/min\", not a {}",
                    other.type_name()
                ),
            ));
        }
    };
    Ok(def)
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
                            "tools[{}] = {name:?}: no tool of that name was registered by the \
                             host (a name is for a host's own tools; give a tool made with \
                             ai.tool as the value itself: tools = {{ {} }})",
                            i + 1,
                            lua_name(&name)
                        ),
                    )
                })?;
                tools.push(def.clone());
            }
            Value::Table(t) => {
                // As `ai.tool` checks them: a misspelt `idempotent` or `timeout` was taken
                // without a word, and changed what a restart or a slow handler did.
                super::convert::check_fields(&t, &format!("{who}: tools[{}]", i + 1), TOOL_FIELDS)?;
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
    // Both would be offered, and the first would answer every call (OpenAI refuses the request).
    for (j, t) in tools.iter().enumerate() {
        if let Some(i) = tools[..j].iter().position(|o| o.spec.name == t.spec.name) {
            return Err(bad(
                who,
                format!(
                    "tools[{}] and tools[{}] are both named {:?}: a model tells tools apart by \
                     name only",
                    i + 1,
                    j + 1,
                    t.spec.name
                ),
            ));
        }
    }
    Ok(tools)
}
