//! Translating between Lua values and the core's types, shared by every Lua module.

use mlua::{Lua, LuaSerdeExt, Table, Value};
use serde_json::Value as Json;

use crate::providers::ProviderError;

/// A Lua value as JSON. Empty tables become `{}`; tables marked with `json.array` (or decoded
/// from a JSON array) become `[]`. A value JSON has no form for is refused, naming what it is and
/// where it sits (`items[2].score: ...`), rather than changed or cut:
/// - a table that is a list (`#t > 0`) and also holds other keys (`{ 1, 2, x = 3 }`, or an item
///   past the list's end): read as a list, it lost those keys without a word;
/// - NaN or an infinity: serde_json writes them as `null`, so `temperature = 0/0` reached a
///   provider as `null` and `store.set` kept `nil` for a number;
/// - a function, and a string that is not UTF-8 (mlua's refusals named neither the key nor the
///   remedy: "unsupported value type", "invalid type: byte array").
pub fn to_json(lua: &Lua, value: Value) -> mlua::Result<Json> {
    let mut walk = Walk {
        array: lua.array_metatable().to_pointer(),
        ..Walk::default()
    };
    json_form(&value, &mut walk, 0).map_err(|e| misuse(e.to_string()))?;
    lua.from_value(value)
}

/// The tables of a walk: those it is inside (a table met again among them holds itself), and
/// those already found to have a JSON form (a table shared by several keys is walked once).
struct Walk {
    inside: std::collections::HashSet<*const std::ffi::c_void>,
    done: std::collections::HashSet<*const std::ffi::c_void>,
    /// The metatable that marks a table a list (`json.array`, mlua's array metatable).
    array: *const std::ffi::c_void,
}

impl Default for Walk {
    fn default() -> Walk {
        Walk {
            inside: Default::default(),
            done: Default::default(),
            array: std::ptr::null(),
        }
    }
}

/// Why a value has no JSON form, and the keys leading to it from the outermost table.
struct Unfit {
    why: String,
    /// Innermost first: keys are added as the walk returns.
    keys: Vec<String>,
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, key) in self.keys.iter().rev().enumerate() {
            let name = key.strip_prefix('.').unwrap_or(key);
            f.write_str(if i == 0 { name } else { key })?;
        }
        if !self.keys.is_empty() {
            f.write_str(": ")?;
        }
        f.write_str(&self.why)
    }
}

fn unfit(why: String) -> Unfit {
    Unfit {
        why,
        keys: Vec::new(),
    }
}

/// How deep tables may be inside one another for a JSON form: mlua's conversion refuses the
/// next level, saying "deserialize error: recursion limit exceeded" where it encodes, and
/// naming no place.
const DEEPEST: usize = 127;

/// Checks that `value`, and every table it holds, has a JSON form. Each table is walked once.
fn json_form(value: &Value, walk: &mut Walk, depth: usize) -> Result<(), Unfit> {
    match value {
        Value::Table(_) if depth >= DEEPEST => Err(unfit(format!(
            "tables nested more than {DEEPEST} deep have no JSON form here"
        ))),
        Value::Number(n) if !n.is_finite() => Err(unfit(format!(
            "the number {} has no JSON form: JSON numbers are finite",
            crate::duration::number_text(*n)
        ))),
        Value::String(s) if std::str::from_utf8(&s.as_bytes()).is_err() => Err(unfit(format!(
            "a string of {} bytes that is not UTF-8 text has no JSON form (JSON holds text: \
             encode the bytes, as hex or base64, first)",
            s.as_bytes().len()
        ))),
        Value::Function(_) | Value::Thread(_) => {
            Err(unfit(format!("a {} has no JSON form", value.type_name())))
        }
        // colony's own values (a tool, a connection, a middleware): mlua said "deserialize
        // error: unsupported value type `userdata`", naming no place. `json.null` is JSON's.
        Value::UserData(_) => Err(unfit(
            "a userdata (a value of colony's: a tool, a connection) has no JSON form".into(),
        )),
        Value::LightUserData(p) if !p.0.is_null() => {
            Err(unfit("a light userdata has no JSON form".into()))
        }
        Value::Table(t) if !walk.done.contains(&t.to_pointer()) => {
            let at = t.to_pointer();
            if !walk.inside.insert(at) {
                // mlua's refusal ("recursive table detected") said neither where nor which.
                return Err(unfit(
                    "a table that holds itself (through this key) has no JSON form".into(),
                ));
            }
            let checked = table_form(t, walk, depth);
            walk.inside.remove(&at);
            walk.done.insert(at);
            checked
        }
        _ => Ok(()),
    }
}

fn table_form(t: &Table, walk: &mut Walk, depth: usize) -> Result<(), Unfit> {
    let len = t.raw_len();
    // A table marked a list (`json.array()`, a JSON array decoded) is written as a list: an
    // empty one given keys (`t.name = "x"`) was written `[]`, its keys lost without a word.
    let marked = len == 0 && t.metatable().is_some_and(|m| m.to_pointer() == walk.array);
    for pair in t.pairs::<Value, Value>() {
        let (k, v) = pair.map_err(|e| unfit(e.to_string()))?;
        if marked {
            let key = match &k {
                Value::String(_) => format!("{:?}", key_text(&k)),
                _ => key_text(&k),
            };
            return Err(unfit(format!(
                "a table marked a list (json.array, or a JSON array decoded) holds the key \
                 {key}: JSON has no form for it (a list's items go from 1)"
            )));
        }
        if len == 0 && matches!(k, Value::Integer(_) | Value::Number(_)) {
            let key = key_text(&k);
            return Err(unfit(format!(
                "a table with the number key {key} is not a list from 1, and JSON object keys \
                 are strings: JSON has no form for it (start the list at 1, or use string keys)"
            )));
        }
        // Lua 5.4 stores a float key with an integer value as that integer.
        let item = matches!(k, Value::Integer(i) if (1..=len as i64).contains(&i));
        if len > 0 && !item {
            let key = match &k {
                Value::String(_) => format!("{:?}", key_text(&k)),
                _ => key_text(&k),
            };
            return Err(unfit(format!(
                "a table with list items 1..{len} also holds the key {key}: JSON has no \
                 form for it (put the list in a field of its own, or fill the list's holes)"
            )));
        }
        if !item {
            if !matches!(k, Value::String(_)) {
                return Err(unfit(format!(
                    "the key {} is a {}: JSON object keys are strings",
                    key_text(&k),
                    k.type_name()
                )));
            }
            json_form(&k, walk, depth + 1)?;
        }
        json_form(&v, walk, depth + 1).map_err(|mut e| {
            e.keys.push(match &k {
                Value::Integer(i) => format!("[{i}]"),
                Value::String(s) => {
                    let name = s.to_string_lossy();
                    let plain = !name.is_empty()
                        && !name.starts_with(|c: char| c.is_ascii_digit())
                        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if plain {
                        format!(".{name}")
                    } else {
                        format!("[{name:?}]")
                    }
                }
                other => format!("[{}]", key_text(other)),
            });
            e
        })?;
    }
    Ok(())
}

/// A table key as a message shows it: a string's text, a number as Lua prints it, else its type.
pub fn key_text(key: &Value) -> String {
    match key {
        Value::String(s) => s.to_string_lossy(),
        other => other
            .to_string()
            .unwrap_or_else(|_| other.type_name().into()),
    }
}

/// A JSON value as Lua; arrays keep their array-ness so they encode back as arrays, and `null`
/// becomes `json.null`.
pub fn from_json(lua: &Lua, value: &Json) -> mlua::Result<Value> {
    lua.to_value(value)
}

/// The metatable every colony error table shares: `tostring(err)` reads `kind: message`.
fn error_metatable(lua: &Lua) -> mlua::Result<Table> {
    const KEY: &str = "colony.error_metatable";
    if let Ok(mt) = lua.named_registry_value::<Table>(KEY) {
        return Ok(mt);
    }
    let mt = lua.create_table()?;
    mt.set(
        "__tostring",
        lua.create_function(|_, t: Table| {
            let kind: String = t.get("kind").unwrap_or_default();
            let message: String = t.get("message").unwrap_or_default();
            Ok(format!("{kind}: {message}"))
        })?,
    )?;
    // `"error: " .. err` reads `error: kind: message` too, as `tostring(err)` does.
    mt.set(
        "__concat",
        lua.create_function(|lua, (a, b): (Value, Value)| {
            let text = |v: Value| -> mlua::Result<mlua::LuaString> {
                let not_text = |v: &Value| {
                    mlua::Error::runtime(format!(
                        "attempt to concatenate a {} value",
                        v.type_name()
                    ))
                };
                match &v {
                    Value::Table(t) => match t.get::<Option<String>>("kind").ok().flatten() {
                        Some(kind) => {
                            let message: String = t.get("message").unwrap_or_default();
                            lua.create_string(format!("{kind}: {message}"))
                        }
                        None => Err(not_text(&v)),
                    },
                    Value::String(s) => Ok(s.clone()),
                    _ => lua.coerce_string(v.clone())?.ok_or_else(|| not_text(&v)),
                }
            };
            let (a, b) = (text(a)?, text(b)?);
            let mut bytes = a.as_bytes().to_vec();
            bytes.extend_from_slice(&b.as_bytes());
            lua.create_string(bytes)
        })?,
    )?;
    lua.set_named_registry_value(KEY, &mt)?;
    Ok(mt)
}

/// An error table `{ kind, message, ... }` for the `nil, err` convention.
/// `t[key]` as text, if set: a string that is not UTF-8 is a misuse naming `at` and `key` (it
/// was mlua's "error converting Lua string to String", naming neither).
pub fn text_field(t: &Table, key: &str, at: &str) -> mlua::Result<Option<String>> {
    match t.get::<Option<mlua::LuaString>>(key)? {
        None => Ok(None),
        Some(s) => match s.to_str() {
            Ok(text) => Ok(Some(text.to_string())),
            Err(_) => Err(misuse(format!("{at}: {key} is not UTF-8 text"))),
        },
    }
}

pub fn error_table(lua: &Lua, kind: &str, message: &str) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set("kind", kind)?;
    t.set("message", message)?;
    t.set_metatable(Some(error_metatable(lua)?))?;
    Ok(t)
}

/// A provider's error as a Lua error table, with what retry logic in Lua may want to read.
pub fn provider_error(lua: &Lua, e: &ProviderError) -> mlua::Result<Table> {
    let t = error_table(lua, e.kind(), &e.to_string())?;
    with_retry_fields(t, e.is_transient(), e.status(), e.retry_after())
}

/// `transient`, and `status` and `retry_after` when known, on an error table.
fn with_retry_fields(
    t: Table,
    transient: bool,
    status: Option<u16>,
    retry_after: Option<std::time::Duration>,
) -> mlua::Result<Table> {
    t.set("transient", transient)?;
    if let Some(status) = status {
        t.set("status", status)?;
    }
    if let Some(wait) = retry_after {
        t.set("retry_after", wait.as_secs_f64())?;
    }
    Ok(t)
}

/// A turn's error as a Lua error table, with what retry logic in Lua may want to read (as
/// [`provider_error`] gives an `ai.ask`'s).
pub fn turn_error(lua: &Lua, e: &crate::turn::TurnError) -> mlua::Result<Table> {
    let t = error_table(lua, &e.kind, &e.message)?;
    with_retry_fields(t, e.transient, e.status, e.retry_after)
}

/// A table's key as a message names it: a string quoted, another by its type (`(an integer
/// key)`).
pub fn show_key(key: &Value) -> String {
    match key {
        Value::String(s) => format!("{:?}", s.to_string_lossy()),
        other => format!("({} key)", a_type(other.type_name())),
    }
}

/// A Lua type's name with its article: "an integer", "a table" ("a integer" was said).
pub fn a_type(type_name: &str) -> String {
    let article = if type_name.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    format!("{article} {type_name}")
}

/// Refuses a table with a field not in `fields`, naming it and the fields there are.
pub fn check_fields(t: &mlua::Table, who: &str, fields: &[&str]) -> mlua::Result<()> {
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair?;
        let known =
            matches!(&k, Value::String(s) if fields.contains(&s.to_string_lossy().as_str()));
        if !known {
            let name = show_key(&k);
            return Err(misuse(format!(
                "{who}: unknown field {name} (fields: {})",
                fields.join(", ")
            )));
        }
    }
    Ok(())
}

/// The error for reading a field a value of colony's does not have (`tool.nme`): mlua's own
/// said "attempt to get an unknown field" from its index chunk, with no line of the script and
/// no list of what there is.
pub fn no_field(what: &str, key: &Value, fields: &[&str]) -> mlua::Error {
    let name = show_key(key);
    misuse(format!(
        "{what} has no field {name} (fields: {})",
        fields.join(", ")
    ))
}

/// An optional `true`/`false` field, strictly: Lua would read `"yes"` as true, which hides a
/// mistake. Anything but a boolean or nil raises, naming the field.
pub fn flag(t: &mlua::Table, key: &str, who: &str) -> mlua::Result<Option<bool>> {
    match t.get::<Value>(key)? {
        Value::Nil => Ok(None),
        Value::Boolean(b) => Ok(Some(b)),
        other => Err(misuse(format!(
            "{who}: {key} must be true or false, not {}",
            other.type_name()
        ))),
    }
}

/// Argument `pos` of `who` as `T`, refused as Lua refuses its own functions' arguments:
/// `bad argument #1 to 'fs.read': ...`. A callback's typed arguments are converted by mlua, which
/// does not know the name the function has in Lua: its refusal named neither the function nor,
/// under `pcall`, the line.
pub fn arg<T: mlua::FromLua>(lua: &Lua, who: &str, pos: usize, value: Value) -> mlua::Result<T> {
    T::from_lua(value, lua).map_err(|cause| {
        let why = match &cause {
            mlua::Error::FromLuaConversionError { from, to, .. } => {
                // Lua's own type names: mlua names the Rust type it converts to.
                let to = match to.as_str() {
                    "f32" | "f64" | "i8" | "i16" | "i32" | "i64" | "u8" | "u16" | "u32" | "u64"
                    | "usize" | "isize" => "number",
                    "String" | "LuaString" | "BorrowedStr" | "&str" | "str" => "string",
                    "Table" => "table",
                    "Function" => "function",
                    other => other,
                };
                if to == "string" && *from == "string" {
                    // A string mlua could not read as text.
                    "UTF-8 text expected, got a string that is not".to_string()
                } else {
                    format!("{to} expected, got {from}")
                }
            }
            other => other.to_string(),
        };
        misuse(format!("bad argument #{pos} to '{who}': {why}"))
    })
}

/// The most memory the program's Lua code may hold (`--max-memory`), as the VM was given it.
pub struct MemoryLimit(pub usize);

/// Refuses a read limit (`max_bytes`) past the program's memory limit: what it let through
/// could never become a Lua string, and was read whole first (a 1 GiB `max_bytes` under
/// `--max-memory 64M` took 2.6 GB before failing).
pub fn within_memory(lua: &Lua, who: &str, max_bytes: u64) -> mlua::Result<()> {
    let Some(limit) = lua.app_data_ref::<MemoryLimit>().map(|m| m.0 as u64) else {
        return Ok(());
    };
    if max_bytes > limit {
        return Err(misuse(format!(
            "{who}: max_bytes {} is more than the program's memory limit of {} \
             (--max-memory): what it reads could never be held",
            crate::providers::body::describe_limit(max_bytes),
            crate::providers::body::describe_limit(limit)
        )));
    }
    Ok(())
}

/// A read's default limit (`max_bytes` left out): `default`, or less under a smaller memory
/// limit: a body past the memory limit was read whole, then raised the memory error (not the
/// documented `too_large`), and the message advised passing a `max_bytes` that is refused.
pub fn default_within_memory(lua: &Lua, default: u64) -> u64 {
    // Half the limit: the string is made from the bytes read, and both are held a moment.
    lua.app_data_ref::<MemoryLimit>()
        .map_or(default, |m| default.min(m.0 as u64 / 2))
}

/// A mistake in how a script called a function, as a Lua error whose text is just `message`
/// (mlua's own runtime errors print a "runtime error: " prefix a script author did not write).
pub fn misuse(message: impl Into<String>) -> mlua::Error {
    mlua::Error::external(Misuse(message.into()))
}

/// `key = value` seconds from a script, read by [`crate::duration::seconds`]: a negative, NaN or
/// absurd value (`math.huge`) is a misuse naming the function and the option.
pub fn seconds_option(who: &str, key: &str, value: f64) -> mlua::Result<std::time::Duration> {
    crate::duration::seconds(value).map_err(|e| misuse(format!("{who}: {key}: {e}")))
}

/// `key = value` as a count of 1 or more (`max_steps`, `max_tokens`, a mailbox's size): a
/// fraction, zero, a negative number, NaN or one past `u32::MAX` is a misuse naming the function,
/// the option and the value, rather than a silent 1 or a saturated 4294967295.
pub fn count_option(who: &str, key: &str, value: f64) -> mlua::Result<u32> {
    whole_from(who, key, value, 1)
}

/// [`count_option`] that takes 0 too (`max_hop`, `max_restarts`): a fraction was rounded down
/// and `math.huge` taken as 4294967295 (no hop limit at all).
pub fn zero_or_more_option(who: &str, key: &str, value: f64) -> mlua::Result<u32> {
    whole_from(who, key, value, 0)
}

fn whole_from(who: &str, key: &str, value: f64, least: u32) -> mlua::Result<u32> {
    if value >= f64::from(least) && value <= f64::from(u32::MAX) && value.fract() == 0.0 {
        Ok(value as u32)
    } else {
        Err(misuse(format!(
            "{who}: {key} must be a whole number from {least} to {}, not {}",
            u32::MAX,
            crate::duration::number_text(value)
        )))
    }
}

/// `temperature = value` from a script, by the rule the config file's `temperature` follows: a
/// finite number from 0. (NaN reached the provider as `null`, and a negative one was sent.)
pub fn temperature_option(who: &str, value: f64) -> mlua::Result<f64> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(misuse(format!(
            "{who}: temperature must be a number from 0 (0 to 1 for Anthropic, 0 to 2 for OpenAI \
             and Gemini), not {}",
            crate::duration::number_text(value)
        )))
    }
}

/// `key = value` milliseconds from a script, as [`seconds_option`].
pub fn millis_option(who: &str, key: &str, value: f64) -> mlua::Result<std::time::Duration> {
    crate::duration::millis(value).map_err(|e| misuse(format!("{who}: {key}: {e}")))
}

#[derive(Debug)]
struct Misuse(String);

impl std::fmt::Display for Misuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Misuse {}

/// Decodes JSON text for Lua: the value, or `nil, { kind = "parse_error" }` with `what` naming
/// the caller (`json.decode`, `resp.json`).
pub fn decode_json(lua: &Lua, text: &[u8], what: &str) -> mlua::Result<(Value, Value)> {
    match serde_json::from_slice::<Json>(text) {
        Ok(v) => Ok((from_json(lua, &v)?, Value::Nil)),
        Err(e) => Ok((
            Value::Nil,
            Value::Table(error_table(lua, "parse_error", &format!("{what}: {e}"))?),
        )),
    }
}
