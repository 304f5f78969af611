//! `ai.parallel`: the script's functions run at once, each in a coroutine of its own.

use mlua::{Lua, MultiValue, Table, Value};

pub fn register(lua: &Lua, ai: &Table) -> mlua::Result<()> {
    ai.set(
        "parallel",
        lua.create_async_function(|_, fns: MultiValue| async move { parallel(fns).await })?,
    )?;
    Ok(())
}

fn bad(who: &str, what: impl std::fmt::Display) -> mlua::Error {
    super::convert::misuse(format!("{who}: {what}"))
}

/// `a, b = ai.parallel(f1, f2)`: runs each function in its own coroutine, at once, and returns
/// each one's first result in order. An error in any is raised once all have finished.
async fn parallel(fns: MultiValue) -> mlua::Result<MultiValue> {
    let mut calls = Vec::with_capacity(fns.len());
    for (i, f) in fns.into_iter().enumerate() {
        match f {
            Value::Function(f) => calls.push(async move { f.call_async::<Value>(()).await }),
            other => {
                return Err(bad(
                    "ai.parallel",
                    format!(
                        "argument {} is a {}, not a function",
                        i + 1,
                        other.type_name()
                    ),
                ));
            }
        }
    }
    let results = futures::future::join_all(calls).await;
    results.into_iter().collect::<mlua::Result<MultiValue>>()
}
