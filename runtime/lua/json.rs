//! The `json` module: `json.encode`, `json.decode`, `json.null`, `json.array`.
//!
//! Empty tables are the one ambiguity between Lua and JSON: `{}` encodes as an object unless it
//! came from a JSON array or was marked with `json.array`, so `json.decode("[]")` encodes back to
//! `[]` and `json.decode("{}")` back to `{}`.

use mlua::{Lua, LuaSerdeExt, Table, Value};

use super::convert::{decode_json, to_json};

pub fn register(lua: &Lua) -> mlua::Result<Table> {
    let json = lua.create_table()?;
    json.set("null", lua.null())?;
    json.set(
        "encode",
        lua.create_function(|lua, (value, opts): (Value, Value)| {
            let opts: Option<Table> = super::convert::arg(lua, "json.encode", 2, opts)?;
            if let Some(o) = &opts {
                super::convert::check_fields(o, "json.encode", &["pretty"])?;
            }
            let pretty = match &opts {
                Some(o) => o
                    .get::<Option<bool>>("pretty")
                    .map_err(|_| super::convert::misuse("json.encode: pretty must be a boolean"))?
                    .unwrap_or(false),
                None => false,
            };
            let json = to_json(lua, value).map_err(|e| {
                super::convert::misuse(format!("json.encode: {}", super::plain(&e)))
            })?;
            let text = if pretty {
                serde_json::to_string_pretty(&json)
            } else {
                serde_json::to_string(&json)
            };
            text.map_err(|e| super::convert::misuse(format!("json.encode: {e}")))
        })?,
    )?;
    json.set(
        "decode",
        lua.create_function(|lua, text: Value| {
            let text: mlua::LuaString = super::convert::arg(lua, "json.decode", 1, text)?;
            decode_json(lua, &text.as_bytes(), "json.decode")
        })?,
    )?;
    json.set(
        "array",
        lua.create_function(|lua, t: Value| {
            let t: Option<Table> = super::convert::arg(lua, "json.array", 1, t)?;
            let t = match t {
                Some(t) => t,
                None => lua.create_table()?,
            };
            t.set_metatable(Some(lua.array_metatable()))?;
            Ok(t)
        })?,
    )?;
    Ok(json)
}
