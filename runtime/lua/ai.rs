//! The `ai` module: `ai.ask`, `ai.ask_simple`, `ai.providers`, `ai.models`.
//!
//! This file only translates: Lua tables in, neutral types to the core, neutral results back as
//! Lua tables. Mistakes in how a function is called (a misspelt option, a history entry without
//! a role) raise an error naming the field; failures of the call itself (no key, a refused
//! request, an outage) are expected and come back as `nil, err`.

use mlua::{Function, Lua, MultiValue, Table, Value};
use tokio::sync::mpsc;

use super::convert::{from_json, provider_error, to_json};
use crate::config::Overrides;
use crate::core::{Ask, Core};
use crate::providers::catalogue::CATALOGUE;
use crate::vocab::{
    Inferred, Message, Opaque, Part, Role, ToolCall, ToolChoice, ToolResult, ToolSpec,
};

pub fn register(lua: &Lua) -> mlua::Result<Table> {
    let ai = lua.create_table()?;
    let ask_fn =
        lua.create_async_function(|lua, (history, opts): (Value, Option<Table>)| async move {
            ask(&lua, history, opts).await
        })?;
    ai.set("ask", ask_fn)?;
    let ask_simple = lua.create_async_function(
        |lua, (prompt, opts): (mlua::LuaString, Option<Table>)| async move {
            let history = Value::String(prompt);
            // Only the reply, or `nil, err`: the calls are not for a one-shot caller.
            let out = ask(&lua, history, opts).await?;
            Ok(MultiValue::from_iter(out.into_iter().take(2)))
        },
    )?;
    ai.set("ask_simple", ask_simple.clone())?;
    ai.set("askSimple", ask_simple)?;
    ai.set("providers", lua.create_function(|lua, ()| providers(lua))?)?;
    let models =
        lua.create_async_function(|lua, opts: Value| async move { models(&lua, opts).await })?;
    ai.set("models", models.clone())?;
    ai.set("fetchModels", models)?;
    Ok(ai)
}

fn core(lua: &Lua) -> Core {
    lua.app_data_ref::<Core>()
        .expect("the VM was built with a core")
        .clone()
}

/// `reply, err, tool_calls = ai.ask(history, overrides)`.
async fn ask(lua: &Lua, history: Value, opts: Option<Table>) -> mlua::Result<MultiValue> {
    let (mut ask, stream) = read_overrides(lua, opts)?;
    ask.messages = read_history(lua, history)?;
    let core = core(lua);
    let (req, ep) = match core.prepare(ask) {
        Ok(prepared) => prepared,
        Err(e) => return failure(lua, &e),
    };
    let result = match stream {
        None => core.infer(&req, &ep, None).await,
        Some(on_text) => {
            // The model call and the Lua callback take turns on this thread: deltas go through
            // a channel so the callback (which may itself wait) runs outside the HTTP read loop.
            let (tx, mut rx) = mpsc::unbounded_channel::<String>();
            let call = async move {
                let mut send = move |t: &str| {
                    let _ = tx.send(t.to_string());
                };
                core.infer(&req, &ep, Some(&mut send)).await
            };
            let deliver = async {
                while let Some(delta) = rx.recv().await {
                    on_text.call_async::<()>(delta).await?;
                }
                Ok::<_, mlua::Error>(())
            };
            let (result, delivered) = tokio::join!(call, deliver);
            delivered?;
            result
        }
    };
    match result {
        Ok(inferred) => success(lua, &inferred),
        Err(e) => failure(lua, &e),
    }
}

fn failure(lua: &Lua, e: &crate::providers::ProviderError) -> mlua::Result<MultiValue> {
    Ok(MultiValue::from_iter([
        Value::Nil,
        Value::Table(provider_error(lua, e)?),
    ]))
}

fn success(lua: &Lua, inferred: &Inferred) -> mlua::Result<MultiValue> {
    let reply = Value::String(lua.create_string(inferred.text())?);
    let calls = inferred.tool_calls();
    if calls.is_empty() {
        return Ok(MultiValue::from_iter([reply]));
    }
    let list = lua.create_table()?;
    for call in &calls {
        list.push(tool_call_table(lua, call)?)?;
    }
    // Reasoning that came with the calls must go back with them (Anthropic thinking blocks):
    // it rides on the list, so `{ role = "assistant", tool_calls = calls }` carries it.
    let reasoning: Vec<&Part> = inferred
        .message
        .parts
        .iter()
        .filter(|p| matches!(p, Part::Reasoning { .. }))
        .collect();
    if !reasoning.is_empty() {
        let json = serde_json::to_value(&reasoning).map_err(mlua::Error::external)?;
        list.set("reasoning", from_json(lua, &json)?)?;
    }
    Ok(MultiValue::from_iter([
        reply,
        Value::Nil,
        Value::Table(list),
    ]))
}

fn tool_call_table(lua: &Lua, call: &ToolCall) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set("id", call.id.as_str())?;
    t.set("name", call.name.as_str())?;
    t.set("args", call.arguments.as_str())?;
    if let Ok(decoded) = call.decoded() {
        t.set("arguments", from_json(lua, &decoded)?)?;
    }
    if let Some(opaque) = &call.opaque {
        let json = serde_json::to_value(opaque).map_err(mlua::Error::external)?;
        t.set("opaque", from_json(lua, &json)?)?;
    }
    Ok(t)
}

const OPTIONS: &[&str] = &[
    "use",
    "provider",
    "model",
    "key",
    "base_url",
    "timeout",
    "max_tokens",
    "temperature",
    "system",
    "tools",
    "tool_choice",
    "extra",
    "stream",
    "stop",
];

fn bad(what: impl std::fmt::Display) -> mlua::Error {
    mlua::Error::runtime(format!("ai.ask: {what}"))
}

/// The overrides table: settings for resolution, plus what shapes the request.
fn read_overrides(lua: &Lua, opts: Option<Table>) -> mlua::Result<(Ask, Option<Function>)> {
    let mut ask = Ask::default();
    let Some(opts) = opts else {
        return Ok((ask, None));
    };
    for pair in opts.pairs::<Value, Value>() {
        let (k, _) = pair?;
        let name = match &k {
            Value::String(s) => s.to_string_lossy(),
            other => {
                return Err(bad(format!(
                    "an option key must be a string, not {}",
                    other.type_name()
                )));
            }
        };
        if !OPTIONS.contains(&name.as_str()) {
            return Err(bad(format!(
                "unknown option {name:?} (options: {})",
                OPTIONS.join(", ")
            )));
        }
    }
    let text = |key: &str| -> mlua::Result<Option<String>> {
        opts.get::<Option<String>>(key)
            .map_err(|_| bad(format!("option {key} must be a string")))
    };
    let number = |key: &str| -> mlua::Result<Option<f64>> {
        opts.get::<Option<f64>>(key)
            .map_err(|_| bad(format!("option {key} must be a number")))
    };
    ask.overrides = Overrides {
        use_type: text("use")?,
        provider: text("provider")?,
        model: text("model")?,
        key: text("key")?,
        base_url: text("base_url")?,
        timeout: number("timeout")?,
        max_tokens: number("max_tokens")?.map(|n| n.max(1.0) as u32),
        temperature: number("temperature")?,
    };
    ask.system = text("system")?;
    if let Some(tools) = opts.get::<Option<Table>>("tools")? {
        for (i, tool) in tools.sequence_values::<Value>().enumerate() {
            ask.tools.push(read_tool(lua, tool?, i + 1)?);
        }
    }
    ask.tool_choice = match opts.get::<Value>("tool_choice")? {
        Value::Nil => ToolChoice::Auto,
        Value::String(s) => match s.to_str()?.as_ref() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" | "any" => ToolChoice::Required,
            name => ToolChoice::Tool(name.to_string()),
        },
        Value::Table(t) => ToolChoice::Tool(
            t.get::<String>("name")
                .map_err(|_| bad("tool_choice table needs a name"))?,
        ),
        other => {
            return Err(bad(format!(
                "tool_choice cannot be a {}",
                other.type_name()
            )));
        }
    };
    ask.stop_sequences = match opts.get::<Value>("stop")? {
        Value::Nil => vec![],
        Value::String(s) => vec![s.to_string_lossy()],
        Value::Table(t) => t.sequence_values::<String>().collect::<mlua::Result<_>>()?,
        other => return Err(bad(format!("stop cannot be a {}", other.type_name()))),
    };
    ask.extra = match opts.get::<Value>("extra")? {
        Value::Nil => None,
        v @ Value::Table(_) => Some(to_json(lua, v)?),
        other => {
            return Err(bad(format!(
                "extra must be a table, not {}",
                other.type_name()
            )));
        }
    };
    let stream = match opts.get::<Value>("stream")? {
        Value::Nil | Value::Boolean(false) => None,
        Value::Function(f) => Some(f),
        Value::Boolean(true) => Some(lua.create_function(|_, _: Value| Ok(()))?),
        other => {
            return Err(bad(format!(
                "stream must be a function, not {}",
                other.type_name()
            )));
        }
    };
    Ok((ask, stream))
}

fn read_tool(lua: &Lua, tool: Value, n: usize) -> mlua::Result<ToolSpec> {
    let Value::Table(t) = tool else {
        return Err(bad(format!("tools[{n}] must be a table")));
    };
    let name: String = t
        .get("name")
        .map_err(|_| bad(format!("tools[{n}] needs a name")))?;
    let description: Option<String> = t.get("description")?;
    let parameters = match t.get::<Value>("parameters")? {
        Value::Nil => serde_json::json!({"type": "object", "properties": {}}),
        v => to_json(lua, v)?,
    };
    Ok(ToolSpec {
        name,
        description: description.unwrap_or_default(),
        parameters,
    })
}

/// A history: a string (one user message) or a list of `{ role, content, tool_calls?,
/// tool_call_id? }`. Consecutive `tool` entries become one message of results.
pub fn read_history(lua: &Lua, history: Value) -> mlua::Result<Vec<Message>> {
    let entries = match history {
        Value::String(s) => return Ok(vec![Message::user(s.to_string_lossy())]),
        Value::Table(t) => t,
        other => {
            return Err(bad(format!(
                "history must be a string or a list of messages, not {}",
                other.type_name()
            )));
        }
    };
    let mut messages: Vec<Message> = Vec::new();
    for (i, entry) in entries.sequence_values::<Value>().enumerate() {
        let n = i + 1;
        let Value::Table(entry) = entry? else {
            return Err(bad(format!("history[{n}] must be a table")));
        };
        let role: String = entry
            .get("role")
            .map_err(|_| bad(format!("history[{n}] needs a role")))?;
        let role = Role::parse(&role).ok_or_else(|| {
            bad(format!(
                "history[{n}].role = {role:?} (expected system, user, assistant or tool)"
            ))
        })?;
        let content = match entry.get::<Value>("content")? {
            Value::Nil => String::new(),
            Value::String(s) => s.to_string_lossy(),
            v @ Value::Table(_) => to_json(lua, v)?.to_string(),
            other => other.to_string()?,
        };
        if role == Role::Tool {
            let call_id: String = entry
                .get("tool_call_id")
                .map_err(|_| bad(format!("history[{n}] (role tool) needs a tool_call_id")))?;
            let name = match entry.get::<Option<String>>("name")? {
                Some(name) => name,
                None => find_call_name(&messages, &call_id).unwrap_or_default(),
            };
            let is_error = entry.get::<Option<bool>>("is_error")?.unwrap_or(false);
            let result = Part::ToolResult(ToolResult {
                call_id,
                name,
                content,
                is_error,
            });
            match messages.last_mut() {
                Some(last) if last.role == Role::Tool => last.parts.push(result),
                _ => messages.push(Message::new(Role::Tool, vec![result])),
            }
            continue;
        }
        let mut parts = Vec::new();
        let calls = entry.get::<Option<Table>>("tool_calls")?;
        if let Some(calls) = &calls
            && let Some(reasoning) = calls.get::<Option<Table>>("reasoning")?
        {
            let json = to_json(lua, Value::Table(reasoning))?;
            let kept: Vec<Part> = serde_json::from_value(json)
                .map_err(|e| bad(format!("history[{n}].tool_calls.reasoning: {e}")))?;
            parts.extend(kept);
        }
        if !content.is_empty() {
            parts.push(Part::text(content));
        }
        if let Some(calls) = calls {
            for (j, call) in calls.sequence_values::<Table>().enumerate() {
                parts.push(Part::ToolCall(read_call(lua, call?, n, j + 1)?));
            }
        }
        messages.push(Message::new(role, parts));
    }
    Ok(messages)
}

fn read_call(lua: &Lua, call: Table, n: usize, j: usize) -> mlua::Result<ToolCall> {
    let at = format!("history[{n}].tool_calls[{j}]");
    let id: String = call
        .get("id")
        .map_err(|_| bad(format!("{at} needs an id")))?;
    let name: String = call
        .get("name")
        .map_err(|_| bad(format!("{at} needs a name")))?;
    let arguments = match (call.get::<Value>("args")?, call.get::<Value>("arguments")?) {
        (Value::String(s), _) => s.to_string_lossy(),
        (_, v @ Value::Table(_)) => to_json(lua, v)?.to_string(),
        (Value::Nil, Value::Nil) => "{}".to_string(),
        _ => {
            return Err(bad(format!(
                "{at}.args must be JSON text (or arguments a table)"
            )));
        }
    };
    let opaque = match call.get::<Value>("opaque")? {
        Value::Nil => None,
        v => Some(
            serde_json::from_value::<Opaque>(to_json(lua, v)?)
                .map_err(|e| bad(format!("{at}.opaque: {e}")))?,
        ),
    };
    Ok(ToolCall {
        id,
        name,
        arguments,
        opaque,
    })
}

fn find_call_name(messages: &[Message], call_id: &str) -> Option<String> {
    messages
        .iter()
        .rev()
        .flat_map(|m| m.tool_calls())
        .find(|c| c.id == call_id)
        .map(|c| c.name.clone())
}

fn providers(lua: &Lua) -> mlua::Result<Table> {
    let list = lua.create_table()?;
    for e in CATALOGUE {
        let t = lua.create_table()?;
        t.set("id", e.id)?;
        t.set("name", e.name)?;
        t.set("style", e.style.as_str())?;
        t.set("base_url", e.base_url)?;
        t.set("default_model", e.default_model)?;
        t.set("key_env", e.key_env)?;
        t.set(
            "tools",
            match e.tools {
                crate::providers::ToolsLevel::Native => "native",
                crate::providers::ToolsLevel::Text => "text",
                crate::providers::ToolsLevel::None => "none",
            },
        )?;
        list.push(t)?;
    }
    Ok(list)
}

/// `models, err = ai.models{ provider, key?, base_url? }` (or `ai.models("openai")`).
async fn models(lua: &Lua, opts: Value) -> mlua::Result<MultiValue> {
    let mut overrides = Overrides::default();
    match opts {
        Value::String(s) => overrides.provider = Some(s.to_string_lossy()),
        Value::Table(t) => {
            overrides.provider = t.get("provider")?;
            overrides.key = t.get("key")?;
            overrides.base_url = t.get("base_url")?;
            overrides.use_type = t.get("use")?;
        }
        Value::Nil => {}
        other => {
            return Err(mlua::Error::runtime(format!(
                "ai.models: expected {{ provider = ... }}, not {}",
                other.type_name()
            )));
        }
    }
    let core = core(lua);
    let resolved = match core.resolve(&overrides) {
        Ok(r) => r,
        Err(e) => return failure(lua, &e),
    };
    match core.providers().models(&resolved.endpoint).await {
        Ok(ids) => {
            let list = lua.create_sequence_from(ids)?;
            Ok(MultiValue::from_iter([Value::Table(list)]))
        }
        Err(e) => failure(lua, &e),
    }
}
