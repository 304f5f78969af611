//! Files between Lua and the core: the `files = {...}` list a history entry, a turn's prompt, a
//! mail or a tool's result carries, the file tables Lua gets back, and `ai.view_file(ref)`.
//!
//! A list entry is a path (`"report.pdf"`, relative to the script's folder), `{ path, name?,
//! content_type? }`, `{ name, data, content_type? }` (the bytes in a Lua string), or a file
//! table colony gave back (`{ ref = ... }`, looked up among the program's files). Every file is
//! recorded once in the core's [`crate::files::Library`].

use mlua::{Lua, Table, Value};

use super::ai::core;
use super::convert::misuse;
use crate::vocab::FileRef;

/// The fields a file entry may have: those that say where its bytes are, and those of a file
/// table colony gives back ([`file_table`], [`view_file`]), so one can be passed back as it is.
const SPEC_FIELDS: &[&str] = &[
    "path",
    "data",
    "ref",
    "name",
    "content_type",
    "kind",
    "size",
    "sha256",
    "shed",
    "text",
];

/// The files of `value` (a list as above); `at` names the field in errors.
pub fn read_files(lua: &Lua, value: Value, at: &str) -> mlua::Result<Vec<FileRef>> {
    let list = match value {
        Value::Nil => return Ok(Vec::new()),
        Value::Table(t) => t,
        other => {
            return Err(misuse(format!(
                "{at} must be a list of files, not a {}",
                other.type_name()
            )));
        }
    };
    let mut files = Vec::new();
    for (i, entry) in list.sequence_values::<Value>().enumerate() {
        files.push(read_file(lua, entry?, &format!("{at}[{}]", i + 1))?);
    }
    Ok(files)
}

fn read_file(lua: &Lua, entry: Value, at: &str) -> mlua::Result<FileRef> {
    let library = core(lua);
    let library = library.files();
    match entry {
        Value::String(path) => {
            let (full, bytes) = read_path(lua, &path, at)?;
            Ok(library.record(&file_name(&full), None, bytes))
        }
        Value::Table(t) => {
            if let Some(file) = held(lua, &t)? {
                return Ok(file);
            }
            // A misspelt field (`contnet_type`, `file`) would be dropped without a word.
            super::convert::check_fields(&t, at, SPEC_FIELDS)?;
            let declared = super::convert::text_field(&t, "content_type", at)?;
            if let Some(ct) = declared.as_deref().filter(|c| !c.trim().is_empty())
                && !crate::files::is_content_type(ct)
            {
                return Err(misuse(format!(
                    "{at}: content_type {ct:?} is not a content type (type/subtype, such as \
                     image/png)"
                )));
            }
            if let Some(handle) = t.get::<Option<String>>("ref")? {
                return library
                    .find(&handle)
                    .map_err(|e| misuse(format!("{at}: {e}")));
            }
            let name = super::convert::text_field(&t, "name", at)?;
            // The model reads the name (`[file a.csv (...)]`): a blank one names nothing.
            if name.as_deref().is_some_and(|n| n.trim().is_empty()) {
                return Err(misuse(format!("{at}: name is empty")));
            }
            let path = t.get::<Option<mlua::LuaString>>("path")?;
            // Both given, one would be dropped without a word (the bytes sent were the path's).
            if path.is_some() && t.contains_key("data")? {
                return Err(misuse(format!(
                    "{at} gives both a path and data: give one (data with a name)"
                )));
            }
            if let Some(path) = path {
                let (full, bytes) = read_path(lua, &path, at)?;
                let name = name.unwrap_or_else(|| file_name(&full));
                return Ok(library.record(&name, declared.as_deref(), bytes));
            }
            let Some(data) = t.get::<Option<mlua::LuaString>>("data")? else {
                return Err(misuse(format!(
                    "{at} needs a path, data (with a name) or a ref"
                )));
            };
            let name = name.ok_or_else(|| misuse(format!("{at}: data needs a name")))?;
            Ok(library.record(&name, declared.as_deref(), data.as_bytes().to_vec()))
        }
        other => Err(misuse(format!(
            "{at} must be a path or a table, not a {}",
            other.type_name()
        ))),
    }
}

/// The bytes at `path` (relative to the script's folder), or a misuse error naming `at`.
fn read_path(
    lua: &Lua,
    path: &mlua::LuaString,
    at: &str,
) -> mlua::Result<(std::path::PathBuf, Vec<u8>)> {
    // An empty path resolves to the script's folder, and was refused as "a folder".
    if path.as_bytes().is_empty() {
        return Err(misuse(format!("{at}: the path is empty")));
    }
    let full = super::sandbox::check_path(
        lua,
        at,
        crate::permissions::Access::Read,
        &super::fs::resolve(lua, path),
    )?;
    let bytes = crate::files::read_to_attach(&full).map_err(|e| {
        let part = match crate::files::TooLarge::of(&e) {
            Some(_) => " (as { name = ..., data = ... } holding some of its bytes)",
            None => "",
        };
        misuse(format!("{at}: cannot read {}: {e}{part}", full.display()))
    })?;
    Ok((full, bytes))
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Where each file table's file is kept: a table with weak keys, file table -> the file. The
/// bytes live as long as the script keeps the table (a history it holds), come back without
/// being read or hashed again, and the table itself stays plain data (`json.encode`,
/// `store.set` take it).
const HELD: &str = "colony.files.held";

struct Held(FileRef);

impl mlua::UserData for Held {}

fn held_map(lua: &Lua) -> mlua::Result<Table> {
    if let Ok(map) = lua.named_registry_value::<Table>(HELD) {
        return Ok(map);
    }
    let map = lua.create_table()?;
    let meta = lua.create_table()?;
    meta.set("__mode", "k")?;
    map.set_metatable(Some(meta))?;
    lua.set_named_registry_value(HELD, &map)?;
    Ok(map)
}

fn held(lua: &Lua, t: &Table) -> mlua::Result<Option<FileRef>> {
    Ok(held_map(lua)?
        .raw_get::<Option<mlua::UserDataRef<Held>>>(t)?
        .map(|h| h.0.clone()))
}

/// A file as Lua sees it: `{ name, content_type, kind, size, ref, sha256 }` (`ref` is what
/// `view_file` and a `files` list take back).
pub fn file_table(lua: &Lua, file: &FileRef) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    if file.data.is_some() {
        held_map(lua)?.raw_set(&t, Held(file.clone()))?;
    }
    if let Some(reason) = &file.shed {
        t.set("shed", reason.as_str())?;
    }
    t.set("name", file.name.as_str())?;
    t.set("content_type", file.content_type.as_str())?;
    t.set("kind", crate::files::kind_of(file).as_str())?;
    t.set("size", file.size)?;
    t.set("ref", file.handle())?;
    t.set("sha256", file.sha256.as_str())?;
    Ok(t)
}

/// A list of file tables, or `None` for no files.
pub fn files_table<'a>(
    lua: &Lua,
    files: impl IntoIterator<Item = &'a FileRef>,
) -> mlua::Result<Option<Table>> {
    let list = lua.create_table()?;
    for f in files {
        list.push(file_table(lua, f)?)?;
    }
    Ok((list.raw_len() > 0).then_some(list))
}

/// `file, err = ai.view_file(ref)`: the file table plus `data` (its bytes), and `text` for a
/// text file; `nil, err` for a reference that names no file of this program.
pub fn view_file(lua: &Lua, handle: String) -> mlua::Result<(Value, Option<String>)> {
    let found = core(lua).files().find(&handle);
    let file = match found {
        Ok(f) => f,
        Err(e) => return Ok((Value::Nil, Some(e.to_string()))),
    };
    let t = file_table(lua, &file)?;
    if let Some(bytes) = file.data.as_deref() {
        t.set("data", lua.create_string(bytes)?)?;
        if crate::files::kind_of(&file) == crate::files::FileKind::Text {
            t.set("text", crate::files::text_of(bytes).into_owned())?;
        }
    }
    Ok((Value::Table(t), None))
}
