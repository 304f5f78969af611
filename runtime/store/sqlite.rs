//! The embedded default [`Store`]: one SQLite file (`store.sqlite3` in the state directory).
//!
//! One connection behind a mutex (rusqlite's `Connection` is `Send`, not `Sync`), in WAL mode
//! with `synchronous=FULL`: a call returns once its transaction is on disk. Values are kept as
//! JSON text, so whatever `serde_json::Value` holds comes back exactly (integers stay integers,
//! floats stay floats, `{}` stays an object and `[]` an array).
//!
//! Opening never "repairs": a file that is not SQLite, is not a colony store, fails
//! `PRAGMA quick_check`, or was written by a newer colony (`PRAGMA user_version` above
//! [`SCHEMA_VERSION`]) is refused with [`StoreError::Damaged`] or [`StoreError::TooNew`] and
//! left exactly as it was.

use std::cell::Cell as StdCell;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{AuditEntry, AuditFilter, Cell, JournalEntry, Store, StoreError, StoreResult};
use crate::residents::Mail;
use crate::residents::middleware::BreakerState;
use crate::vocab::{FileRef, Message, Part};

/// `PRAGMA application_id` of a colony store ("Coln"): tells our files from other SQLite files.
pub const APPLICATION_ID: i32 = 0x436f_6c6e;

/// The schema version this build writes: the number of `MIGRATIONS`.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How long a write waits for another connection's transaction before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema, one step per version: `MIGRATIONS[i]` takes a file from version `i` to `i + 1`.
/// Append only; never edit a released step.
const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    "CREATE TABLE kv (
         space TEXT NOT NULL,
         key   TEXT NOT NULL,
         value TEXT NOT NULL,
         PRIMARY KEY (space, key)
     ) WITHOUT ROWID;
     CREATE TABLE cells (
         name     TEXT PRIMARY KEY,
         messages TEXT NOT NULL,
         dropped  INTEGER NOT NULL DEFAULT 0
     );
     CREATE TABLE backlog (
         seq  INTEGER PRIMARY KEY AUTOINCREMENT,
         name TEXT NOT NULL,
         mail TEXT NOT NULL
     );
     CREATE INDEX backlog_by_name ON backlog (name, seq);
     CREATE TABLE journal (
         name    TEXT NOT NULL,
         call_id TEXT NOT NULL,
         tool    TEXT NOT NULL,
         result  TEXT,
         PRIMARY KEY (name, call_id)
     );
     CREATE TABLE breakers (
         key   TEXT PRIMARY KEY,
         state TEXT NOT NULL
     );
     CREATE TABLE audit (
         id          INTEGER PRIMARY KEY AUTOINCREMENT,
         at_ms       INTEGER NOT NULL,
         resident    TEXT NOT NULL,
         tool        TEXT NOT NULL,
         args_hash   TEXT NOT NULL,
         duration_ms REAL NOT NULL,
         outcome     TEXT NOT NULL
     );
     CREATE INDEX audit_by_resident ON audit (resident, id);
     CREATE INDEX audit_by_tool ON audit (tool, id);",
    // 2: the mail ids each persisted resident has accepted (`ai.mail{ id = ... }`).
    "CREATE TABLE accepted (
         name TEXT NOT NULL,
         id   TEXT NOT NULL,
         PRIMARY KEY (name, id)
     ) WITHOUT ROWID;",
    // 3: the bytes of attached files, once each by content hash (messages and mail hold
    // references).
    "CREATE TABLE files (
         sha256 TEXT PRIMARY KEY,
         data   BLOB NOT NULL
     );
     ALTER TABLE journal ADD COLUMN files TEXT;",
    // 4: what the model was told of a call that did not go well.
    "ALTER TABLE audit ADD COLUMN message TEXT;",
];

thread_local! {
    /// The store whose `update` function is running on this thread (its address), if any:
    /// calling that store from inside the function would deadlock on its mutex.
    static IN_UPDATE: StdCell<usize> = const { StdCell::new(0) };
}

/// The SQLite [`Store`].
pub struct SqliteStore {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// The state directory's lock, when the store was opened through
    /// [`StateDir`](super::state_dir::StateDir): held as long as the store lives. Declared after
    /// `conn` so the connection closes (and checkpoints) before the lock is released.
    lock: Option<File>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the store at `path`, bringing its schema up to
    /// [`SCHEMA_VERSION`]. Refuses a file that is not a colony store or is damaged
    /// ([`StoreError::Damaged`]) or that a newer colony wrote ([`StoreError::TooNew`]), leaving it
    /// untouched.
    pub fn open(path: &Path) -> StoreResult<SqliteStore> {
        let shown = path.display();
        check_header(path)?;
        let conn = Connection::open(path).map_err(|e| classify(path, "cannot open it", e))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| classify(path, "cannot set the busy timeout", e))?;

        // Read-only checks first: nothing is written before the file is known to be ours.
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| classify(path, "cannot read its schema version", e))?;
        let app_id: i32 = conn
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .map_err(|e| classify(path, "cannot read its application id", e))?;
        if version == 0 {
            let tables: i64 = conn
                .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
                .map_err(|e| classify(path, "cannot read its schema", e))?;
            if tables > 0 || (app_id != 0 && app_id != APPLICATION_ID) {
                return Err(StoreError::Damaged(format!(
                    "{shown} is not a colony store (an SQLite database with other tables); \
                     it was left as it is"
                )));
            }
        } else if app_id != APPLICATION_ID {
            return Err(StoreError::Damaged(format!(
                "{shown} is not a colony store (SQLite application id {app_id:#x}, schema \
                 version {version}); it was left as it is"
            )));
        }
        if version > SCHEMA_VERSION {
            return Err(StoreError::TooNew(format!(
                "{shown} was written by a newer colony (store schema version {version}; this \
                 colony knows versions up to {SCHEMA_VERSION}); it was left as it is: run it \
                 with that newer colony"
            )));
        }
        if version < 0 {
            return Err(StoreError::Damaged(format!(
                "{shown} has an impossible schema version {version}; it was left as it is"
            )));
        }
        quick_check(&conn, path)?;

        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .map_err(|e| classify(path, "cannot switch it to WAL mode", e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Io(format!(
                "{shown}: SQLite refused WAL mode (journal mode is {mode})"
            )));
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| classify(path, "cannot set synchronous=FULL", e))?;

        let mut store = SqliteStore {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
            lock: None,
        };
        store.migrate(version)?;
        Ok(store)
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps `lock` (an open, locked file) alive as long as the store.
    pub(super) fn hold_lock(mut self, lock: File) -> SqliteStore {
        self.lock = Some(lock);
        self
    }

    /// The schema version the file is at (after opening, always [`SCHEMA_VERSION`]).
    pub fn schema_version(&self) -> StoreResult<i64> {
        let conn = self.conn()?;
        conn.pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| self.err(e))
    }

    fn migrate(&mut self, from: i64) -> StoreResult<()> {
        let path = self.path.clone();
        let conn = self.conn.get_mut().unwrap_or_else(|e| e.into_inner());
        for (i, step) in MIGRATIONS.iter().enumerate().skip(from as usize) {
            let to = i as i64 + 1;
            let what = format!("cannot bring its schema to version {to}");
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| classify(&path, &what, e))?;
            tx.execute_batch(step)
                .map_err(|e| classify(&path, &what, e))?;
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(|e| classify(&path, &what, e))?;
            tx.pragma_update(None, "user_version", to)
                .map_err(|e| classify(&path, &what, e))?;
            tx.commit().map_err(|e| classify(&path, &what, e))?;
        }
        Ok(())
    }

    /// The connection, refused from inside this store's own `update` function.
    fn conn(&self) -> StoreResult<MutexGuard<'_, Connection>> {
        if IN_UPDATE.with(|c| c.get()) == self as *const _ as usize {
            return Err(StoreError::Value(format!(
                "{}: the store cannot be used from inside an update function",
                self.path.display()
            )));
        }
        // A panic while the lock was held rolled its transaction back (rusqlite's `Transaction`
        // rolls back on drop), so the connection is fine to use.
        Ok(self.conn.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn err(&self, e: rusqlite::Error) -> StoreError {
        classify(&self.path, "", e)
    }

    fn decode<T: DeserializeOwned>(
        &self,
        what: impl std::fmt::Display,
        text: &str,
    ) -> StoreResult<T> {
        serde_json::from_str(text).map_err(|e| {
            StoreError::Damaged(format!(
                "{}: {what} is not what colony wrote: {e}",
                self.path.display()
            ))
        })
    }
}

/// JSON text for a value colony wrote (these serialisations cannot fail: no maps with non-string
/// keys, no NaN in a `serde_json::Value`).
fn encode<T: Serialize + ?Sized>(path: &Path, value: &T) -> StoreResult<String> {
    serde_json::to_string(value).map_err(|e| {
        StoreError::Value(format!(
            "{}: cannot write a value as JSON: {e}",
            path.display()
        ))
    })
}

/// SQLite files start with this; anything else (non-empty) is not ours, and SQLite is not given
/// the chance to look further.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

fn check_header(path: &Path) -> StoreResult<()> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(StoreError::Io(format!(
                "{}: cannot read it: {e}",
                path.display()
            )));
        }
    };
    let mut head = Vec::with_capacity(16);
    (&mut file)
        .take(16)
        .read_to_end(&mut head)
        .map_err(|e| StoreError::Io(format!("{}: cannot read it: {e}", path.display())))?;
    if head.is_empty() {
        // A store colony opened holds at least its header (switching to WAL mode writes it), so
        // an empty file is one whose contents were lost (truncated, a failed copy) or not a
        // store at all: starting afresh in it would lose the program's state without a word.
        return Err(StoreError::Damaged(format!(
            "{} is empty (0 bytes): a colony store is never empty once opened, so its contents \
             were lost or it is not a store; it was left as it is (remove it to start afresh)",
            path.display()
        )));
    }
    if head.as_slice() == SQLITE_HEADER {
        return Ok(());
    }
    Err(StoreError::Damaged(format!(
        "{} is not a colony store (not an SQLite database); it was left as it is",
        path.display()
    )))
}

fn quick_check(conn: &Connection, path: &Path) -> StoreResult<()> {
    let mut problems = Vec::new();
    conn.pragma_query(None, "quick_check", |r| {
        let line: String = r.get(0)?;
        if line != "ok" {
            problems.push(line);
        }
        Ok(())
    })
    .map_err(|e| classify(path, "cannot check it", e))?;
    if problems.is_empty() {
        return Ok(());
    }
    let shown: Vec<&str> = problems.iter().take(3).map(String::as_str).collect();
    Err(StoreError::Damaged(format!(
        "{} is damaged (quick_check: {}{}); it was left as it is",
        path.display(),
        shown.join("; "),
        if problems.len() > 3 { "; ..." } else { "" }
    )))
}

/// A rusqlite error as a [`StoreError`] naming the file: corruption is `Damaged`, the rest `Io`.
fn classify(path: &Path, doing: &str, e: rusqlite::Error) -> StoreError {
    let shown = path.display();
    let sep = if doing.is_empty() { "" } else { ": " };
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => StoreError::Damaged(format!(
            "{shown} is not a colony store (not an SQLite database): {e}; it was left as it is"
        )),
        Some(ErrorCode::DatabaseCorrupt) => StoreError::Damaged(format!(
            "{shown} is damaged: {doing}{sep}{e}; it was left as it is"
        )),
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => StoreError::Io(format!(
            "{shown} is busy (another connection kept it locked): {doing}{sep}{e}"
        )),
        _ => StoreError::Io(format!("{shown}: {doing}{sep}{e}")),
    }
}

/// The smallest string greater than every string starting with `prefix` (in byte order, which is
/// code point order for UTF-8), or `None` when there is none.
fn prefix_successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = last as u32 + 1;
        if next == 0xD800 {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Marks `store`'s update function as running on this thread until dropped.
struct UpdateGuard(usize);

impl UpdateGuard {
    fn enter(store: &SqliteStore) -> UpdateGuard {
        UpdateGuard(IN_UPDATE.with(|c| c.replace(store as *const _ as usize)))
    }
}

impl Drop for UpdateGuard {
    fn drop(&mut self) {
        IN_UPDATE.with(|c| c.set(self.0));
    }
}

/// Writes the bytes of each file not stored yet (in the caller's transaction, so a message
/// never refers to bytes that are not on disk).
fn save_files<'a>(
    conn: &Connection,
    files: impl Iterator<Item = &'a FileRef>,
) -> rusqlite::Result<()> {
    let mut known = conn.prepare_cached("SELECT 1 FROM files WHERE sha256 = ?1")?;
    let mut insert = conn.prepare_cached("INSERT INTO files (sha256, data) VALUES (?1, ?2)")?;
    for file in files {
        let Some(data) = file.data.as_deref() else {
            continue;
        };
        // Asked first so a step does not hand SQLite every attachment's bytes again.
        if !known.exists(params![file.sha256])? {
            insert.execute(params![file.sha256, data])?;
        }
    }
    Ok(())
}

/// Puts the stored bytes back beside each reference (one copy per hash).
fn load_files<'a>(
    conn: &Connection,
    files: impl Iterator<Item = &'a mut FileRef>,
) -> rusqlite::Result<()> {
    let mut loaded: std::collections::HashMap<String, std::sync::Arc<[u8]>> = Default::default();
    let mut stmt = conn.prepare_cached("SELECT data FROM files WHERE sha256 = ?1")?;
    for file in files {
        if file.data.is_some() {
            continue;
        }
        if let Some(data) = loaded.get(&file.sha256) {
            file.data = Some(data.clone());
            continue;
        }
        let data: Option<Vec<u8>> = stmt
            .query_row(params![file.sha256], |r| r.get(0))
            .optional()?;
        if let Some(data) = data {
            let data: std::sync::Arc<[u8]> = data.into();
            loaded.insert(file.sha256.clone(), data.clone());
            file.data = Some(data);
        }
    }
    Ok(())
}

fn ensure_cell(conn: &Connection, name: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT OR IGNORE INTO cells (name, messages, dropped) VALUES (?1, '[]', 0)",
        params![name],
    )?;
    Ok(())
}

impl Store for SqliteStore {
    fn get(&self, space: &str, key: &str) -> StoreResult<Option<Value>> {
        let conn = self.conn()?;
        let text: Option<String> = conn
            .query_row(
                "SELECT value FROM kv WHERE space = ?1 AND key = ?2",
                params![space, key],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        text.map(|t| self.decode(format_args!("the value of {key:?}"), &t))
            .transpose()
    }

    fn set(&self, space: &str, key: &str, value: &Value) -> StoreResult<()> {
        let text = encode(&self.path, value)?;
        let conn = self.conn()?;
        conn.execute(
            "INSERT INTO kv (space, key, value) VALUES (?1, ?2, ?3)
             ON CONFLICT (space, key) DO UPDATE SET value = excluded.value",
            params![space, key, text],
        )
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn delete(&self, space: &str, key: &str) -> StoreResult<bool> {
        let conn = self.conn()?;
        let n = conn
            .execute(
                "DELETE FROM kv WHERE space = ?1 AND key = ?2",
                params![space, key],
            )
            .map_err(|e| self.err(e))?;
        Ok(n > 0)
    }

    fn list(&self, space: &str, prefix: &str) -> StoreResult<Vec<String>> {
        let conn = self.conn()?;
        // A range on the primary key, not LIKE: `%` and `_` in a prefix are plain characters.
        let keys = match prefix_successor(prefix) {
            Some(end) => {
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT key FROM kv WHERE space = ?1 AND key >= ?2 AND key < ?3 \
                         ORDER BY key",
                    )
                    .map_err(|e| self.err(e))?;
                stmt.query_map(params![space, prefix, end], |r| r.get(0))
                    .and_then(|rows| rows.collect::<rusqlite::Result<Vec<String>>>())
            }
            None => {
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT key FROM kv WHERE space = ?1 AND key >= ?2 ORDER BY key",
                    )
                    .map_err(|e| self.err(e))?;
                stmt.query_map(params![space, prefix], |r| r.get(0))
                    .and_then(|rows| rows.collect::<rusqlite::Result<Vec<String>>>())
            }
        };
        keys.map_err(|e| self.err(e))
    }

    fn update(
        &self,
        space: &str,
        key: &str,
        f: &mut dyn FnMut(Option<Value>) -> Result<Option<Value>, String>,
    ) -> StoreResult<Option<Value>> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.err(e))?;
        let text: Option<String> = tx
            .query_row(
                "SELECT value FROM kv WHERE space = ?1 AND key = ?2",
                params![space, key],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        let current = text
            .map(|t| self.decode::<Value>(&format!("the value of {key:?}"), &t))
            .transpose()?;
        let new = {
            let _guard = UpdateGuard::enter(self);
            f(current).map_err(|msg| {
                StoreError::Value(format!("the update function for {key:?} failed: {msg}"))
            })?
        };
        match &new {
            Some(value) => {
                let text = encode(&self.path, value)?;
                tx.execute(
                    "INSERT INTO kv (space, key, value) VALUES (?1, ?2, ?3)
                     ON CONFLICT (space, key) DO UPDATE SET value = excluded.value",
                    params![space, key, text],
                )
                .map_err(|e| self.err(e))?;
            }
            None => {
                tx.execute(
                    "DELETE FROM kv WHERE space = ?1 AND key = ?2",
                    params![space, key],
                )
                .map_err(|e| self.err(e))?;
            }
        }
        tx.commit().map_err(|e| self.err(e))?;
        Ok(new)
    }

    fn conversations(&self) -> StoreResult<Vec<String>> {
        let conn = self.conn()?;
        let mut stmt = conn
            .prepare_cached("SELECT name FROM cells ORDER BY name")
            .map_err(|e| self.err(e))?;
        stmt.query_map([], |r| r.get(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<String>>>())
            .map_err(|e| self.err(e))
    }

    fn load_cell(&self, name: &str) -> StoreResult<Option<Cell>> {
        let mut conn = self.conn()?;
        // One read transaction: a consistent picture of the three tables.
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        let row: Option<(String, i64)> = tx
            .prepare_cached("SELECT messages, dropped FROM cells WHERE name = ?1")
            .and_then(|mut stmt| {
                stmt.query_row(params![name], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(|e| self.err(e))?;
        let Some((messages, dropped)) = row else {
            return Ok(None);
        };
        let mut messages: Vec<Message> =
            self.decode(format_args!("the conversation of {name:?}"), &messages)?;

        let mail: Vec<String> = {
            let mut stmt = tx
                .prepare_cached("SELECT mail FROM backlog WHERE name = ?1 ORDER BY seq")
                .map_err(|e| self.err(e))?;
            stmt.query_map(params![name], |r| r.get(0))
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<String>>>())
                .map_err(|e| self.err(e))?
        };
        let mut backlog = mail
            .iter()
            .map(|t| self.decode::<Mail>(format_args!("the backlog of {name:?}"), t))
            .collect::<StoreResult<Vec<Mail>>>()?;
        let refs = messages
            .iter_mut()
            .flat_map(|m| m.parts.iter_mut())
            .filter_map(|p| match p {
                Part::File(f) => Some(f),
                _ => None,
            })
            .chain(backlog.iter_mut().flat_map(|m| m.files.iter_mut()));
        load_files(&tx, refs).map_err(|e| self.err(e))?;

        let rows: Vec<(String, String, Option<String>, Option<String>)> = {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT call_id, tool, result, files FROM journal WHERE name = ?1 ORDER BY rowid",
                )
                .map_err(|e| self.err(e))?;
            stmt.query_map(params![name], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.err(e))?
        };
        let mut journal = rows
            .into_iter()
            .map(
                |(call_id, tool, result, files): (_, _, Option<String>, Option<String>)| {
                    let result = result
                        .map(|t| self.decode(format_args!("the journal of {name:?}"), &t))
                        .transpose()?;
                    let files = files
                        .map(|t| self.decode(format_args!("the journal of {name:?}"), &t))
                        .transpose()?
                        .unwrap_or_default();
                    Ok(JournalEntry {
                        call_id,
                        tool,
                        result,
                        files,
                    })
                },
            )
            .collect::<StoreResult<Vec<JournalEntry>>>()?;
        load_files(&tx, journal.iter_mut().flat_map(|e| e.files.iter_mut()))
            .map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))?;
        Ok(Some(Cell {
            messages,
            backlog,
            dropped: dropped.max(0) as u64,
            journal,
        }))
    }

    fn push_backlog(&self, name: &str, mail: &Mail) -> StoreResult<bool> {
        let text = encode(&self.path, mail)?;
        let mut conn = self.conn()?;
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        if let Some(id) = &mail.id {
            let new = tx
                .execute(
                    "INSERT OR IGNORE INTO accepted (name, id) VALUES (?1, ?2)",
                    params![name, id],
                )
                .map_err(|e| self.err(e))?;
            if new == 0 {
                return Ok(false);
            }
        }
        ensure_cell(&tx, name).map_err(|e| self.err(e))?;
        save_files(&tx, mail.files.iter()).map_err(|e| self.err(e))?;
        tx.execute(
            "INSERT INTO backlog (name, mail) VALUES (?1, ?2)",
            params![name, text],
        )
        .map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))?;
        Ok(true)
    }

    fn commit_step(
        &self,
        name: &str,
        messages: &[Message],
        served: usize,
        dropped: u64,
    ) -> StoreResult<()> {
        let text = encode(&self.path, messages)?;
        let served = i64::try_from(served).unwrap_or(i64::MAX);
        let dropped = i64::try_from(dropped).unwrap_or(i64::MAX);
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.err(e))?;
        save_files(&tx, messages.iter().flat_map(Message::files)).map_err(|e| self.err(e))?;
        tx.execute(
            "INSERT INTO cells (name, messages, dropped) VALUES (?1, ?2, ?3)
             ON CONFLICT (name) DO UPDATE SET messages = excluded.messages,
                                              dropped = excluded.dropped",
            params![name, text, dropped],
        )
        .map_err(|e| self.err(e))?;
        if served > 0 {
            tx.execute(
                "DELETE FROM backlog WHERE seq IN
                     (SELECT seq FROM backlog WHERE name = ?1 ORDER BY seq LIMIT ?2)",
                params![name, served],
            )
            .map_err(|e| self.err(e))?;
        }
        tx.execute("DELETE FROM journal WHERE name = ?1", params![name])
            .map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))
    }

    fn journal(&self, name: &str, entry: &JournalEntry) -> StoreResult<()> {
        let result = entry
            .result
            .as_ref()
            .map(|r| encode(&self.path, r))
            .transpose()?;
        let files = (!entry.files.is_empty())
            .then(|| encode(&self.path, &entry.files))
            .transpose()?;
        let mut conn = self.conn()?;
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        ensure_cell(&tx, name).map_err(|e| self.err(e))?;
        save_files(&tx, entry.files.iter()).map_err(|e| self.err(e))?;
        tx.execute(
            "INSERT INTO journal (name, call_id, tool, result, files) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (name, call_id) DO UPDATE SET tool = excluded.tool,
                                                       result = excluded.result,
                                                       files = excluded.files",
            params![name, entry.call_id, entry.tool, result, files],
        )
        .map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))
    }

    fn clear_cell(&self, name: &str) -> StoreResult<bool> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.err(e))?;
        let n = tx
            .execute("DELETE FROM cells WHERE name = ?1", params![name])
            .map_err(|e| self.err(e))?;
        let b = tx
            .execute("DELETE FROM backlog WHERE name = ?1", params![name])
            .map_err(|e| self.err(e))?;
        let j = tx
            .execute("DELETE FROM journal WHERE name = ?1", params![name])
            .map_err(|e| self.err(e))?;
        tx.execute("DELETE FROM accepted WHERE name = ?1", params![name])
            .map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))?;
        Ok(n + b + j > 0)
    }

    fn breaker(&self, key: &str) -> StoreResult<Option<BreakerState>> {
        let conn = self.conn()?;
        let text: Option<String> = conn
            .query_row(
                "SELECT state FROM breakers WHERE key = ?1",
                params![key],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        text.map(|t| self.decode(format_args!("the breaker state {key:?}"), &t))
            .transpose()
    }

    fn save_breaker(&self, key: &str, state: &BreakerState) -> StoreResult<()> {
        let text = encode(&self.path, state)?;
        let conn = self.conn()?;
        conn.execute(
            "INSERT INTO breakers (key, state) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET state = excluded.state",
            params![key, text],
        )
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        let conn = self.conn()?;
        conn.execute(
            "INSERT INTO audit (at_ms, resident, tool, args_hash, duration_ms, outcome, message)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                i64::try_from(entry.at_ms).unwrap_or(i64::MAX),
                entry.resident,
                entry.tool,
                entry.args_hash,
                entry.duration_ms,
                entry.outcome,
                entry.message
            ],
        )
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn audit_log(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditEntry>> {
        let conn = self.conn()?;
        let mut stmt = conn
            .prepare_cached(
                "SELECT at_ms, resident, tool, args_hash, duration_ms, outcome, message FROM audit
                 WHERE (?1 IS NULL OR resident = ?1) AND (?2 IS NULL OR tool = ?2)
                 ORDER BY id",
            )
            .map_err(|e| self.err(e))?;
        stmt.query_map(params![filter.resident, filter.tool], |r| {
            Ok(AuditEntry {
                at_ms: r.get::<_, i64>(0)?.max(0) as u64,
                resident: r.get(1)?,
                tool: r.get(2)?,
                args_hash: r.get(3)?,
                duration_ms: r.get(4)?,
                outcome: r.get(5)?,
                message: r.get(6)?,
            })
        })
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<AuditEntry>>>())
        .map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::residents::middleware::BreakerStatus;
    use crate::vocab::{Part, Role, ToolCall, ToolResult};

    fn fresh() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
        (dir, store)
    }

    fn mail(content: &str) -> Mail {
        Mail::new("alice", "bob", content, 0)
    }

    fn result(call_id: &str, content: &str) -> ToolResult {
        ToolResult {
            call_id: call_id.into(),
            name: "read".into(),
            content: content.into(),
            is_error: false,
        }
    }

    #[test]
    fn values_round_trip_exactly() {
        let (_dir, store) = fresh();
        let values = [
            json!(null),
            json!(true),
            json!(0),
            json!(-1),
            json!(i64::MIN),
            json!(u64::MAX),
            json!(1.0),
            json!(0.1 + 0.2),
            json!(1e-300),
            json!(f64::MAX),
            json!(5e-324),
            json!(-0.0),
            json!("héllo ✓ 🐝 \u{0} \"quoted\" \\ \n"),
            json!({}),
            json!([]),
            json!({"a": [], "b": {}, "c": [1, 2.5, "x", {"d": null}], "é": {"z": 1, "a": 2}}),
        ];
        for (i, v) in values.iter().enumerate() {
            let key = format!("k{i}");
            store.set("", &key, v).unwrap();
            let back = store.get("", &key).unwrap().unwrap();
            assert_eq!(&back, v, "value {i}");
            // Same variant, not merely equal: integers stay integers, floats stay floats.
            assert_eq!(back.to_string(), v.to_string(), "value {i}");
            if let (Some(a), Some(b)) = (back.as_f64(), v.as_f64()) {
                assert_eq!(a.to_bits(), b.to_bits(), "value {i}");
            }
        }
        assert!(store.get("", "k1").unwrap().unwrap().is_boolean());
        assert!(store.get("", "k6").unwrap().unwrap().is_f64());
        assert!(store.get("", "k2").unwrap().unwrap().is_i64());
        assert!(store.get("", "k13").unwrap().unwrap().is_object());
        assert!(store.get("", "k14").unwrap().unwrap().is_array());
        assert_eq!(store.get("", "missing").unwrap(), None);
    }

    #[test]
    fn arbitrary_floats_round_trip_bit_for_bit() {
        let (_dir, store) = fresh();
        // A xorshift walk over bit patterns: every finite f64 must come back identical.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let floats: Vec<f64> = std::iter::from_fn(|| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Some(f64::from_bits(x))
        })
        .filter(|f| f.is_finite())
        .take(2000)
        .collect();
        let value = Value::Array(floats.iter().map(|f| json!(f)).collect());
        store.set("", "floats", &value).unwrap();
        let back = store.get("", "floats").unwrap().unwrap();
        for (a, b) in back.as_array().unwrap().iter().zip(&floats) {
            assert_eq!(a.as_f64().unwrap().to_bits(), b.to_bits(), "{b:e}");
        }
    }

    #[test]
    fn opens_in_wal_mode_with_full_sync() {
        let (_dir, store) = fresh();
        let conn = store.conn().unwrap();
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = conn
            .pragma_query_value(None, "synchronous", |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 2, "FULL");
        let timeout: i64 = conn
            .pragma_query_value(None, "busy_timeout", |r| r.get(0))
            .unwrap();
        assert_eq!(timeout, BUSY_TIMEOUT.as_millis() as i64);
        let app: i32 = conn
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .unwrap();
        assert_eq!(app, APPLICATION_ID);
    }

    #[test]
    fn values_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sqlite3");
        let v = json!({"n": 3, "f": 3.0, "s": "ü", "e": [], "o": {}});
        {
            let store = SqliteStore::open(&path).unwrap();
            store.set("ws", "k", &v).unwrap();
        }
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.get("ws", "k").unwrap(), Some(v));
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    }

    #[test]
    fn spaces_are_separate_and_delete_reports_existence() {
        let (_dir, store) = fresh();
        store.set("", "k", &json!(1)).unwrap();
        store.set("w1", "k", &json!(2)).unwrap();
        assert_eq!(store.get("", "k").unwrap(), Some(json!(1)));
        assert_eq!(store.get("w1", "k").unwrap(), Some(json!(2)));
        assert_eq!(store.get("w2", "k").unwrap(), None);
        store.set("", "k", &json!("over")).unwrap();
        assert_eq!(store.get("", "k").unwrap(), Some(json!("over")));
        assert!(store.delete("w1", "k").unwrap());
        assert!(!store.delete("w1", "k").unwrap());
        assert_eq!(store.get("w1", "k").unwrap(), None);
        assert_eq!(store.get("", "k").unwrap(), Some(json!("over")));
    }

    #[test]
    fn list_is_in_byte_order_and_prefixes_are_literal() {
        let (_dir, store) = fresh();
        let keys = [
            "b",
            "a",
            "a%",
            "a%b",
            "a_",
            "a_b",
            "ab",
            "aXb",
            "a",
            "A",
            "é",
            "z",
            "~",
            "a\u{10FFFF}",
            "a\u{10FFFF}x",
            "",
        ];
        for k in keys {
            store.set("", k, &json!(k)).unwrap();
        }
        store.set("other", "a1", &json!(1)).unwrap();
        let mut sorted: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        sorted.sort();
        sorted.dedup();
        assert_eq!(store.list("", "").unwrap(), sorted);
        assert_eq!(store.list("", "a%").unwrap(), ["a%", "a%b"]);
        assert_eq!(store.list("", "a_").unwrap(), ["a_", "a_b"]);
        assert_eq!(
            store.list("", "a").unwrap(),
            [
                "a",
                "a%",
                "a%b",
                "aXb",
                "a_",
                "a_b",
                "ab",
                "a\u{10FFFF}",
                "a\u{10FFFF}x"
            ]
        );
        assert_eq!(
            store.list("", "a\u{10FFFF}").unwrap(),
            ["a\u{10FFFF}", "a\u{10FFFF}x"]
        );
        assert_eq!(store.list("", "%").unwrap(), Vec::<String>::new());
        assert_eq!(store.list("", "é").unwrap(), ["é"]);
        assert_eq!(store.list("other", "").unwrap(), ["a1"]);
        assert_eq!(store.list("nobody", "").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn prefix_successor_is_the_next_string() {
        assert_eq!(prefix_successor(""), None);
        assert_eq!(prefix_successor("ab").as_deref(), Some("ac"));
        assert_eq!(prefix_successor("a%").as_deref(), Some("a&"));
        assert_eq!(prefix_successor("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
        assert_eq!(prefix_successor("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_successor("\u{10FFFF}"), None);
    }

    #[test]
    fn update_is_atomic_across_threads() {
        let (_dir, store) = fresh();
        let store = Arc::new(store);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        store
                            .update("", "counter", &mut |v| {
                                let n = v.and_then(|v| v.as_i64()).unwrap_or(0);
                                Ok(Some(json!(n + 1)))
                            })
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(store.get("", "counter").unwrap(), Some(json!(1000)));
    }

    #[test]
    fn update_returns_the_new_value_deletes_and_rolls_back_on_error() {
        let (_dir, store) = fresh();
        let seen = store
            .update("w", "k", &mut |v| {
                assert_eq!(v, None);
                Ok(Some(json!({"n": 1})))
            })
            .unwrap();
        assert_eq!(seen, Some(json!({"n": 1})));
        let err = store
            .update("w", "k", &mut |_| Err("nope".to_string()))
            .unwrap_err();
        assert_eq!(err.kind(), "value_error");
        assert!(err.to_string().contains("nope"), "{err}");
        assert_eq!(store.get("w", "k").unwrap(), Some(json!({"n": 1})));
        assert_eq!(store.update("w", "k", &mut |_| Ok(None)).unwrap(), None);
        assert_eq!(store.get("w", "k").unwrap(), None);
    }

    #[test]
    fn the_store_refuses_calls_from_inside_update_instead_of_deadlocking() {
        let (_dir, store) = fresh();
        let mut inner = None;
        store
            .update("", "k", &mut |_| {
                inner = Some(store.get("", "other"));
                Ok(Some(json!(1)))
            })
            .unwrap();
        let err = inner.unwrap().unwrap_err();
        assert_eq!(err.kind(), "value_error");
        assert!(
            err.to_string().contains("inside an update function"),
            "{err}"
        );
        // And usable again afterwards.
        assert_eq!(store.get("", "k").unwrap(), Some(json!(1)));
    }

    #[test]
    fn commit_step_replaces_messages_serves_backlog_sets_dropped_and_clears_journal() {
        let (_dir, store) = fresh();
        assert_eq!(store.load_cell("alice").unwrap(), None);
        for i in 0..4 {
            store
                .push_backlog("alice", &mail(&format!("m{i}")))
                .unwrap();
        }
        store.push_backlog("bob", &mail("for bob")).unwrap();
        store
            .journal(
                "alice",
                &JournalEntry {
                    call_id: "c1".into(),
                    tool: "read".into(),
                    result: None,
                    files: Vec::new(),
                },
            )
            .unwrap();
        store
            .journal(
                "bob",
                &JournalEntry {
                    call_id: "c1".into(),
                    tool: "read".into(),
                    result: None,
                    files: Vec::new(),
                },
            )
            .unwrap();

        let cell = store.load_cell("alice").unwrap().unwrap();
        assert!(cell.messages.is_empty());
        assert_eq!(
            cell.backlog
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>(),
            ["m0", "m1", "m2", "m3"]
        );
        assert_eq!(cell.journal.len(), 1);

        let messages = vec![
            Message::user("[mail from bob] m0"),
            Message::user("[mail from bob] m1"),
            Message::assistant("done"),
        ];
        store.commit_step("alice", &messages, 2, 7).unwrap();
        let cell = store.load_cell("alice").unwrap().unwrap();
        assert_eq!(cell.messages, messages);
        assert_eq!(
            cell.backlog
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>(),
            ["m2", "m3"]
        );
        assert_eq!(cell.dropped, 7);
        assert!(cell.journal.is_empty());

        // Another cell is untouched.
        let bob = store.load_cell("bob").unwrap().unwrap();
        assert_eq!(bob.backlog, vec![mail("for bob")]);
        assert_eq!(bob.journal.len(), 1);

        // Serving more than is held empties the backlog; dropped can go back to 0.
        store.commit_step("alice", &messages[..1], 10, 0).unwrap();
        let cell = store.load_cell("alice").unwrap().unwrap();
        assert_eq!(cell.messages, messages[..1]);
        assert!(cell.backlog.is_empty());
        assert_eq!(cell.dropped, 0);
        assert_eq!(store.conversations().unwrap(), ["alice", "bob"]);
    }

    #[test]
    fn commit_step_creates_a_cell_and_backlog_keeps_arrival_order() {
        let (_dir, store) = fresh();
        store.commit_step("carol", &[], 0, 0).unwrap();
        assert_eq!(store.load_cell("carol").unwrap(), Some(Cell::default()));
        let mut with_files = mail("with files");
        with_files.files = vec![crate::files::record(
            "a.txt",
            None,
            std::sync::Arc::from(&b"attached"[..]),
        )];
        with_files.hop = 2;
        // Interleave two names: each keeps its own arrival order.
        for i in 0..20 {
            store
                .push_backlog("carol", &mail(&format!("c{i}")))
                .unwrap();
            store.push_backlog("dave", &mail(&format!("d{i}"))).unwrap();
        }
        store.push_backlog("carol", &with_files).unwrap();
        let cell = store.load_cell("carol").unwrap().unwrap();
        let mut expected: Vec<Mail> = (0..20).map(|i| mail(&format!("c{i}"))).collect();
        expected.push(with_files);
        assert_eq!(cell.backlog, expected);
        let attached = &cell.backlog[20].files[0];
        assert_eq!(attached.data.as_deref(), Some(&b"attached"[..]));
        store.commit_step("carol", &[], 5, 0).unwrap();
        let cell = store.load_cell("carol").unwrap().unwrap();
        assert_eq!(cell.backlog, expected[5..]);
        assert_eq!(store.load_cell("dave").unwrap().unwrap().backlog.len(), 20);
    }

    #[test]
    fn journal_records_start_then_result_in_order_and_commit_step_clears_it() {
        let (_dir, store) = fresh();
        let start = |id: &str| JournalEntry {
            call_id: id.into(),
            tool: "read".into(),
            result: None,
            files: Vec::new(),
        };
        store.journal("a", &start("c2")).unwrap();
        store.journal("a", &start("c1")).unwrap();
        let finished = JournalEntry {
            call_id: "c2".into(),
            tool: "read".into(),
            result: Some(result("c2", "contents ✓")),
            files: Vec::new(),
        };
        store.journal("a", &finished).unwrap();
        let cell = store.load_cell("a").unwrap().unwrap();
        assert_eq!(cell.journal, vec![finished, start("c1")]);
        store
            .commit_step("a", &[Message::assistant("ok")], 0, 0)
            .unwrap();
        assert!(store.load_cell("a").unwrap().unwrap().journal.is_empty());
    }

    #[test]
    fn messages_with_tool_calls_round_trip() {
        let (_dir, store) = fresh();
        let messages = vec![
            Message::new(Role::System, vec![Part::text("be brief")]),
            Message::user("read a.txt"),
            Message::new(
                Role::Assistant,
                vec![
                    Part::Reasoning {
                        text: "thinking".into(),
                        opaque: None,
                    },
                    Part::text("reading"),
                    Part::ToolCall(ToolCall {
                        id: "c1".into(),
                        name: "read".into(),
                        arguments: "{\"path\":\"a.txt\"}".into(),
                        opaque: None,
                    }),
                ],
            ),
            Message::new(Role::Tool, vec![Part::ToolResult(result("c1", "hello"))]),
        ];
        store.commit_step("r", &messages, 0, 0).unwrap();
        assert_eq!(store.load_cell("r").unwrap().unwrap().messages, messages);
    }

    #[test]
    fn file_bytes_are_stored_once_and_put_back_on_load() {
        let (_dir, store) = fresh();
        let file = crate::files::record("n.csv", None, std::sync::Arc::from(&b"a,b\n1,2\n"[..]));
        let messages = vec![
            Message::new(
                Role::User,
                vec![Part::text("see"), Part::File(file.clone())],
            ),
            Message::new(Role::User, vec![Part::File(file.clone())]),
        ];
        store.commit_step("r", &messages, 0, 0).unwrap();
        store.commit_step("r", &messages, 0, 0).unwrap();
        let stored: i64 = store
            .conn()
            .unwrap()
            .query_row("SELECT count(*) FROM files", [], |r| r.get(0))
            .unwrap();
        assert_eq!(stored, 1);
        let text: String = store
            .conn()
            .unwrap()
            .query_row("SELECT messages FROM cells", [], |r| r.get(0))
            .unwrap();
        assert!(
            !text.contains("1,2"),
            "the conversation holds a reference only: {text}"
        );
        let loaded = store.load_cell("r").unwrap().unwrap().messages;
        assert_eq!(loaded, messages);
        for m in &loaded {
            let f = m.files().next().unwrap();
            assert_eq!(f.data.as_deref(), Some(&b"a,b\n1,2\n"[..]));
        }
    }

    #[test]
    fn a_journaled_result_keeps_its_files() {
        let (_dir, store) = fresh();
        let file = crate::files::record(
            "chart.png",
            None,
            std::sync::Arc::from(&b"\x89PNG\r\n\x1a\nx"[..]),
        );
        let entry = JournalEntry {
            call_id: "c1".into(),
            tool: "plot".into(),
            result: Some(result("c1", "the chart")),
            files: vec![file.clone()],
        };
        store.journal("r", &entry).unwrap();
        let cell = store.load_cell("r").unwrap().unwrap();
        assert_eq!(cell.journal, vec![entry]);
        assert_eq!(cell.journal[0].files[0].data, file.data);
    }

    #[test]
    fn a_mail_id_is_accepted_once_until_the_cell_is_cleared() {
        let (_dir, store) = fresh();
        let mut m = mail("one");
        m.id = Some("feed-1".into());
        assert!(store.push_backlog("alice", &m).unwrap());
        assert!(
            !store.push_backlog("alice", &m).unwrap(),
            "a repeat is not appended"
        );
        assert!(
            store.push_backlog("bob", &m).unwrap(),
            "ids are per resident"
        );
        assert!(store.push_backlog("alice", &mail("no id")).unwrap());
        assert!(
            store.push_backlog("alice", &mail("no id")).unwrap(),
            "no id: no dedupe"
        );
        assert_eq!(store.load_cell("alice").unwrap().unwrap().backlog.len(), 3);
        store.clear_cell("alice").unwrap();
        assert!(store.push_backlog("alice", &m).unwrap());
    }

    #[test]
    fn clear_cell_removes_messages_backlog_and_journal() {
        let (_dir, store) = fresh();
        store
            .commit_step("a", &[Message::user("hi")], 0, 3)
            .unwrap();
        store.push_backlog("a", &mail("held")).unwrap();
        store
            .journal(
                "a",
                &JournalEntry {
                    call_id: "c".into(),
                    tool: "t".into(),
                    result: None,
                    files: Vec::new(),
                },
            )
            .unwrap();
        store.push_backlog("b", &mail("keep")).unwrap();
        assert!(store.clear_cell("a").unwrap());
        assert!(!store.clear_cell("a").unwrap());
        assert_eq!(store.load_cell("a").unwrap(), None);
        assert_eq!(store.conversations().unwrap(), ["b"]);
        // A new cell of the same name starts empty.
        store.push_backlog("a", &mail("new")).unwrap();
        let cell = store.load_cell("a").unwrap().unwrap();
        assert!(cell.messages.is_empty() && cell.journal.is_empty());
        assert_eq!(cell.dropped, 0);
        assert_eq!(cell.backlog, vec![mail("new")]);
    }

    #[test]
    fn breaker_round_trip() {
        let (_dir, store) = fresh();
        assert_eq!(store.breaker("ai/breaker").unwrap(), None);
        let state = BreakerState {
            status: BreakerStatus::Open,
            failures: 3,
            last_error: Some("503 from anthropic".into()),
            next_probe_ms: Some(1_700_000_000_123),
            probe_interval_ms: 60_000,
            since_ms: 1_700_000_000_000,
        };
        store.save_breaker("ai/breaker", &state).unwrap();
        assert_eq!(store.breaker("ai/breaker").unwrap(), Some(state.clone()));
        let closed = BreakerState {
            status: BreakerStatus::Closed,
            failures: 0,
            next_probe_ms: None,
            ..state
        };
        store.save_breaker("ai/breaker", &closed).unwrap();
        assert_eq!(store.breaker("ai/breaker").unwrap(), Some(closed));
        assert_eq!(store.breaker("other").unwrap(), None);
    }

    #[test]
    fn audit_log_filters_by_resident_and_tool_in_order() {
        let (_dir, store) = fresh();
        let entry = |at_ms: u64, resident: &str, tool: &str, outcome: &str| AuditEntry {
            at_ms,
            resident: resident.into(),
            tool: tool.into(),
            args_hash: format!("{at_ms:064x}"),
            duration_ms: at_ms as f64 / 8.0,
            outcome: outcome.into(),
            message: (outcome != "ok").then(|| format!("{tool} went wrong")),
        };
        let all = vec![
            entry(3, "alice", "read", "ok"),
            entry(1, "bob", "read", "error"),
            entry(2, "alice", "write", "thrown"),
            entry(4, "script", "read", "ok"),
        ];
        for e in &all {
            store.audit(e).unwrap();
        }
        assert_eq!(store.audit_log(&AuditFilter::default()).unwrap(), all);
        let alice = AuditFilter {
            resident: Some("alice".into()),
            tool: None,
        };
        assert_eq!(
            store.audit_log(&alice).unwrap(),
            vec![all[0].clone(), all[2].clone()]
        );
        let reads = AuditFilter {
            resident: None,
            tool: Some("read".into()),
        };
        assert_eq!(
            store.audit_log(&reads).unwrap(),
            vec![all[0].clone(), all[1].clone(), all[3].clone()]
        );
        let both = AuditFilter {
            resident: Some("alice".into()),
            tool: Some("read".into()),
        };
        assert_eq!(store.audit_log(&both).unwrap(), vec![all[0].clone()]);
        let none = AuditFilter {
            resident: Some("nobody".into()),
            tool: None,
        };
        assert!(store.audit_log(&none).unwrap().is_empty());
    }

    #[test]
    fn a_newer_schema_is_too_new_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sqlite3");
        {
            let store = SqliteStore::open(&path).unwrap();
            store.set("", "k", &json!(1)).unwrap();
        }
        {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "user_version", 999).unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        let err = SqliteStore::open(&path).unwrap_err();
        assert_eq!(err.kind(), "too_new", "{err}");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("999"), "{msg}");
        assert!(msg.contains(&format!("up to {SCHEMA_VERSION}")), "{msg}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        let conn = Connection::open(&path).unwrap();
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, 999);
    }

    #[test]
    fn garbage_is_damaged_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sqlite3");
        let garbage: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        std::fs::write(&path, &garbage).unwrap();
        let err = SqliteStore::open(&path).unwrap_err();
        assert_eq!(err.kind(), "damaged", "{err}");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("not an SQLite database"), "{msg}");
        assert_eq!(std::fs::read(&path).unwrap(), garbage);
        // Nothing was created beside it either.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["store.sqlite3"]);
    }

    #[test]
    fn corrupt_pages_are_damaged_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sqlite3");
        {
            let store = SqliteStore::open(&path).unwrap();
            for i in 0..200 {
                store
                    .set("", &format!("key{i:04}"), &json!("x".repeat(100)))
                    .unwrap();
            }
        }
        let mut bytes = std::fs::read(&path).unwrap();
        let page = u16::from_be_bytes([bytes[16], bytes[17]]) as usize;
        assert!(bytes.len() >= 3 * page);
        // Scribble over the second page (a b-tree page of the schema's tables).
        for b in &mut bytes[page..2 * page] {
            *b = 0xA5;
        }
        std::fs::write(&path, &bytes).unwrap();
        let err = SqliteStore::open(&path).unwrap_err();
        assert_eq!(err.kind(), "damaged", "{err}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }

    #[test]
    fn another_sqlite_database_is_not_a_colony_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
                .unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        let err = SqliteStore::open(&path).unwrap_err();
        assert_eq!(err.kind(), "damaged", "{err}");
        assert!(err.to_string().contains("not a colony store"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn an_empty_file_is_refused_and_left_untouched() {
        // A store colony opened is never empty: an empty file lost its contents (or never was
        // a store), and starting afresh in it would lose the program's state silently.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sqlite3");
        std::fs::write(&path, b"").unwrap();
        let err = SqliteStore::open(&path).unwrap_err();
        assert_eq!(err.kind(), "damaged", "{err}");
        assert!(err.to_string().contains("is empty (0 bytes)"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"");
    }
}
