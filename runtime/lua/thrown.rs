//! A value the script throws (`error({ code = 7 })`) carried through colony's functions
//! unchanged.
//!
//! mlua makes any error value that is not its own into a string when it crosses Rust (`table:
//! 0x3bc13dd4d00`), so a script that caught what its function threw inside `ai.parallel` or
//! `store.update` got that string, not its table, and an uncaught one printed it. A function of
//! colony's that calls the script's code calls it through `pcall` ([`call`], [`call_async`]),
//! and answers a failure with [`throw`]; a Lua wrapper around it ([`rethrowing`]) raises the
//! value again as it was thrown.

use mlua::{Function, IntoLuaMulti, Lua, MultiValue, Table, Value};

/// The wrapper's parts, made once per VM.
struct Thrower {
    /// The script's `pcall` (the watchdog's: a stop is not caught).
    pcall: Function,
    /// What a wrapped function's first result is when its second is to be raised.
    marker: Table,
    /// `wrap(f)`: `f` with its thrown values raised again.
    wrap: Function,
}

const WRAP: &str = r#"
local marker, error, rawequal = ...
local function out(first, ...)
  if rawequal(first, marker) then error((...), 0) end
  return first, ...
end
return function(run)
  return function(...) return out(run(...)) end
end
"#;

/// Makes the VM's wrapper. Install it after the watchdog, whose `pcall` it uses.
pub fn install(lua: &Lua) -> mlua::Result<()> {
    let pcall: Function = lua.globals().get("pcall")?;
    let marker = lua.create_table()?;
    let make: Function = lua.load(WRAP).set_name("=colony.rethrow").into_function()?;
    let error: Function = lua.globals().get("error")?;
    let rawequal: Function = lua.globals().get("rawequal")?;
    let wrap = make.call::<Function>((marker.clone(), error, rawequal))?;
    lua.set_app_data(Thrower {
        pcall,
        marker,
        wrap,
    });
    Ok(())
}

fn thrower(lua: &Lua) -> mlua::Result<mlua::AppDataRef<'_, Thrower>> {
    lua.app_data_ref::<Thrower>()
        .ok_or_else(|| mlua::Error::runtime("the VM has no thrower"))
}

/// `run`, whose [`throw`]n values are raised as they are by the function the script calls.
pub fn rethrowing(lua: &Lua, run: Function) -> mlua::Result<Function> {
    thrower(lua)?.wrap.call(run)
}

/// What a [`rethrowing`] function returns to raise `value`.
pub fn throw(lua: &Lua, value: Value) -> mlua::Result<MultiValue> {
    Ok(MultiValue::from_iter([
        Value::Table(thrower(lua)?.marker.clone()),
        value,
    ]))
}

/// Calls `f` protected: its results, or what it threw. A stop (a deadline, SIGINT) is not
/// caught: it is the `Err`.
pub fn call(
    lua: &Lua,
    f: &Function,
    args: impl IntoLuaMulti,
) -> mlua::Result<Result<MultiValue, Value>> {
    let pcall = thrower(lua)?.pcall.clone();
    let mut args = args.into_lua_multi(lua)?;
    args.push_front(Value::Function(f.clone()));
    settle(pcall.call::<MultiValue>(args)?)
}

/// [`call`] for a function that may wait.
pub async fn call_async(
    lua: &Lua,
    f: &Function,
    args: impl IntoLuaMulti,
) -> mlua::Result<Result<MultiValue, Value>> {
    let pcall = thrower(lua)?.pcall.clone();
    let mut args = args.into_lua_multi(lua)?;
    args.push_front(Value::Function(f.clone()));
    settle(pcall.call_async::<MultiValue>(args).await?)
}

fn settle(mut values: MultiValue) -> mlua::Result<Result<MultiValue, Value>> {
    match values.pop_front() {
        Some(Value::Boolean(true)) => Ok(Ok(values)),
        _ => Ok(Err(values.pop_front().unwrap_or(Value::Nil))),
    }
}
