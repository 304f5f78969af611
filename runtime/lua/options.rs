//! A script's options table (`ai.ask{...}`, `ai.run{...}`), read once.
//!
//! A turn looks up some thirty options, most of them absent. With the VM's memory limit every
//! `Table::get` is a protected call that first makes its key a Lua string: about a thousand
//! instructions each, 35 K a turn. [`Options::read`] walks the table once (which also finds the
//! keys nobody knows) and answers lookups from what it saw. A table with a metatable is read
//! through `Table::get` as before, so defaults inherited through `__index` still count.

use mlua::{FromLua, Lua, Table, Value};

pub struct Options {
    lua: Lua,
    table: Table,
    /// The table's own entries (string keys), in the order `pairs` gave them.
    entries: Vec<(String, Value)>,
    /// Whether lookups must go through the table (it has a metatable).
    through_table: bool,
}

impl Options {
    /// Reads `table`'s entries. A key that is not a string is refused, named for `who`.
    pub fn read(lua: &Lua, table: Table, who: &str) -> mlua::Result<Options> {
        let mut entries = Vec::new();
        for pair in table.pairs::<Value, Value>() {
            let (k, v) = pair?;
            match k {
                Value::String(s) => entries.push((s.to_string_lossy(), v)),
                other => {
                    return Err(super::convert::misuse(format!(
                        "{who}: an option key must be a string, not {}",
                        other.type_name()
                    )));
                }
            }
        }
        Ok(Options {
            lua: lua.clone(),
            through_table: table.metatable().is_some(),
            table,
            entries,
        })
    }

    /// `opts[key]` as a `T`, as `Table::get` would give it.
    pub fn get<T: FromLua>(&self, key: &str) -> mlua::Result<T> {
        if self.through_table {
            return self.table.get(key);
        }
        let value = self
            .entries
            .iter()
            .find(|(k, _)| k == key)
            .map_or(Value::Nil, |(_, v)| v.clone());
        T::from_lua(value, &self.lua)
    }

    /// The keys the table holds itself.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// The table itself, for a reader that takes one.
    pub fn table(&self) -> &Table {
        &self.table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_as_the_table_would() {
        let lua = Lua::new();
        lua.set_memory_limit(1 << 24).unwrap();
        let t: Table = lua
            .load(r#"return { model = "m", max_steps = 3, stop = { "x" }, timeout = "7" }"#)
            .eval()
            .unwrap();
        let o = Options::read(&lua, t, "ai.run").unwrap();
        assert_eq!(
            o.get::<Option<String>>("model").unwrap().as_deref(),
            Some("m")
        );
        assert_eq!(o.get::<Option<f64>>("max_steps").unwrap(), Some(3.0));
        assert_eq!(o.get::<Option<String>>("absent").unwrap(), None);
        assert!(o.get::<Option<Table>>("stop").unwrap().is_some());
        // A string that reads as a number converts, as through `Table::get`.
        assert_eq!(o.get::<Option<f64>>("timeout").unwrap(), Some(7.0));
        assert!(o.get::<Option<f64>>("model").is_err());
        let mut keys: Vec<&str> = o.keys().collect();
        keys.sort();
        assert_eq!(keys, ["max_steps", "model", "stop", "timeout"]);
    }

    #[test]
    fn inherited_options_still_count() {
        let lua = Lua::new();
        let t: Table = lua
            .load(r#"return setmetatable({ model = "m" }, { __index = { provider = "openai" } })"#)
            .eval()
            .unwrap();
        let o = Options::read(&lua, t, "ai.run").unwrap();
        assert_eq!(
            o.get::<Option<String>>("provider").unwrap().as_deref(),
            Some("openai")
        );
        assert_eq!(
            o.get::<Option<String>>("model").unwrap().as_deref(),
            Some("m")
        );
    }

    #[test]
    fn a_key_that_is_not_a_string_is_named() {
        let lua = Lua::new();
        let t: Table = lua.load(r#"return { "positional" }"#).eval().unwrap();
        let err = Options::read(&lua, t, "ai.run").err().unwrap().to_string();
        assert!(
            err.contains("ai.run: an option key must be a string, not integer"),
            "{err}"
        );
    }
}
