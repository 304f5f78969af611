//! Tables built whole in one protected call, for what colony hands a script on every turn and
//! every tool call (a turn's result, a call's `ctx`).
//!
//! The VM runs with a memory limit, so mlua protects every operation that may allocate: each
//! `Table::set` with a string key is three protected calls (the key, the value, the store). A
//! turn's result table took ~60 K instructions that way, a fifth of what colony adds to a
//! step. Here the whole table is described on the Rust side first ([`Field`]), then made in a
//! single protected call with Lua's own C functions: a memory error still surfaces as an
//! `mlua::Error`, as from `Table::set`.

use std::ffi::CStr;

use mlua::{Lua, Table, ffi};

/// One value of a table to build.
pub enum Field<'a> {
    Str(&'a str),
    Int(i64),
    Num(f64),
    Bool(bool),
    /// A table with these keys (no two alike).
    Record(Vec<(&'static CStr, Field<'a>)>),
    /// A list, from index 1.
    List(Vec<Field<'a>>),
}

impl Field<'_> {
    /// A count as Lua holds it: an integer while it fits, else a float (as mlua converts a u64).
    pub fn count(n: u64) -> Field<'static> {
        match i64::try_from(n) {
            Ok(n) => Field::Int(n),
            Err(_) => Field::Num(n as f64),
        }
    }
}

/// How deep [`Field`]s may nest: a Lua C function is given 20 stack slots, and each level
/// holds one.
const MAX_DEPTH: usize = 8;

/// Makes the table `record` describes, with `metatable` set on it.
pub fn record(
    lua: &Lua,
    record: &[(&'static CStr, Field<'_>)],
    metatable: Option<&Table>,
) -> mlua::Result<Table> {
    // The callers' shapes are fixed (three levels at most): checked in tests, not walked on
    // every turn.
    debug_assert!(
        record.iter().all(|(_, f)| depth(f) < MAX_DEPTH),
        "fields nest too deep"
    );
    // Safety: the closure runs in a protected call with the metatable (or nil) as its only
    // argument, at index 1. It pushes and pops with the C API only, keeps within the stack a C
    // function is given (MAX_DEPTH above), and holds no value that needs dropping, so a memory
    // error raised mid-way (a longjmp out of it) leaks nothing. It leaves exactly the new table.
    unsafe {
        lua.exec_raw(metatable, |state| {
            push_record(state, record);
            if ffi::lua_type(state, 1) == ffi::LUA_TTABLE {
                ffi::lua_pushvalue(state, 1);
                ffi::lua_setmetatable(state, -2);
            }
            ffi::lua_replace(state, 1);
        })
    }
}

fn depth(field: &Field<'_>) -> usize {
    match field {
        Field::Record(r) => 1 + r.iter().map(|(_, f)| depth(f)).max().unwrap_or(0),
        Field::List(l) => 1 + l.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

unsafe fn push_record(state: *mut ffi::lua_State, record: &[(&'static CStr, Field<'_>)]) {
    unsafe {
        ffi::lua_createtable(state, 0, record.len().min(i32::MAX as usize) as i32);
        for (key, field) in record {
            push(state, field);
            ffi::lua_setfield(state, -2, key.as_ptr());
        }
    }
}

unsafe fn push(state: *mut ffi::lua_State, field: &Field<'_>) {
    unsafe {
        match field {
            Field::Str(s) => {
                ffi::lua_pushlstring(state, s.as_ptr().cast(), s.len());
            }
            Field::Int(n) => ffi::lua_pushinteger(state, *n),
            Field::Num(n) => ffi::lua_pushnumber(state, *n),
            Field::Bool(b) => ffi::lua_pushboolean(state, i32::from(*b)),
            Field::Record(r) => push_record(state, r),
            Field::List(items) => {
                ffi::lua_createtable(state, items.len().min(i32::MAX as usize) as i32, 0);
                for (i, item) in items.iter().enumerate() {
                    push(state, item);
                    ffi::lua_rawseti(state, -2, i as i64 + 1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_nested_tables_with_a_metatable() {
        let lua = Lua::new();
        lua.set_memory_limit(1 << 24).unwrap();
        let mt = lua.create_table().unwrap();
        mt.set(
            "__index",
            lua.create_function(|_, _: ()| Ok("lazy")).unwrap(),
        )
        .unwrap();
        let t = record(
            &lua,
            &[
                (c"text", Field::Str("the answer is 5")),
                (c"steps", Field::Int(2)),
                (c"big", Field::count(u64::MAX)),
                (c"ms", Field::Num(1.5)),
                (c"ok", Field::Bool(true)),
                (
                    c"usage",
                    Field::Record(vec![(c"input", Field::Int(7)), (c"output", Field::Int(0))]),
                ),
                (
                    c"tools",
                    Field::List(vec![
                        Field::Record(vec![(c"name", Field::Str("add"))]),
                        Field::Str("second"),
                    ]),
                ),
            ],
            Some(&mt),
        )
        .unwrap();
        lua.globals().set("t", t).unwrap();
        let check: bool = lua
            .load(
                r#"return t.text == "the answer is 5" and math.type(t.steps) == "integer"
                    and t.steps == 2 and t.big == 2^64 and t.ms == 1.5 and t.ok == true
                    and t.usage.input == 7 and t.usage.output == 0
                    and #t.tools == 2 and t.tools[1].name == "add" and t.tools[2] == "second"
                    and t.anything_else == "lazy""#,
            )
            .eval()
            .unwrap();
        assert!(check);
    }

    #[test]
    fn a_memory_error_is_an_error_not_a_crash() {
        let lua = Lua::new();
        let used = lua.used_memory();
        lua.set_memory_limit(used + 4096).unwrap();
        let long = "x".repeat(1 << 20);
        let err = record(&lua, &[(c"text", Field::Str(&long))], None).unwrap_err();
        assert!(matches!(err, mlua::Error::MemoryError(_)), "{err:?}");
        // The VM is still usable once the limit allows it.
        lua.set_memory_limit(0).unwrap();
        let t = record(&lua, &[(c"text", Field::Str(&long))], None).unwrap();
        assert_eq!(t.get::<String>("text").unwrap().len(), 1 << 20);
    }
}
