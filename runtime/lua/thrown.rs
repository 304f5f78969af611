//! A value the script throws (`error({ code = 7 })`) carried through colony's functions
//! unchanged.
//!
//! mlua makes any error value that is not its own into a string when it crosses Rust (`table:
//! 0x3bc13dd4d00`), so a script that caught what its function threw inside `ai.parallel` or
//! `store.update` got that string, not its table, and an uncaught one printed it. A function of
//! colony's that calls the script's code calls it through `pcall` ([`call`], [`call_async`])
//! and raises a failure with [`throw`]: an error that holds the value's place in the VM's
//! table of thrown values. Whatever reads an error for the script (its `pcall` and `xpcall`,
//! the handlers of the main chunk, a source, a callback) takes the value back with
//! [`recover`]. The function stays a C function, so a script's `return store.update(...)` is
//! no tail call that would hide the line that made it.

use std::cell::Cell;

use mlua::{Function, IntoLuaMulti, Lua, MultiValue, Table, Value};

/// At most this many thrown values wait to be recovered; older ones (an error that was only
/// logged, never read by the script) are let go.
const KEPT: u64 = 64;

/// The VM's thrown values, by number.
struct Thrower {
    /// The script's `pcall` (the watchdog's: a stop is not caught).
    pcall: Function,
    values: Table,
    next: Cell<u64>,
}

/// The error that carries a thrown value: its number in the VM's table.
#[derive(Debug)]
struct Rethrown(u64);

impl std::fmt::Display for Rethrown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a value the script threw")
    }
}

impl std::error::Error for Rethrown {}

/// Keeps the VM's `pcall`. Install it after the watchdog, whose `pcall` it uses.
pub fn install(lua: &Lua) -> mlua::Result<()> {
    lua.set_app_data(Thrower {
        pcall: lua.globals().get("pcall")?,
        values: lua.create_table()?,
        next: Cell::new(0),
    });
    Ok(())
}

fn thrower(lua: &Lua) -> mlua::Result<mlua::AppDataRef<'_, Thrower>> {
    lua.app_data_ref::<Thrower>()
        .ok_or_else(|| mlua::Error::runtime("the VM has no thrower"))
}

/// The error that raises `value` again as it was thrown.
pub fn throw(lua: &Lua, value: Value) -> mlua::Error {
    let Ok(t) = thrower(lua) else {
        return mlua::Error::runtime(super::describe_error(&value));
    };
    let n = t.next.get();
    t.next.set(n + 1);
    let kept = t
        .values
        .raw_set(n, value)
        .and_then(|()| match n.checked_sub(KEPT) {
            Some(old) => t.values.raw_set(old, Value::Nil),
            None => Ok(()),
        });
    match kept {
        Ok(()) => mlua::Error::external(Rethrown(n)),
        Err(e) => e,
    }
}

/// The value `err` raises again, taken out of the table (it is read once), if it is one.
pub fn recover(lua: &Lua, err: &mlua::Error) -> Option<Value> {
    let Rethrown(n) = err.downcast_ref::<Rethrown>()?;
    let t = thrower(lua).ok()?;
    let value = t.values.raw_get::<Value>(*n).ok()?;
    t.values.raw_set(*n, Value::Nil).ok()?;
    (!value.is_nil()).then_some(value)
}

/// `err` as the script threw it, when it is a thrown value raised again; as it is otherwise.
pub fn recovered(lua: &Lua, err: Value) -> Value {
    match &err {
        Value::Error(e) => recover(lua, e).unwrap_or(err),
        _ => err,
    }
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
