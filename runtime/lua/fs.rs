//! The `fs` module: `fs.read`, `fs.write`, `fs.list`, `fs.stat`, `fs.exists`, `fs.absolute`.
//!
//! A relative path resolves against the folder of the running script ([`ScriptDir`], set when
//! the VM runs a file), or the current directory for sources that are not files. All calls use
//! `tokio::fs`, so a slow disk suspends only the calling coroutine. Failures are `nil, err` with
//! `err.kind` one of `not_found`, `permission_denied`, `io_error` and the path in the message.
//! `fs.write` writes a temporary file beside the target and renames it over, so a reader sees
//! the old file or the new one, never half of one; a symlink stays a link and the file its mode.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

use mlua::{Lua, LuaString, MultiValue, Table, Value};

use super::convert::{arg, error_table};
use crate::permissions::Access;

/// The folder of the script the VM runs, for resolving relative paths.
#[derive(Clone, Debug)]
pub struct ScriptDir(pub PathBuf);

pub fn register(lua: &Lua) -> mlua::Result<Table> {
    let fs = lua.create_table()?;
    fs.set(
        "read",
        lua.create_async_function(|lua, path: Value| async move {
            let path: LuaString = arg(&lua, "fs.read", 1, path)?;
            let path = checked(&lua, "fs.read", Access::Read, &path)?;
            let limit = lua
                .app_data_ref::<super::convert::MemoryLimit>()
                .map(|m| m.0 as u64);
            match read_within(&path, limit).await {
                Ok(Some(bytes)) => ok(Value::String(lua.create_string(&bytes)?)),
                Ok(None) => {
                    let limit = crate::providers::body::describe_limit(limit.unwrap_or(0));
                    let regular = std::fs::metadata(&path).is_ok_and(|m| m.is_file());
                    // A device or a pipe that gave that much may never end (`/dev/zero`):
                    // raising the limit is no cure for it.
                    let message = if regular {
                        format!(
                            "fs.read: {}: larger than the program's memory limit of {limit} \
                             (--max-memory), so it could never be held",
                            path.display()
                        )
                    } else {
                        format!(
                            "fs.read: {}: not a regular file, and it gave more than the \
                             program's memory limit of {limit} without ending (a device or a \
                             pipe that may never end)",
                            path.display()
                        )
                    };
                    let err = error_table(&lua, "too_large", &message)?;
                    err.set("path", path.display().to_string())?;
                    Ok(MultiValue::from_iter([Value::Nil, Value::Table(err)]))
                }
                Err(e) => failed(&lua, "read", &path, &e),
            }
        })?,
    )?;
    fs.set(
        "write",
        lua.create_async_function(|lua, (path, text): (Value, Value)| async move {
            let path: LuaString = arg(&lua, "fs.write", 1, path)?;
            let text: LuaString = arg(&lua, "fs.write", 2, text)?;
            let path = checked(&lua, "fs.write", Access::Write, &path)?;
            let bytes = text.as_bytes().to_vec();
            match write_atomic(&path, &bytes).await {
                Ok(()) => ok(Value::Boolean(true)),
                Err(e) => failed(&lua, "write", &path, &e),
            }
        })?,
    )?;
    fs.set(
        "list",
        lua.create_async_function(|lua, dir: Value| async move {
            let dir: LuaString = arg(&lua, "fs.list", 1, dir)?;
            let dir = checked(&lua, "fs.list", Access::Read, &dir)?;
            match list(&dir).await {
                Ok(names) => {
                    let names = names
                        .iter()
                        .map(|n| lua.create_string(n))
                        .collect::<mlua::Result<Vec<_>>>()?;
                    let t = lua.create_sequence_from(names)?;
                    ok(Value::Table(t))
                }
                Err(e) => failed(&lua, "list", &dir, &e),
            }
        })?,
    )?;
    fs.set(
        "stat",
        lua.create_async_function(|lua, path: Value| async move {
            let path: LuaString = arg(&lua, "fs.stat", 1, path)?;
            let path = checked(&lua, "fs.stat", Access::Read, &path)?;
            match tokio::fs::metadata(&path).await {
                Ok(meta) => {
                    let t = lua.create_table()?;
                    t.set("size", meta.len())?;
                    let modified = meta
                        .modified()
                        .ok()
                        .and_then(|m| m.duration_since(UNIX_EPOCH).ok())
                        .map(|d| d.as_secs_f64());
                    t.set("modified", modified)?;
                    t.set("is_dir", meta.is_dir())?;
                    t.set("is_file", meta.is_file())?;
                    ok(Value::Table(t))
                }
                Err(e) => failed(&lua, "stat", &path, &e),
            }
        })?,
    )?;
    fs.set(
        "exists",
        lua.create_async_function(|lua, path: Value| async move {
            let path: LuaString = arg(&lua, "fs.exists", 1, path)?;
            let path = checked(&lua, "fs.exists", Access::Read, &path)?;
            Ok(tokio::fs::try_exists(&path).await.unwrap_or(false))
        })?,
    )?;
    // `fs.absolute(path)`: the path the other calls would use, made absolute (not resolved
    // through symlinks, and the file need not exist), for handing a path to something that
    // runs elsewhere (a file attached to a message).
    fs.set(
        "absolute",
        lua.create_function(|lua, path: Value| {
            let path = resolve(lua, &arg(lua, "fs.absolute", 1, path)?);
            Ok(std::path::absolute(&path)
                .unwrap_or(path)
                .display()
                .to_string())
        })?,
    )?;
    Ok(fs)
}

/// `path` resolved as [`resolve`] does, once the program's permissions grant `access` to it
/// (else the error names the flag); the path checked is the path used.
fn checked(lua: &Lua, who: &str, access: Access, path: &LuaString) -> mlua::Result<PathBuf> {
    super::sandbox::check_path(lua, who, access, &resolve(lua, path))
}

/// `path` as the script means it: absolute as given, relative against the script's folder.
pub fn resolve(lua: &Lua, path: &LuaString) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    // The bytes as given: a name that is not UTF-8 is a name all the same.
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(&path.as_bytes()));
    if path.is_absolute() {
        return path;
    }
    match lua.app_data_ref::<ScriptDir>() {
        Some(dir) => dir.0.join(path),
        None => path,
    }
}

fn ok(v: Value) -> mlua::Result<MultiValue> {
    Ok(MultiValue::from_iter([v]))
}

fn failed(lua: &Lua, what: &str, path: &Path, e: &std::io::Error) -> mlua::Result<MultiValue> {
    let kind = match e.kind() {
        std::io::ErrorKind::NotFound => "not_found",
        std::io::ErrorKind::PermissionDenied => "permission_denied",
        _ => "io_error",
    };
    let err = error_table(lua, kind, &format!("fs.{what}: {}: {e}", path.display()))?;
    err.set("path", path.display().to_string())?;
    Ok(MultiValue::from_iter([Value::Nil, Value::Table(err)]))
}

/// The file's bytes, or `None` when it holds more than `limit` (the program's memory limit):
/// such a file could never become a Lua string, and was read whole first (4 GiB read, then a
/// memory error; `/dev/zero` until the machine ran out).
async fn read_within(path: &Path, limit: Option<u64>) -> std::io::Result<Option<Vec<u8>>> {
    use tokio::io::AsyncReadExt;
    let Some(limit) = limit else {
        return tokio::fs::read(path).await.map(Some);
    };
    let file = tokio::fs::File::open(path).await?;
    let size = file
        .metadata()
        .await
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len());
    if size.is_some_and(|s| s > limit) {
        return Ok(None);
    }
    // A device or a pipe has no size: its buffer is the limit and a byte, reserved at once
    // (address space; only what is read is touched). Grown by doubling, one that never ends
    // (`/dev/zero`) left every smaller buffer behind it before it was refused: 2.6 GB at a
    // limit of 1 GiB, 650 MB at 256 MiB.
    let most = usize::try_from(limit.saturating_add(1)).unwrap_or(usize::MAX);
    let mut bytes = match size {
        Some(size) => Vec::with_capacity(size as usize),
        None => Vec::with_capacity(most),
    };
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .await?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

/// The names in `dir`, sorted, as the bytes they are (a name that is not UTF-8 read back by
/// `fs.read` must name the same file).
async fn list(dir: &Path) -> std::io::Result<Vec<Vec<u8>>> {
    use std::os::unix::ffi::OsStrExt;
    let mut entries = tokio::fs::read_dir(dir).await?;
    let mut names = Vec::new();
    while let Some(entry) = entries.next_entry().await? {
        names.push(entry.file_name().as_bytes().to_vec());
    }
    names.sort();
    Ok(names)
}

/// Writes `bytes` to a temporary file in `path`'s folder, then renames it over `path`.
///
/// What a write in place keeps, this keeps too:
/// - a symlink stays a link: the file it ends at is written (a rename over the link replaced
///   it with a plain file);
/// - the file's mode: the temporary file takes it before the rename (a script made `0600`
///   notes world-readable, and a written script lost its exec bit);
/// - a read-only file is refused (`permission_denied`), though a rename would replace it;
/// - the file's owner, where this process may give it (root writing a user's file made it
///   root's);
/// - what is not a plain file, or a file with other hard links, is written in place, as a
///   shell's `>` writes it: the rename replaced a device (`/dev/null`) or a named pipe with a
///   plain file, and left the other links holding the old contents.
async fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let path = &link_target(path).await;
    let found = tokio::fs::metadata(path).await.ok();
    if found
        .as_ref()
        .is_some_and(|m| !m.is_dir() && (!m.is_file() || m.nlink() > 1))
    {
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .truncate(found.as_ref().is_some_and(|m| m.is_file()))
            .open(path)
            .await?;
        tokio::io::AsyncWriteExt::write_all(&mut file, bytes).await?;
        return tokio::io::AsyncWriteExt::flush(&mut file).await;
    }
    let existing = found.filter(|m| m.is_file());
    if existing
        .as_ref()
        .is_some_and(|m| m.permissions().readonly())
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the file is read-only",
        ));
    }
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    // The name's start only: a name near the folder's limit (255 bytes) with the suffix added
    // was too long to create ("File name too long"), though the file itself could be.
    let start: String = name.to_string_lossy().chars().take(64).collect();
    let tmp_name = format!(
        ".{start}.{}-{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let tmp = path.with_file_name(tmp_name);
    let written = async {
        tokio::fs::write(&tmp, bytes).await?;
        if let Some(meta) = &existing {
            tokio::fs::set_permissions(&tmp, meta.permissions()).await?;
            if let Err(e) = std::os::unix::fs::chown(&tmp, Some(meta.uid()), Some(meta.gid())) {
                // Not ours to give (only root may give a file away): it becomes this user's,
                // as a file it creates does.
                tracing::debug!("fs.write: cannot keep the owner of {}: {e}", path.display());
            }
        }
        tokio::fs::rename(&tmp, path).await
    };
    if let Err(e) = written.await {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e);
    }
    Ok(())
}

/// The path a chain of symlinks at `path` ends at (at most 40 links, the kernel's own limit),
/// or `path` itself when it is not a link. A link to nothing ends at the path it names, which
/// the write creates, as writing through the link in place would.
async fn link_target(path: &Path) -> PathBuf {
    let mut path = path.to_path_buf();
    for _ in 0..40 {
        let Ok(target) = tokio::fs::read_link(&path).await else {
            break;
        };
        // An absolute target replaces the folder it is joined to.
        path = match path.parent() {
            Some(dir) => dir.join(target),
            None => target,
        };
    }
    path
}
