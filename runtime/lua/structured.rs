//! `ai.infer_structured`: a Lua value that validates against a JSON Schema
//! ([`crate::providers::structured`]).

use mlua::{Lua, MultiValue, Table, Value};

use super::ai::{core, read_ask};
use super::convert::{error_table, from_json, to_json};
use super::messages::read_history;
use crate::vocab::Message;

pub fn register(lua: &Lua, ai: &Table) -> mlua::Result<()> {
    ai.set(
        "infer_structured",
        lua.create_async_function(|lua, opts: Value| async move {
            let opts = super::convert::arg(&lua, "ai.infer_structured", 1, opts)?;
            structured(&lua, opts).await
        })?,
    )?;
    Ok(())
}

fn bad(who: &str, what: impl std::fmt::Display) -> mlua::Error {
    super::convert::misuse(format!("{who}: {what}"))
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
    match crate::structured::ask_structured(&core, ask, schema, name).await {
        Ok(outcome) => Ok(MultiValue::from_iter([from_json(lua, &outcome.value)?])),
        Err(e) => Ok(MultiValue::from_iter([
            Value::Nil,
            Value::Table(match &e {
                crate::structured::StructuredError::Provider(p) => {
                    super::convert::provider_error(lua, p)?
                }
                _ => {
                    let t = error_table(lua, e.kind(), &e.to_string())?;
                    t.set("transient", false)?;
                    t
                }
            }),
        ])),
    }
}
