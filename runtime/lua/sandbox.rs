//! The program's [`Permissions`] on the Lua side: the checks colony's own modules make (`fs`,
//! `http`, attached files, `proc`, `mcp.connect` of a command), and wrappers around Lua's own
//! `io`, `os`, `load`, `loadfile` and `dofile`, installed only when something is denied (a
//! program with every permission runs the standard functions untouched).
//!
//! A refusal raises an error naming the flag that grants it; it is not an `nil, err` answer,
//! since no retry can succeed: the fix is the program's permissions.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlua::{Function, Lua, Value};

use super::convert::misuse;
use crate::permissions::{Access, Denied, Permissions};

/// The running program's permissions, in the VM's app data.
#[derive(Clone)]
pub struct Granted(pub Arc<Permissions>);

/// The program's permissions (all, for a VM built without any).
pub fn permissions(lua: &Lua) -> Arc<Permissions> {
    match lua.app_data_ref::<Granted>() {
        Some(g) => g.0.clone(),
        None => Arc::new(Permissions::all()),
    }
}

fn refused(e: Denied) -> mlua::Error {
    misuse(e.to_string())
}

/// Checks that `who` may read or write `path` (already resolved against the script's folder);
/// answers the path to open.
pub fn check_path(lua: &Lua, who: &str, access: Access, path: &Path) -> mlua::Result<PathBuf> {
    permissions(lua)
        .check_path(who, access, path)
        .map_err(refused)
}

/// Checks that `who` may reach `url`.
pub fn check_net(lua: &Lua, who: &str, url: &reqwest::Url) -> mlua::Result<()> {
    permissions(lua).check_net(who, url).map_err(refused)
}

/// Checks that `who` may start `command`.
pub fn check_run(lua: &Lua, who: &str, command: &str) -> mlua::Result<()> {
    permissions(lua)
        .check_run(who, &format!("running {}", quoted(command)))
        .map_err(refused)
}

/// A command as a message shows it: quoted, and cut when long.
fn quoted(command: &str) -> String {
    const MAX: usize = 80;
    match command.char_indices().nth(MAX) {
        Some((at, _)) => format!("{:?}...", &command[..at]),
        None => format!("{command:?}"),
    }
}

/// Keeps `permissions` in the VM and, unless everything is granted, wraps the standard library
/// functions that reach files, processes and the environment.
pub fn install(lua: &Lua, permissions: Arc<Permissions>) -> mlua::Result<()> {
    let (all, may_run) = (permissions.is_all(), permissions.run);
    lua.set_app_data(Granted(permissions));
    if all {
        return Ok(());
    }
    let check = lua.create_function(|lua, (kind, who, subject): (String, String, Value)| {
        let text = match &subject {
            Value::String(s) => s.to_string_lossy(),
            Value::Nil if kind == "binary" => String::new(),
            // `io.open(nil)` was checked as the empty path: "reading  needs --allow-read=".
            Value::Nil => {
                return Err(misuse(format!(
                    "bad argument #1 to '{who}': string expected, got nil"
                )));
            }
            other => {
                return Err(misuse(format!(
                    "{who}: expected a string, not a {}",
                    other.type_name()
                )));
            }
        };
        let p = self::permissions(lua);
        let checked = match kind.as_str() {
            // `io` and `os` resolve a relative path against the current directory, as the
            // operating system does.
            "read" => p.check_path(&who, Access::Read, Path::new(&text)).map(drop),
            "write" => p
                .check_path(&who, Access::Write, Path::new(&text))
                .map(drop),
            // The entry itself (`os.remove`, `os.rename`): a symlink is not followed.
            "entry" => p
                .check_entry(&who, Access::Write, Path::new(&text))
                .map(drop),
            // A module `require` found: readable, or in the script's own folder.
            "module" => match p.check_path(&who, Access::Read, Path::new(&text)) {
                Err(_) if in_script_folder(lua, Path::new(&text)) => Ok(()),
                checked => checked.map(drop),
            },
            "run" => p.check_run(&who, &format!("running {}", quoted(&text))),
            "binary" => p.check_run(&who, "loading a binary chunk"),
            "env" => p.check_env(&who, &text),
            other => unreachable!("no permission check {other}"),
        };
        checked.map_err(refused)
    })?;
    let wrap: Function = lua
        .load(WRAPPERS)
        .set_name("=colony.sandbox")
        .into_function()?;
    wrap.call::<()>((check, may_run))
}

/// Whether `path` is a Lua file in the running script's folder, where `require` finds the
/// script's own modules whatever `--allow-read` says. Only `.lua` files: a `package.path` with
/// no `?` named any file there (a `.env` of `KEY="..."` lines is Lua too).
fn in_script_folder(lua: &Lua, path: &Path) -> bool {
    if path.extension().is_none_or(|e| e != "lua") {
        return false;
    }
    let Some(dir) = lua
        .app_data_ref::<super::fs::ScriptDir>()
        .map(|d| d.0.clone())
    else {
        return false;
    };
    let dir = crate::permissions::resolve(&dir);
    crate::permissions::resolve(path).starts_with(dir)
}

/// The wrappers, in Lua: each checks, then calls the function it replaces with the arguments as
/// given (`load` and `loadfile` count their arguments, so none is added).
const WRAPPERS: &str = r#"
local check, may_run = ...
local io_open, io_lines, io_input, io_output, io_popen = io.open, io.lines, io.input, io.output, io.popen
local os_execute, os_getenv, os_remove, os_rename = os.execute, os.getenv, os.remove, os.rename
local os_tmpname = os.tmpname
local raw_load, raw_loadfile = load, loadfile
local function writes(mode)
  return type(mode) == "string" and mode:find("[wa+]") ~= nil
end
io.open = function(path, mode, ...)
  check(writes(mode) and "write" or "read", "io.open", path)
  return io_open(path, mode, ...)
end
io.lines = function(path, ...)
  if path ~= nil then check("read", "io.lines", path) end
  return io_lines(path, ...)
end
io.input = function(file, ...)
  if type(file) == "string" then check("read", "io.input", file) end
  return io_input(file, ...)
end
io.output = function(file, ...)
  if type(file) == "string" then check("write", "io.output", file) end
  return io_output(file, ...)
end
io.popen = function(command, ...)
  check("run", "io.popen", command)
  return io_popen(command, ...)
end
os.execute = function(command, ...)
  -- `os.execute()` only asks whether a shell exists.
  if command == nil then return may_run end
  check("run", "os.execute", command)
  return os_execute(command, ...)
end
os.getenv = function(name, ...)
  check("env", "os.getenv", name)
  return os_getenv(name, ...)
end
os.remove = function(path, ...)
  check("entry", "os.remove", path)
  return os_remove(path, ...)
end
os.rename = function(from, to, ...)
  check("entry", "os.rename", from)
  check("entry", "os.rename", to)
  return os_rename(from, to, ...)
end
-- Lua's tmpname creates its file in /tmp (LUA_TMPNAMTEMPLATE).
os.tmpname = function(...)
  check("write", "os.tmpname", "/tmp")
  return os_tmpname(...)
end
-- `require` of a Lua file: the standard searcher, with the file it finds checked first. (C
-- modules are not loaded by this VM at all.)
local searchpath = package.searchpath
if package.searchers and package.searchers[2] then
  package.searchers[2] = function(name)
    local found, err = searchpath(name, package.path)
    if not found then return "\n\t" .. err end
    check("module", "require", found)
    local chunk, why = raw_loadfile(found, may_run and "bt" or "t")
    if not chunk then
      error(("error loading module '%s' from file '%s':\n\t%s"):format(name, found, why), 2)
    end
    return chunk, found
  end
end
package.searchpath = function(name, path, ...)
  local found, err = searchpath(name, path, ...)
  if found then check("module", "package.searchpath", found) end
  return found, err
end
if not may_run then
  -- A binary chunk can break the VM's memory safety: only text, unless processes are allowed.
  load = function(chunk, name, mode, ...)
    if type(chunk) == "string" and chunk:byte(1) == 27 then check("binary", "load") end
    return raw_load(chunk, name, "t", ...)
  end
  loadfile = function(path, mode, ...)
    if path ~= nil then check("read", "loadfile", path) end
    return raw_loadfile(path, "t", ...)
  end
  dofile = function(path)
    if path ~= nil then check("read", "dofile", path) end
    local f, err = loadfile(path)
    if not f then error(err, 2) end
    return f()
  end
else
  loadfile = function(path, ...)
    if path ~= nil then check("read", "loadfile", path) end
    return raw_loadfile(path, ...)
  end
  local raw_dofile = dofile
  dofile = function(path, ...)
    if path ~= nil then check("read", "dofile", path) end
    return raw_dofile(path, ...)
  end
end
"#;
