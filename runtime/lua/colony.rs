//! The `colony` module: what a script can know about colony itself, so a front end can ground
//! a model in this machine's facts. `colony.version`, `colony.commands()`, `colony.scripts()`,
//! `colony.examples()` and `colony.config()` (the use-types set in the config file, keys left out).

use mlua::{Lua, Table};

use crate::shipped::{self, Shipped};

pub fn register(lua: &Lua) -> mlua::Result<Table> {
    let m = lua.create_table()?;
    m.set("version", env!("CARGO_PKG_VERSION"))?;
    m.set(
        "commands",
        lua.create_function(|lua, ()| {
            let list = lua.create_table()?;
            for (name, about) in crate::shipped::commands() {
                let t = lua.create_table()?;
                t.set("name", name.as_str())?;
                t.set("about", about.as_str())?;
                list.push(t)?;
            }
            Ok(list)
        })?,
    )?;
    m.set(
        "scripts",
        lua.create_function(|lua, ()| files(lua, shipped::SCRIPTS))?,
    )?;
    m.set(
        "examples",
        lua.create_function(|lua, ()| files(lua, shipped::EXAMPLES))?,
    )?;
    m.set("config", lua.create_function(|lua, ()| config(lua))?)?;
    Ok(m)
}

/// `{ { name, file, summary, source }, ... }` in the order shipped.
fn files(lua: &Lua, list: &[Shipped]) -> mlua::Result<Table> {
    let out = lua.create_table()?;
    for s in list {
        let t = lua.create_table()?;
        t.set("name", s.name())?;
        t.set("file", s.file)?;
        t.set("summary", s.summary())?;
        t.set("source", s.source)?;
        out.push(t)?;
    }
    Ok(out)
}

/// `{ { use, provider?, model?, base_url?, key_env?, tools?, key_stored } }`, by use-type name. A stored
/// key is only said to be there: its text never reaches a script.
fn config(lua: &Lua) -> mlua::Result<Table> {
    let core = super::ai::core(lua);
    let out = lua.create_table()?;
    for (name, u) in &core.config().uses {
        let t = lua.create_table()?;
        t.set("use", name.as_str())?;
        t.set("provider", u.provider.clone())?;
        t.set("model", u.model.clone())?;
        t.set("base_url", u.base_url.clone())?;
        t.set("key_env", u.key_env.clone())?;
        t.set("tools", u.tools.clone())?;
        t.set("key_stored", u.key.is_some())?;
        out.push(t)?;
    }
    Ok(out)
}
