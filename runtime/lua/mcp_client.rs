//! The MCP client's Lua functions beyond tools: the `on_elicit` hook a server spec may carry
//! (answering a server's `elicitation/create`), and `mcp.resources`, `mcp.read`, `mcp.prompts`,
//! `mcp.get_prompt`. Only translation between Lua values and [`crate::mcp`] lives here.

use std::sync::Arc;

use futures::future::BoxFuture;
use mlua::{Function, Lua, Table, Value};

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
