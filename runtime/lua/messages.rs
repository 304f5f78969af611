//! Conversations between Lua and the neutral vocabulary.
//!
//! A Lua history is a list of `{ role, content, files?, tool_calls?, tool_call_id?, name?,
//! is_error? }`:
//! the shape `ai.ask` takes and `ai.take_turn` both takes and gives back, so a transcript a turn
//! returns can be sent again as it is. Reasoning that came with tool calls rides on the calls list
//! (`calls.reasoning`), and provider data on each call (`call.opaque`), so they travel back too.

use mlua::{Lua, Table, Value};

use super::convert::{from_json, to_json};
use super::files::{files_table, read_files};
use crate::vocab::{FileRef, Message, Opaque, Part, Role, ToolCall, ToolResult};

/// The fields a history entry may have: what [`history_table`] gives back.
const ENTRY_FIELDS: &[&str] = &[
    "role",
    "content",
    "files",
    "tool_calls",
    "tool_call_id",
    "name",
    "is_error",
];

/// A history: a string (one user message) or a list of `{ role, content, tool_calls?,
/// tool_call_id? }`. Consecutive `tool` entries become one message of results.
pub fn read_history(lua: &Lua, history: Value, who: &str) -> mlua::Result<Vec<Message>> {
    let bad = |what: String| super::convert::misuse(format!("{who}: {what}"));
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
    if entries.raw_len() == 0
        && let Some(keys) = record_keys(&entries)
    {
        return Err(bad(format!(
            "history must be a string or a list of messages, not a table with keys {keys}"
        )));
    }
    let mut messages: Vec<Message> = Vec::new();
    for (i, entry) in entries.sequence_values::<Value>().enumerate() {
        let n = i + 1;
        let Value::Table(entry) = entry? else {
            return Err(bad(format!("history[{n}] must be a table")));
        };
        // A misspelt field (`file = ...`, `contnet`) would drop what it holds without a word.
        super::convert::check_fields(&entry, &format!("{who}: history[{n}]"), ENTRY_FIELDS)?;
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
            let mut parts = vec![Part::ToolResult(ToolResult {
                call_id,
                name,
                content,
                is_error,
            })];
            let files = read_files(
                lua,
                entry.get("files")?,
                &format!("{who}: history[{n}].files"),
            )?;
            parts.extend(files.into_iter().map(Part::File));
            match messages.last_mut() {
                Some(last) if last.role == Role::Tool => last.parts.extend(parts),
                _ => messages.push(Message::new(Role::Tool, parts)),
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
        let files = entry.get::<Value>("files")?;
        if !matches!(files, Value::Nil) && role != Role::User {
            return Err(bad(format!(
                "history[{n}].files: only user and tool entries carry files, not {}",
                role.as_str()
            )));
        }
        let files = read_files(lua, files, &format!("{who}: history[{n}].files"))?;
        parts.extend(files.into_iter().map(Part::File));
        if let Some(calls) = calls {
            for (j, call) in calls.sequence_values::<Table>().enumerate() {
                parts.push(Part::ToolCall(read_call(lua, call?, n, j + 1, who)?));
            }
        }
        messages.push(Message::new(role, parts));
    }
    Ok(messages)
}

/// The first few keys of a table that holds no list (`a, b, c, ...`), sorted; `None` when it is
/// empty. A history given as `{ prompt = ..., model = ... }` (options where messages go) would
/// otherwise read as no messages at all.
pub(crate) fn record_keys(t: &Table) -> Option<String> {
    let mut keys: Vec<String> = t
        .pairs::<Value, Value>()
        .filter_map(Result::ok)
        .map(|(k, _)| super::convert::key_text(&k))
        .collect();
    if keys.is_empty() {
        return None;
    }
    keys.sort();
    const SHOWN: usize = 5;
    let more = keys.len() > SHOWN;
    keys.truncate(SHOWN);
    Some(keys.join(", ") + if more { ", ..." } else { "" })
}

fn read_call(lua: &Lua, call: Table, n: usize, j: usize, who: &str) -> mlua::Result<ToolCall> {
    let bad = |what: String| super::convert::misuse(format!("{who}: {what}"));
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

/// A tool call as Lua sees it: `{ id, name, args = <JSON text>, arguments = <decoded>, opaque? }`.
pub fn tool_call_table(lua: &Lua, call: &ToolCall) -> mlua::Result<Table> {
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

/// The calls of an assistant message as a list, with the message's reasoning riding on it.
pub fn calls_table(lua: &Lua, message: &Message) -> mlua::Result<Option<Table>> {
    let calls: Vec<&ToolCall> = message.tool_calls().collect();
    if calls.is_empty() {
        return Ok(None);
    }
    let list = lua.create_table()?;
    for call in calls {
        list.push(tool_call_table(lua, call)?)?;
    }
    let reasoning: Vec<&Part> = message
        .parts
        .iter()
        .filter(|p| matches!(p, Part::Reasoning { .. }))
        .collect();
    if !reasoning.is_empty() {
        let json = serde_json::to_value(&reasoning).map_err(mlua::Error::external)?;
        list.set("reasoning", from_json(lua, &json)?)?;
    }
    Ok(Some(list))
}

/// Neutral messages as a Lua history that [`read_history`] reads back to the same messages.
pub fn history_table(lua: &Lua, messages: &[Message]) -> mlua::Result<Table> {
    let list = lua.create_table()?;
    for m in messages {
        if m.role == Role::Tool || m.tool_results().next().is_some() {
            // Each result with the files that follow it.
            let mut last: Option<(Table, Vec<&FileRef>)> = None;
            for part in &m.parts {
                match part {
                    Part::ToolResult(r) => {
                        if let Some((t, files)) = last.take() {
                            push_result(lua, &list, t, files)?;
                        }
                        let t = lua.create_table()?;
                        t.set("role", "tool")?;
                        t.set("tool_call_id", r.call_id.as_str())?;
                        t.set("name", r.name.as_str())?;
                        t.set("content", r.content.as_str())?;
                        if r.is_error {
                            t.set("is_error", true)?;
                        }
                        last = Some((t, Vec::new()));
                    }
                    Part::File(f) => {
                        if let Some((_, files)) = &mut last {
                            files.push(f);
                        }
                    }
                    _ => {}
                }
            }
            if let Some((t, files)) = last {
                push_result(lua, &list, t, files)?;
            }
            let text = m.text();
            if !text.is_empty() {
                let t = lua.create_table()?;
                t.set("role", "user")?;
                t.set("content", text)?;
                list.push(t)?;
            }
            continue;
        }
        let t = lua.create_table()?;
        t.set("role", m.role.as_str())?;
        t.set("content", m.text())?;
        if let Some(files) = files_table(lua, m.files())? {
            t.set("files", files)?;
        }
        if let Some(calls) = calls_table(lua, m)? {
            t.set("tool_calls", calls)?;
        }
        list.push(t)?;
    }
    Ok(list)
}

fn push_result(lua: &Lua, list: &Table, t: Table, files: Vec<&FileRef>) -> mlua::Result<()> {
    if let Some(files) = files_table(lua, files)? {
        t.set("files", files)?;
    }
    list.push(t)
}
