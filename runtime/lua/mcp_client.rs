//! The MCP client's Lua functions beyond tools: the `on_elicit` hook a server spec may carry
//! (answering a server's `elicitation/create`), and `mcp.resources`, `mcp.read`, `mcp.prompts`,
//! `mcp.get_prompt`. Only translation between Lua values and [`crate::mcp`] lives here.

use std::sync::Arc;

use futures::future::BoxFuture;
use mlua::{Function, Lua, MultiValue, Table, Value};

use super::bridge::{self, FnId, HandlerOutcome, LuaBridge};
use super::convert::misuse;
use crate::mcp::elicit::{self, Answer, Elicitor, Hook, Request};

/// A Lua function answering a server's questions: `on_elicit(request)` with `request = { server,
/// mode, message, schema, url }`, answering `"accept"`, `"decline"`, `"cancel"` or `{ action,
/// content }` (`nil, err` fails the server's request with `err`).
struct LuaElicitor {
    bridge: LuaBridge,
    func: FnId,
}

impl Elicitor for LuaElicitor {
    fn elicit(&self, request: Request) -> BoxFuture<'static, Result<Answer, String>> {
        let args = serde_json::json!({
            "server": request.server,
            "mode": request.mode,
            "message": request.message,
            "schema": request.schema,
            "url": request.url,
        });
        let ctx = serde_json::json!({ "name": "on_elicit", "server": request.server });
        let (bridge, func) = (self.bridge.clone(), self.func);
        Box::pin(async move {
            match bridge.call_tool(func, args, ctx).await {
                HandlerOutcome::Value(text) | HandlerOutcome::Attached(text, _) => {
                    // A table comes as its JSON; a string as itself.
                    let v = serde_json::from_str(&text)
                        .unwrap_or(serde_json::Value::String(text.clone()));
                    elicit::read_answer(&v).map_err(|e| format!("on_elicit: {e}"))
                }
                HandlerOutcome::Refused(e) => Err(e),
                HandlerOutcome::Deadline(e) | HandlerOutcome::Thrown(e) => Err(e),
                HandlerOutcome::Raised(f) => Err(f.message),
                HandlerOutcome::Gone => Err(crate::script::GONE.into()),
            }
        })
    }
}

/// The elicitor for `on_elicit = fn` in a spec or options table (`nil`: none). The function
/// stays registered for the life of the program.
pub fn elicit_hook(lua: &Lua, v: Value, who: &str) -> mlua::Result<Option<Hook>> {
    match v {
        Value::Nil => Ok(None),
        Value::Function(f) => Ok(Some(hook_from(lua, f))),
        other => Err(misuse(format!(
            "{who}: on_elicit must be a function, not {}",
            other.type_name()
        ))),
    }
}

fn hook_from(lua: &Lua, f: Function) -> Hook {
    let bridge = lua
        .app_data_ref::<LuaBridge>()
        .expect("the VM has a bridge")
        .clone();
    let func = bridge::register(lua, f);
    Hook(Arc::new(LuaElicitor { bridge, func }))
}

/// Takes `on_elicit` out of a spec table (so the rest reads as JSON) and makes its hook.
pub fn take_elicit(lua: &Lua, t: &Table, who: &str) -> mlua::Result<Option<Hook>> {
    let v = t.get::<Value>("on_elicit")?;
    t.set("on_elicit", Value::Nil)?;
    elicit_hook(lua, v, who)
}

/// A turn's or a resident's `on_elicit`: the hook of each of its `mcp` servers that has none
/// of its own.
pub fn apply_elicit(
    lua: &Lua,
    opts: &Table,
    servers: &mut [crate::mcp::ServerSpec],
    who: &str,
) -> mlua::Result<()> {
    let v = opts.get::<Value>("on_elicit")?;
    if !matches!(v, Value::Nil | Value::Function(_)) || servers.is_empty() {
        // Checked even without servers; registered only when a server may ask.
        return elicit_hook(lua, if servers.is_empty() { Value::Nil } else { v }, who).map(|_| ());
    }
    if let Some(hook) = elicit_hook(lua, v, who)? {
        for s in servers.iter_mut().filter(|s| s.elicit.is_none()) {
            s.elicit = Some(hook.clone());
        }
    }
    Ok(())
}

/// `mcp.resources(conn)`, `mcp.read(conn, uri)`, `mcp.prompts(conn)`,
/// `mcp.get_prompt(conn, name, args)`: each answers `nil, err` when the server fails.
pub fn register(lua: &Lua, m: &Table) -> mlua::Result<()> {
    m.set(
        "resources",
        lua.create_async_function(|lua, conn: Value| async move {
            let conn = super::mcp::conn_arg(&conn, "mcp.resources")?;
            let listed = match conn.list_resources().await {
                Ok(l) => l,
                Err(e) => return super::mcp::fail(&lua, &e),
            };
            // Templates too, marked by their `uri_template`; a server without them may refuse.
            let templates = conn.list_resource_templates().await.unwrap_or_default();
            let list = lua.create_table()?;
            for item in listed.iter().chain(&templates) {
                list.push(snake(&lua, item)?)?;
            }
            Ok(MultiValue::from_iter([Value::Table(list)]))
        })?,
    )?;
    m.set(
        "read",
        lua.create_async_function(|lua, (conn, uri): (Value, Value)| async move {
            let who = "mcp.read";
            let conn = super::mcp::conn_arg(&conn, who)?;
            let Value::String(uri) = uri else {
                return Err(misuse(format!(
                    "{who}: uri must be a string (a resource's uri from mcp.resources)"
                )));
            };
            let read = match conn.read_resource(&uri.to_string_lossy()).await {
                Ok(r) => r,
                Err(e) => return super::mcp::fail(&lua, &e),
            };
            let list = lua.create_table()?;
            for c in read {
                let t = lua.create_table()?;
                t.set("uri", c.uri)?;
                t.set("mime_type", c.mime_type)?;
                t.set("text", c.text)?;
                if let Some(f) = &c.file {
                    t.set("file", super::files::file_table(&lua, f)?)?;
                }
                list.push(t)?;
            }
            Ok(MultiValue::from_iter([Value::Table(list)]))
        })?,
    )?;
    m.set(
        "prompts",
        lua.create_async_function(|lua, conn: Value| async move {
            let conn = super::mcp::conn_arg(&conn, "mcp.prompts")?;
            match conn.list_prompts().await {
                Ok(listed) => {
                    let list = lua.create_table()?;
                    for item in &listed {
                        list.push(snake(&lua, item)?)?;
                    }
                    Ok(MultiValue::from_iter([Value::Table(list)]))
                }
                Err(e) => super::mcp::fail(&lua, &e),
            }
        })?,
    )?;
    m.set(
        "get_prompt",
        lua.create_async_function(
            |lua, (conn, name, args): (Value, Value, Value)| async move {
                let who = "mcp.get_prompt";
                let conn = super::mcp::conn_arg(&conn, who)?;
                let Value::String(name) = name else {
                    return Err(misuse(format!(
                        "{who}: name must be a string (a prompt's name from mcp.prompts)"
                    )));
                };
                let args = match args {
                    Value::Nil => serde_json::Map::new(),
                    v @ Value::Table(_) => match super::convert::to_json(&lua, v)? {
                        serde_json::Value::Object(m) => m,
                        serde_json::Value::Array(a) if a.is_empty() => serde_json::Map::new(),
                        _ => {
                            return Err(misuse(format!(
                                "{who}: args must be a table of argument names to strings"
                            )));
                        }
                    },
                    other => {
                        return Err(misuse(format!(
                            "{who}: args must be a table, not {}",
                            other.type_name()
                        )));
                    }
                };
                // Prompt arguments are strings on the wire.
                let args = args
                    .into_iter()
                    .map(|(k, v)| match v {
                        serde_json::Value::String(s) => (k, serde_json::Value::String(s)),
                        other => (k, serde_json::Value::String(other.to_string())),
                    })
                    .collect();
                match conn.get_prompt(&name.to_string_lossy(), args).await {
                    Ok(p) => {
                        let t = snake(&lua, &p)?;
                        if let (Value::Table(t), Some(msgs)) =
                            (&t, p.get("messages").and_then(|m| m.as_array()))
                        {
                            let list = lua.create_table()?;
                            for m in msgs {
                                let row = snake(&lua, m)?;
                                if let (Value::Table(row), Some(c)) = (&row, m.get("content")) {
                                    row.set("text", crate::mcp::result::content_to_text(c))?;
                                }
                                list.push(row)?;
                            }
                            t.set("messages", list)?;
                        }
                        Ok(MultiValue::from_iter([t]))
                    }
                    Err(e) => super::mcp::fail(&lua, &e),
                }
            },
        )?,
    )?;
    Ok(())
}

/// A wire object as a Lua table with snake_case keys at its top level (`mimeType` is
/// `mime_type`, `uriTemplate` is `uri_template`); nested values as they are.
fn snake(lua: &Lua, v: &serde_json::Value) -> mlua::Result<Value> {
    let Some(map) = v.as_object() else {
        return super::convert::from_json(lua, v);
    };
    let t = lua.create_table()?;
    for (k, v) in map {
        let mut key = String::with_capacity(k.len() + 2);
        for ch in k.chars() {
            if ch.is_ascii_uppercase() {
                key.push('_');
                key.push(ch.to_ascii_lowercase());
            } else {
                key.push(ch);
            }
        }
        t.set(key, super::convert::from_json(lua, v)?)?;
    }
    Ok(Value::Table(t))
}

/// `auth = { on_authorize = fn(url) }`: the program sends the person (or itself) to the
/// authorization page and answers the URL the browser was sent back to; `redirect_uri` (in the
/// same table) is where the authorization server is told to send it.
struct LuaAuthorizer {
    bridge: LuaBridge,
    func: FnId,
    redirect_uri: String,
}

impl crate::mcp::oauth::Authorizer for LuaAuthorizer {
    fn redirect_uri(&self) -> String {
        self.redirect_uri.clone()
    }

    fn authorize(&self, url: String) -> BoxFuture<'static, Result<String, String>> {
        let (bridge, func) = (self.bridge.clone(), self.func);
        Box::pin(async move {
            let ctx = serde_json::json!({ "name": "on_authorize" });
            match bridge.call_tool(func, serde_json::json!(url), ctx).await {
                HandlerOutcome::Value(text) | HandlerOutcome::Attached(text, _) => Ok(text),
                HandlerOutcome::Refused(e)
                | HandlerOutcome::Deadline(e)
                | HandlerOutcome::Thrown(e) => Err(format!("on_authorize: {e}")),
                HandlerOutcome::Raised(f) => Err(format!("on_authorize: {}", f.message)),
                HandlerOutcome::Gone => Err(crate::script::GONE.into()),
            }
        })
    }
}

/// Takes `on_authorize` and `redirect_uri` out of a spec table's `auth` (a copy of it is put in
/// its place, so the rest reads as JSON) and makes the authorizer.
pub fn take_authorizer(
    lua: &Lua,
    t: &Table,
    who: &str,
) -> mlua::Result<Option<crate::mcp::oauth::AuthorizerHook>> {
    let Value::Table(auth) = t.get::<Value>("auth")? else {
        return Ok(None);
    };
    let copy = lua.create_table()?;
    for pair in auth.pairs::<Value, Value>() {
        let (k, v) = pair?;
        copy.set(k, v)?;
    }
    let hook = copy.get::<Value>("on_authorize")?;
    let redirect = copy.get::<Value>("redirect_uri")?;
    copy.set("on_authorize", Value::Nil)?;
    copy.set("redirect_uri", Value::Nil)?;
    t.set("auth", copy)?;
    let f = match hook {
        Value::Nil => {
            if !matches!(redirect, Value::Nil) {
                return Err(misuse(format!(
                    "{who}: auth.redirect_uri goes with auth.on_authorize"
                )));
            }
            return Ok(None);
        }
        Value::Function(f) => f,
        other => {
            return Err(misuse(format!(
                "{who}: auth.on_authorize must be a function, not {}",
                other.type_name()
            )));
        }
    };
    let redirect_uri = match redirect {
        Value::Nil => "http://127.0.0.1/callback".to_string(),
        Value::String(s) => s.to_string_lossy(),
        other => {
            return Err(misuse(format!(
                "{who}: auth.redirect_uri must be a string, not {}",
                other.type_name()
            )));
        }
    };
    let bridge = lua
        .app_data_ref::<LuaBridge>()
        .expect("the VM has a bridge")
        .clone();
    let func = bridge::register(lua, f);
    Ok(Some(crate::mcp::oauth::AuthorizerHook(Arc::new(
        LuaAuthorizer {
            bridge,
            func,
            redirect_uri,
        },
    ))))
}
