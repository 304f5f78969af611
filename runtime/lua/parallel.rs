//! `ai.parallel`: the script's functions run at once, each in a coroutine of its own.

use mlua::{Lua, MultiValue, Table, Value};

pub fn register(lua: &Lua, ai: &Table) -> mlua::Result<()> {
    let run =
        lua.create_async_function(|lua, fns: MultiValue| async move { parallel(&lua, fns).await })?;
    ai.set("parallel", run)?;
    Ok(())
}

fn bad(who: &str, what: impl std::fmt::Display) -> mlua::Error {
    super::convert::misuse(format!("{who}: {what}"))
}

/// `a, b = ai.parallel(f1, f2)`: runs each function in its own coroutine, at once, and returns
/// each one's first result in order. An error in any is raised once all have finished, the
/// first's by order of the arguments, as it was thrown (a table stays a table).
async fn parallel(lua: &Lua, fns: MultiValue) -> mlua::Result<MultiValue> {
    let mut calls = Vec::with_capacity(fns.len());
    for (i, f) in fns.into_iter().enumerate() {
        match f {
            Value::Function(f) => calls.push(async move {
                super::thrown::call_async(lua, &f, ())
                    .await
                    .map(|r| r.map(|mut v| v.pop_front().unwrap_or(Value::Nil)))
            }),
            other => {
                return Err(bad(
                    "ai.parallel",
                    format!(
                        "argument {} is {}, not a function",
                        i + 1,
                        super::convert::a_type(other.type_name())
                    ),
                ));
            }
        }
    }
    let mut firsts = MultiValue::with_capacity(calls.len());
    for result in futures::future::join_all(calls).await {
        match result? {
            Ok(first) => firsts.push_back(first),
            Err(thrown) => return Err(super::thrown::throw(lua, thrown)),
        }
    }
    Ok(firsts)
}
