//! The `store` module: `store.get`, `store.set`, `store.delete`, `store.list`, `store.update` on
//! the program's durable store ([`crate::store`]).
//!
//! Keys live in a namespace: the program's top level sees the global space; a resident spawned
//! with `workspace = "name"` has its tools and sources see that workspace alone. The namespace
//! rides on the running task ([`WORKSPACE`]), set where colony starts a tool or a source.

use std::sync::Arc;

use mlua::{Function, Lua, MultiValue, Table, Value};

use super::convert::{error_table, from_json, misuse, to_json};
use crate::store::{Store, StoreError};

/// The store a program's `store.*` calls reach.
#[derive(Clone)]
pub struct ProgramStore(pub Arc<dyn Store>);

tokio::task_local! {
    /// The workspace of the resident whose tool or source is running.
    pub static WORKSPACE: String;
}

thread_local! {
    /// Whether a `store.update` function is running on this thread.
    static UPDATING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Raises for a call of `who` from inside a `store.update` function. The store answered it
/// `nil, err` (it holds the update's transaction), which a function that reads and goes on
/// took for "absent": `store.update("n", function() return store.get("price") + 1 end)` kept
/// nil, and an inner `store.update`'s nil deleted the outer key.
pub fn refuse_inside_update(who: &str) -> mlua::Result<()> {
    if UPDATING.with(std::cell::Cell::get) {
        return Err(misuse(format!(
            "{who}: cannot be called inside a store.update function (it runs inside the \
             store's transaction): read what it needs before the update"
        )));
    }
    Ok(())
}

/// Marks a `store.update` function running until dropped.
struct Updating;

impl Updating {
    fn begin() -> Updating {
        UPDATING.with(|u| u.set(true));
        Updating
    }
}

impl Drop for Updating {
    fn drop(&mut self) {
        UPDATING.with(|u| u.set(false));
    }
}

/// The namespace of the running code: its resident's workspace, or the global space `""`.
pub fn current_space() -> String {
    WORKSPACE.try_with(Clone::clone).unwrap_or_default()
}

fn store(lua: &Lua) -> Arc<dyn Store> {
    lua.app_data_ref::<ProgramStore>()
        .expect("the VM has a store")
        .0
        .clone()
}

fn failed(lua: &Lua, e: &StoreError) -> mlua::Result<MultiValue> {
    Ok(MultiValue::from_iter([
        Value::Nil,
        Value::Table(error_table(lua, e.kind(), &e.to_string())?),
    ]))
}

fn key_arg(key: Value, who: &str) -> mlua::Result<String> {
    named_arg(key, who, "key")
}

/// A key or a prefix (`what`), as the text the store keeps.
fn named_arg(key: Value, who: &str, what: &str) -> mlua::Result<String> {
    match key {
        // Keys are text in the store: two keys that are not UTF-8 were both read as the same
        // key with U+FFFD, and one overwrote the other.
        Value::String(s) => s.to_str().map(|k| k.to_string()).map_err(|_| {
            misuse(format!(
                "{who}: the {what} {:?} is not UTF-8 text",
                s.to_string_lossy()
            ))
        }),
        other => Err(misuse(format!(
            "{who}: the {what} must be a string, not {}",
            other.type_name()
        ))),
    }
}

pub fn register(lua: &Lua) -> mlua::Result<Table> {
    let m = lua.create_table()?;
    // `value = store.get(key)`: nil when absent; `nil, err` when the store fails.
    m.set(
        "get",
        lua.create_function(|lua, key: Value| {
            refuse_inside_update("store.get")?;
            let key = key_arg(key, "store.get")?;
            match store(lua).get(&current_space(), &key) {
                Ok(Some(v)) => Ok(MultiValue::from_iter([from_json(lua, &v)?])),
                Ok(None) => Ok(MultiValue::from_iter([Value::Nil])),
                Err(e) => failed(lua, &e),
            }
        })?,
    )?;
    // `true = store.set(key, value)`: any value JSON can hold; nil deletes.
    m.set(
        "set",
        lua.create_function(|lua, (key, value): (Value, Value)| {
            refuse_inside_update("store.set")?;
            let key = key_arg(key, "store.set")?;
            let s = store(lua);
            let result = match value {
                Value::Nil => s.delete(&current_space(), &key).map(|_| ()),
                v => {
                    let json = to_json(lua, v).map_err(|e| {
                        misuse(format!(
                            "store.set {key:?}: the value cannot be stored as JSON: {e}"
                        ))
                    })?;
                    s.set(&current_space(), &key, &json)
                }
            };
            match result {
                Ok(()) => Ok(MultiValue::from_iter([Value::Boolean(true)])),
                Err(e) => failed(lua, &e),
            }
        })?,
    )?;
    // `existed = store.delete(key)`.
    m.set(
        "delete",
        lua.create_function(|lua, key: Value| {
            refuse_inside_update("store.delete")?;
            let key = key_arg(key, "store.delete")?;
            match store(lua).delete(&current_space(), &key) {
                Ok(existed) => Ok(MultiValue::from_iter([Value::Boolean(existed)])),
                Err(e) => failed(lua, &e),
            }
        })?,
    )?;
    // `keys = store.list(prefix?)`: in byte order.
    m.set(
        "list",
        lua.create_function(|lua, prefix: Value| {
            refuse_inside_update("store.list")?;
            let prefix = match prefix {
                Value::Nil => String::new(),
                given => named_arg(given, "store.list", "prefix")?,
            };
            match store(lua).list(&current_space(), &prefix) {
                Ok(keys) => Ok(MultiValue::from_iter([Value::Table(
                    lua.create_sequence_from(keys)?,
                )])),
                Err(e) => failed(lua, &e),
            }
        })?,
    )?;
    // `new = store.update(key, function(old) return new end)`: atomic read-modify-write. The
    // function runs inside the store's transaction, so it cannot wait (no ai.*, no sleep).
    let update = lua.create_function(|lua, (key, f): (Value, Value)| {
        refuse_inside_update("store.update")?;
        let key = key_arg(key, "store.update")?;
        let f: Function = super::convert::arg(lua, "store.update", 2, f)?;
        let mut raised: Option<mlua::Error> = None;
        let mut thrown: Option<Value> = None;
        let mut unfit: Option<String> = None;
        let mut apply =
            |old: Option<serde_json::Value>| -> Result<Option<serde_json::Value>, String> {
                let old = match &old {
                    Some(v) => from_json(lua, v).map_err(|e| e.to_string())?,
                    None => Value::Nil,
                };
                let updating = Updating::begin();
                let called = super::thrown::call(lua, &f, old)
                    .map(|r| r.map(|mut v| v.pop_front().unwrap_or(Value::Nil)));
                drop(updating);
                match called {
                    // The function cannot wait inside the store's transaction, and Lua's
                    // own word for it names neither.
                    Ok(Err(Value::String(m))) if m.to_string_lossy().contains("yield across") => {
                        raised = Some(misuse(
                            "store.update: the function cannot wait (ai.sleep, ai.ask, \
                                 http...): it runs inside the store's transaction",
                        ));
                        Err("the function waited".into())
                    }
                    // Raised again as it was thrown, once the transaction is undone.
                    Ok(Err(value)) => {
                        thrown = Some(value);
                        Err("the function raised an error".into())
                    }
                    Ok(Ok(Value::Nil)) => Ok(None),
                    Ok(Ok(v)) => to_json(lua, v).map(Some).map_err(|e| {
                        let message = format!(
                            "the new value cannot be stored as JSON: {}",
                            super::plain(&e)
                        );
                        unfit = Some(message.clone());
                        message
                    }),
                    // A stop (a deadline, SIGINT) is not caught.
                    Err(e) => {
                        let message = super::raised_message(&e);
                        raised = Some(e);
                        Err(message)
                    }
                }
            };
        let result = store(lua).update(&current_space(), &key, &mut apply);
        if let Some(e) = raised {
            return Err(e);
        }
        if let Some(value) = thrown {
            return Err(super::thrown::throw(lua, value));
        }
        // A value JSON cannot hold is a mistake in the script, as in `store.set`.
        if let Some(why) = unfit {
            return Err(misuse(format!("store.update {key:?}: {why}")));
        }
        match result {
            Ok(Some(v)) => Ok(MultiValue::from_iter([from_json(lua, &v)?])),
            Ok(None) => Ok(MultiValue::from_iter([Value::Nil])),
            Err(e) => failed(lua, &e),
        }
    })?;
    m.set("update", update)?;
    Ok(m)
}
