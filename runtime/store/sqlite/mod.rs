//! The embedded default [`Store`]: one SQLite file (`store.sqlite3` in the state directory).
//!
//! In WAL mode with `synchronous=FULL`: a write returns once its transaction is on disk (an
//! audit line alone excepted: `Write::waits_for_disk` says why and what it keeps). Writes
//! go through [`GroupCommit`]: those that arrive while a transaction is being synced share the
//! next one, so many residents committing at once pay one fsync between them, and each is
//! answered only once its own write is durable. A second connection reads (WAL lets it see every
//! committed transaction while the writer syncs the next). A call made on one of tokio's
//! multi-thread workers waits off it ([`super::off_worker`]), so the other tasks run meanwhile.
//!
//! Values are kept as JSON text, so whatever `serde_json::Value` holds comes back exactly
//! (integers stay integers, floats stay floats, `{}` stays an object and `[]` an array). What a
//! file must be to be opened, and its schema, are in [`open`].

mod cells;
mod open;
#[cfg(test)]
mod tests;
mod writes;

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use cells::{Kept, RawCell};
use open::classify;
pub use open::{APPLICATION_ID, SCHEMA_VERSION};
use writes::{Done, Write, Writer, file_bytes};

use super::group_commit::{Commits, GroupCommit};
use super::off_worker::off_worker;
use super::{AuditEntry, AuditFilter, JournalEntry, SavedResident, Store, StoreError, StoreResult};
use crate::infer::breaker::BreakerState;
use crate::residents::Mail;
use crate::vocab::{FileRef, Message, Part};

thread_local! {
    /// The store whose `update` function is running on this thread (its address), if any:
    /// calling that store from inside the function would deadlock on its writing connection.
    static IN_UPDATE: Cell<usize> = const { Cell::new(0) };
}

/// The SQLite [`Store`].
pub struct SqliteStore {
    path: PathBuf,
    /// The writing connection: a batch of the group commit, or an `update`, holds it (and the
    /// thread starting the log, [`SqliteStore::prepare_writes`]).
    write: Arc<Mutex<Writer>>,
    /// The reading connection.
    read: Mutex<Connection>,
    writes: GroupCommit<Write, StoreResult<Done>>,
    /// The cells read in one pass for a resume, until each is loaded or written.
    kept: Mutex<Kept>,
    /// Whether the log was started (or is being) ahead of the first write.
    log_started: AtomicBool,
    /// The thread starting it, joined before the connections close.
    log_starter: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The state directory's lock, when the store was opened through
    /// [`StateDir`](super::state_dir::StateDir): held as long as the store lives. Declared after
    /// the connections so they close (and checkpoint) before the lock is released.
    lock: Option<super::state_dir::DirLock>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // The thread starting the log holds the writing connection: it ends first, so that
        // the connections then close (and checkpoint) as always.
        let starter = self.log_starter.get_mut().ok().and_then(Option::take);
        if let Some(thread) = starter {
            let _ = thread.join();
        }
    }
}

/// Starts the write-ahead log of the store at `path` ([`SqliteStore::prepare_writes`] says
/// why) when it is empty: its header (SQLite's own sync of it and of its directory) and one
/// page that changes nothing, the schema version set to what it is, since a transaction that
/// changes no page writes no log. A log with frames already has its header and is left alone.
fn start_log(write: &Mutex<Writer>, path: &Path) -> StoreResult<()> {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    if std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0) {
        return Ok(());
    }
    let mut writer = lock(write);
    // Not durable: the header's sync is SQLite's own, and the page need not wait for the disk.
    let conn = writer.at(false).map_err(|e| classify(path, "", e))?;
    conn.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(|e| classify(path, "", e))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while a connection was held rolled its transaction back (rusqlite's
    // `Transaction` rolls back on drop), so the connection is fine to use.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SqliteStore {
    /// Opens (creating if missing) the store at `path`, bringing its schema up to
    /// [`SCHEMA_VERSION`]. Refuses a file that is not a colony store or is damaged
    /// ([`StoreError::Damaged`]) or that a newer colony wrote ([`StoreError::TooNew`]), leaving it
    /// untouched.
    pub fn open(path: &Path) -> StoreResult<SqliteStore> {
        let write = open::open_checked(path)?;
        let read = open::open_reader(path)?;
        Ok(SqliteStore {
            path: path.to_path_buf(),
            write: Arc::new(Mutex::new(Writer::new(write, path))),
            read: Mutex::new(read),
            writes: GroupCommit::new(),
            kept: Mutex::new(Kept::Untried),
            log_started: AtomicBool::new(false),
            log_starter: Mutex::new(None),
            lock: None,
        })
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps `lock` (an open, locked file) alive as long as the store.
    pub(super) fn hold_lock(mut self, lock: super::state_dir::DirLock) -> SqliteStore {
        self.lock = Some(lock);
        self
    }

    /// The schema version the file is at (after opening, always [`SCHEMA_VERSION`]).
    pub fn schema_version(&self) -> StoreResult<i64> {
        let conn = self.reader()?;
        conn.pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| self.err(e))
    }

    /// Waits for the thread [`SqliteStore::prepare_writes`] started, if it is still running.
    #[cfg(test)]
    pub(crate) fn join_log_starter(&self) {
        let starter = lock(&self.log_starter).take();
        if let Some(thread) = starter {
            thread.join().expect("the log's starter does not panic");
        }
    }

    /// The group commit's transactions so far, and the writes they held.
    pub fn commits(&self) -> Commits {
        self.writes.commits()
    }

    /// A journal entry as a write, its JSON made on the caller's thread.
    fn journal_write(&self, name: &str, entry: &JournalEntry) -> StoreResult<Write> {
        let result = entry.result.as_ref().map(|r| self.encode(r)).transpose()?;
        let files_text = (!entry.files.is_empty())
            .then(|| self.encode(&entry.files))
            .transpose()?;
        Ok(Write::Journal {
            name: name.to_string(),
            call_id: entry.call_id.clone(),
            tool: entry.tool.clone(),
            result,
            files_text,
            files: file_bytes(entry.files.iter()),
        })
    }

    /// Refuses a call from inside this store's own `update` function.
    fn not_in_update(&self) -> StoreResult<()> {
        if IN_UPDATE.with(|c| c.get()) == self as *const _ as usize {
            return Err(StoreError::Value(format!(
                "{}: the store cannot be used from inside an update function",
                self.path.display()
            )));
        }
        Ok(())
    }

    fn reader(&self) -> StoreResult<MutexGuard<'_, Connection>> {
        self.not_in_update()?;
        Ok(lock(&self.read))
    }

    fn writer(&self) -> StoreResult<MutexGuard<'_, Writer>> {
        self.not_in_update()?;
        Ok(lock(&self.write))
    }

    /// Queues `write` for the next group commit and waits (off tokio's workers) until the
    /// transaction holding it is on disk.
    fn submit(&self, write: Write) -> StoreResult<Done> {
        self.not_in_update()?;
        off_worker(|| {
            self.writes.submit(
                write,
                |batch| {
                    let outcomes =
                        writes::apply_batch(&mut lock(&self.write), &batch, &|e| self.err(e));
                    self.forget_kept(&batch);
                    outcomes
                },
                || {
                    Err(StoreError::Io(format!(
                        "{}: the write was lost: the batch holding it failed",
                        self.path.display()
                    )))
                },
            )
        })
    }

    /// Every cell in one pass ([`cells`]) when the store holds enough of them.
    fn read_all_cells(&self) -> StoreResult<Kept> {
        // No write commits while the cells are read: each one that commits later finds them kept
        // and drops its cell's text.
        let _no_commit = lock(&self.write);
        let mut conn = lock(&self.read);
        if cells::count(&conn).map_err(|e| self.err(e))? < cells::IN_ONE_PASS {
            return Ok(Kept::Done);
        }
        let cells = cells::read_all(&mut conn).map_err(|e| self.err(e))?;
        Ok(Kept::Cells {
            cells,
            last_taken: Instant::now(),
        })
    }

    /// Drops the kept text of the cells `batch` wrote (it has committed, its callers are not
    /// answered yet).
    fn forget_kept(&self, batch: &[Write]) {
        let mut kept = lock(&self.kept);
        if let Kept::Cells { .. } = *kept {
            for name in batch.iter().filter_map(Write::cell) {
                kept.forget(name);
            }
        }
    }

    /// A cell from its text, its files' bytes put back.
    fn decode_cell(&self, name: &str, raw: RawCell) -> StoreResult<SavedResident> {
        let mut messages: Vec<Message> =
            self.decode(format_args!("the conversation of {name:?}"), &raw.messages)?;
        let mut backlog = raw
            .backlog
            .iter()
            .map(|(row, t)| {
                let mail = self.decode::<Mail>(format_args!("the backlog of {name:?}"), t)?;
                Ok(Mail {
                    saved: Some(*row),
                    ..mail
                })
            })
            .collect::<StoreResult<Vec<Mail>>>()?;
        let mut journal = raw
            .journal
            .into_iter()
            .map(|e| {
                let result = e
                    .result
                    .map(|t| self.decode(format_args!("the journal of {name:?}"), &t))
                    .transpose()?;
                let files = e
                    .files
                    .map(|t| self.decode(format_args!("the journal of {name:?}"), &t))
                    .transpose()?
                    .unwrap_or_default();
                Ok(JournalEntry {
                    call_id: e.call_id,
                    tool: e.tool,
                    result,
                    files,
                })
            })
            .collect::<StoreResult<Vec<JournalEntry>>>()?;
        let mut refs = messages
            .iter_mut()
            .flat_map(|m| m.parts.iter_mut())
            .filter_map(|p| match p {
                Part::File(f) => Some(f),
                _ => None,
            })
            .chain(backlog.iter_mut().flat_map(|m| m.files.iter_mut()))
            .chain(journal.iter_mut().flat_map(|e| e.files.iter_mut()))
            .filter(|f| f.data.is_none())
            .peekable();
        if refs.peek().is_some() {
            // The bytes are written before any message refers to them and never removed, so
            // reading them after the cell's text is consistent.
            load_files(&*self.reader()?, refs).map_err(|e| self.err(e))?;
        }
        Ok(SavedResident {
            messages,
            backlog,
            dropped: raw.dropped.max(0) as u64,
            journal,
        })
    }

    /// `update`'s transaction.
    fn update_now(
        &self,
        space: &str,
        key: &str,
        f: &mut dyn FnMut(Option<Value>) -> Result<Option<Value>, String>,
    ) -> StoreResult<Option<Value>> {
        let mut writer = self.writer()?;
        writer.still_there()?;
        // A durable write: the last batch may have left the connection at `NORMAL`.
        let conn = writer.at(true).map_err(|e| self.err(e))?;
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
                let text = self.encode(value)?;
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

    fn err(&self, e: rusqlite::Error) -> StoreError {
        classify(&self.path, "", e)
    }

    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> StoreResult<String> {
        // These serialisations cannot fail (no maps with non-string keys, no NaN in a
        // `serde_json::Value`); the error is for a value colony did not make.
        serde_json::to_string(value).map_err(|e| {
            StoreError::Value(format!(
                "{}: cannot write a value as JSON: {e}",
                self.path.display()
            ))
        })
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

impl Store for SqliteStore {
    fn get(&self, space: &str, key: &str) -> StoreResult<Option<Value>> {
        let conn = self.reader()?;
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

    fn list(&self, space: &str, prefix: &str) -> StoreResult<Vec<String>> {
        let conn = self.reader()?;
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

    fn set(&self, space: &str, key: &str, value: &Value) -> StoreResult<()> {
        let text = self.encode(value)?;
        self.submit(Write::Set {
            space: space.to_string(),
            key: key.to_string(),
            text,
        })?;
        Ok(())
    }

    fn delete(&self, space: &str, key: &str) -> StoreResult<bool> {
        self.submit(Write::Delete {
            space: space.to_string(),
            key: key.to_string(),
        })
        .map(Done::changed)
    }

    fn push_backlog(&self, name: &str, mail: &Mail) -> StoreResult<Option<i64>> {
        let text = self.encode(mail)?;
        self.submit(Write::PushBacklog {
            name: name.to_string(),
            text,
            id: mail.id.clone(),
            files: file_bytes(mail.files.iter()),
        })
        .map(Done::row)
    }

    fn commit_step(
        &self,
        name: &str,
        messages: &[Message],
        served: &[i64],
        dropped: u64,
    ) -> StoreResult<()> {
        let text = self.encode(messages)?;
        self.submit(Write::CommitStep {
            name: name.to_string(),
            text,
            files: file_bytes(messages.iter().flat_map(Message::files)),
            served: served.to_vec(),
            dropped: i64::try_from(dropped).unwrap_or(i64::MAX),
        })?;
        Ok(())
    }

    fn journal(&self, name: &str, entry: &JournalEntry) -> StoreResult<()> {
        self.submit(self.journal_write(name, entry)?)?;
        Ok(())
    }

    fn drop_backlog(&self, name: &str, rows: &[i64]) -> StoreResult<usize> {
        self.submit(Write::DropBacklog {
            name: name.to_string(),
            rows: rows.to_vec(),
        })
        .map(Done::removed)
    }

    fn clear_cell(&self, name: &str) -> StoreResult<bool> {
        self.submit(Write::ClearCell {
            name: name.to_string(),
        })
        .map(Done::changed)
    }

    fn save_breaker(&self, key: &str, state: &BreakerState) -> StoreResult<()> {
        let text = self.encode(state)?;
        self.submit(Write::SaveBreaker {
            key: key.to_string(),
            text,
        })?;
        Ok(())
    }

    fn audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        self.submit(Write::Audit(entry.clone()))?;
        Ok(())
    }

    fn audit_all(&self, entries: &[AuditEntry]) -> StoreResult<()> {
        let lines = entries.iter().cloned().map(Write::Audit).collect();
        self.submit(Write::Several(lines))?;
        Ok(())
    }

    fn finish_call(
        &self,
        name: &str,
        audit: &AuditEntry,
        journal: Option<&JournalEntry>,
    ) -> StoreResult<()> {
        let write = match journal {
            Some(entry) => Write::Several(vec![
                Write::Audit(audit.clone()),
                self.journal_write(name, entry)?,
            ]),
            None => Write::Audit(audit.clone()),
        };
        self.submit(write)?;
        Ok(())
    }

    fn update(
        &self,
        space: &str,
        key: &str,
        f: &mut dyn FnMut(Option<Value>) -> Result<Option<Value>, String>,
    ) -> StoreResult<Option<Value>> {
        // Its own transaction on the writing connection (`f` runs on this thread, so it cannot
        // wait in the group commit's queue for another caller to apply it).
        off_worker(|| self.update_now(space, key, f))
    }

    fn conversations(&self) -> StoreResult<Vec<String>> {
        let conn = self.reader()?;
        let mut stmt = conn
            .prepare_cached("SELECT name FROM cells ORDER BY name")
            .map_err(|e| self.err(e))?;
        stmt.query_map([], |r| r.get(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<String>>>())
            .map_err(|e| self.err(e))
    }

    fn load_cell(&self, name: &str) -> StoreResult<Option<SavedResident>> {
        self.not_in_update()?;
        let kept = {
            let mut kept = lock(&self.kept);
            if matches!(*kept, Kept::Untried) {
                *kept = self.read_all_cells()?;
            }
            kept.take(name)
        };
        let raw = match kept {
            Some(raw) => raw,
            None => match cells::read_one(&mut *self.reader()?, name).map_err(|e| self.err(e))? {
                Some(raw) => raw,
                None => return Ok(None),
            },
        };
        self.decode_cell(name, raw).map(Some)
    }

    fn breaker(&self, key: &str) -> StoreResult<Option<BreakerState>> {
        let conn = self.reader()?;
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

    /// Starts the log on a thread of its own, once per open store. SQLite removes the log when
    /// the store closes and makes a new one at the first transaction after: it writes the
    /// log's header and `fsync`s it and its directory, whatever `synchronous` says, before the
    /// transaction's own pages (about 0.6 ms on a disk). That transaction was a program's
    /// first tool call's audit line, on the thread running its turns, in the middle of its
    /// first turn; started when the turn begins, the header is written while the turn's first
    /// model call is in flight, and the line only adds its page. A program whose turns offer
    /// no tool never starts it, and its store is left as it was.
    fn prepare_writes(&self) {
        // Read first: every turn asks, and only the first finds it not started.
        if self.log_started.load(Ordering::Acquire) || self.log_started.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let (write, path) = (self.write.clone(), self.path.clone());
        let started = std::thread::Builder::new()
            .name("colony-store-log".into())
            .spawn(move || {
                // A failure is the first write's to meet again, and to report.
                if let Err(e) = start_log(&write, &path) {
                    tracing::debug!("the store's log was not started ahead: {e}");
                }
            });
        if let Ok(thread) = started {
            *lock(&self.log_starter) = Some(thread);
        }
    }

    fn prune_audit(&self, before_ms: u64) -> StoreResult<bool> {
        self.submit(Write::PruneAudit {
            before_ms: i64::try_from(before_ms).unwrap_or(i64::MAX),
        })
        .map(Done::changed)
    }

    fn audit_log(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditEntry>> {
        let conn = self.reader()?;
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
