//! The SQLite store's writes as owned values, so they can wait in the group commit queue
//! ([`GroupCommit`](crate::store::group_commit::GroupCommit)) and be applied by whichever caller leads the batch. The
//! caller makes a write's JSON text before queueing it (on its own thread, in parallel with the
//! others); the leader only runs the statements.

use std::sync::Arc;

use rusqlite::{Connection, params};

use super::super::{AuditEntry, StoreError, StoreResult};
use crate::vocab::FileRef;

/// The bytes of an attached file, by content hash, that a write stores if they are not yet.
pub(super) struct FileBytes {
    sha256: String,
    data: Arc<[u8]>,
}

/// The files of `refs` that carry their bytes (a reference without them refers to stored bytes).
pub(super) fn file_bytes<'a>(refs: impl Iterator<Item = &'a FileRef>) -> Vec<FileBytes> {
    refs.filter_map(|f| {
        f.data.as_ref().map(|data| FileBytes {
            sha256: f.sha256.clone(),
            data: data.clone(),
        })
    })
    .collect()
}

/// What a write did, as its caller is answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Done {
    /// Whether it changed what it names (a key that existed, a cell that was there, an old
    /// audit line removed); `true` for the writes that always do.
    Changed(bool),
    /// The backlog row a mail was saved as; `None`: its id was accepted before.
    Appended(Option<i64>),
    /// How many rows it removed.
    Removed(usize),
}

impl Done {
    pub(super) fn changed(self) -> bool {
        match self {
            Done::Changed(changed) => changed,
            Done::Appended(row) => row.is_some(),
            Done::Removed(n) => n > 0,
        }
    }

    pub(super) fn removed(self) -> usize {
        match self {
            Done::Removed(n) => n,
            _ => 0,
        }
    }

    pub(super) fn row(self) -> Option<i64> {
        match self {
            Done::Appended(row) => row,
            Done::Changed(_) | Done::Removed(_) => None,
        }
    }
}

/// One write of the [`Store`](super::super::Store) API, ready to apply.
pub(super) enum Write {
    Set {
        space: String,
        key: String,
        text: String,
    },
    /// Whether the key existed.
    Delete {
        space: String,
        key: String,
    },
    /// The row the mail was appended as (`None`: its id was accepted before).
    PushBacklog {
        name: String,
        text: String,
        id: Option<String>,
        files: Vec<FileBytes>,
    },
    CommitStep {
        name: String,
        text: String,
        files: Vec<FileBytes>,
        served: Vec<i64>,
        dropped: i64,
    },
    Journal {
        name: String,
        call_id: String,
        tool: String,
        result: Option<String>,
        files_text: Option<String>,
        files: Vec<FileBytes>,
    },
    /// Whether there was anything to remove.
    ClearCell {
        name: String,
    },
    /// How many held mails were removed.
    DropBacklog {
        name: String,
        rows: Vec<i64>,
    },
    SaveBreaker {
        key: String,
        text: String,
    },
    Audit(AuditEntry),
    /// Whether any audit line older than `before_ms` was removed ([`crate::store::PRUNE_BATCH`]
    /// at most).
    PruneAudit {
        before_ms: i64,
    },
    /// Writes applied in order as one (`finish_call`: the audit line, then the journal entry).
    Several(Vec<Write>),
}

impl Write {
    /// Whether its caller waits for the disk. An audit line alone does not: it is the record of
    /// a call whose result nothing reuses (a script's turn, a resident that keeps no
    /// conversation, an MCP caller's call), so a transaction of audit lines only commits with
    /// `synchronous=NORMAL`. In WAL mode that survives the process dying; the lines reach the
    /// disk with the next transaction that syncs (its fsync takes the whole log) or the store's
    /// close. Only the machine going down before then loses them, where an fsync a call cost a
    /// script's every tool call about as much CPU as the rest of its step.
    pub fn waits_for_disk(&self) -> bool {
        match self {
            // A prune lost with the machine is done again at the next.
            Write::Audit(_) | Write::PruneAudit { .. } => false,
            Write::Several(writes) => writes.iter().any(Write::waits_for_disk),
            _ => true,
        }
    }

    /// Whether it is one SQL statement, which SQLite undoes by itself when it fails (the others
    /// need a savepoint to be undone whole within a batch).
    fn is_one_statement(&self) -> bool {
        matches!(
            self,
            Write::Set { .. }
                | Write::Delete { .. }
                | Write::SaveBreaker { .. }
                | Write::Audit(_)
                | Write::PruneAudit { .. }
        )
    }

    /// The persisted resident whose cell it writes.
    pub fn cell(&self) -> Option<&str> {
        match self {
            Write::PushBacklog { name, .. }
            | Write::CommitStep { name, .. }
            | Write::Journal { name, .. }
            | Write::ClearCell { name }
            | Write::DropBacklog { name, .. } => Some(name),
            Write::Several(writes) => writes.iter().find_map(Write::cell),
            _ => None,
        }
    }

    /// Runs the write's statements in the open transaction; `Changed(true)` unless it says
    /// otherwise.
    fn apply(&self, conn: &Connection) -> rusqlite::Result<Done> {
        match self {
            Write::Set { space, key, text } => {
                conn.prepare_cached(
                    "INSERT INTO kv (space, key, value) VALUES (?1, ?2, ?3)
                     ON CONFLICT (space, key) DO UPDATE SET value = excluded.value",
                )?
                .execute(params![space, key, text])?;
                Ok(Done::Changed(true))
            }
            Write::Delete { space, key } => Ok(Done::Changed(
                conn.prepare_cached("DELETE FROM kv WHERE space = ?1 AND key = ?2")?
                    .execute(params![space, key])?
                    > 0,
            )),
            Write::PushBacklog {
                name,
                text,
                id,
                files,
            } => {
                if let Some(id) = id {
                    let new = conn
                        .prepare_cached(
                            "INSERT OR IGNORE INTO accepted (name, id) VALUES (?1, ?2)",
                        )?
                        .execute(params![name, id])?;
                    if new == 0 {
                        return Ok(Done::Appended(None));
                    }
                }
                ensure_cell(conn, name)?;
                save_files(conn, files)?;
                conn.prepare_cached("INSERT INTO backlog (name, mail) VALUES (?1, ?2)")?
                    .execute(params![name, text])?;
                Ok(Done::Appended(Some(conn.last_insert_rowid())))
            }
            Write::CommitStep {
                name,
                text,
                files,
                served,
                dropped,
            } => {
                save_files(conn, files)?;
                conn.prepare_cached(
                    "INSERT INTO cells (name, messages, dropped) VALUES (?1, ?2, ?3)
                     ON CONFLICT (name) DO UPDATE SET messages = excluded.messages,
                                                      dropped = excluded.dropped",
                )?
                .execute(params![name, text, dropped])?;
                if !served.is_empty() {
                    let mut delete =
                        conn.prepare_cached("DELETE FROM backlog WHERE seq = ?1 AND name = ?2")?;
                    for row in served {
                        delete.execute(params![row, name])?;
                    }
                }
                conn.prepare_cached("DELETE FROM journal WHERE name = ?1")?
                    .execute(params![name])?;
                Ok(Done::Changed(true))
            }
            Write::Journal {
                name,
                call_id,
                tool,
                result,
                files_text,
                files,
            } => {
                ensure_cell(conn, name)?;
                save_files(conn, files)?;
                conn.prepare_cached(
                    "INSERT INTO journal (name, call_id, tool, result, files)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (name, call_id) DO UPDATE SET tool = excluded.tool,
                                                               result = excluded.result,
                                                               files = excluded.files",
                )?
                .execute(params![name, call_id, tool, result, files_text])?;
                Ok(Done::Changed(true))
            }
            Write::ClearCell { name } => {
                // Only a conversation that held files has bytes to take with it: the others
                // (most) cost no look at the rest of the store.
                let held_files: bool = conn
                    .prepare_cached(
                        "SELECT EXISTS (SELECT 1 FROM cells WHERE name = ?1
                                          AND instr(messages, '\"sha256\":\"') > 0)
                             OR EXISTS (SELECT 1 FROM backlog WHERE name = ?1
                                          AND instr(mail, '\"sha256\":\"') > 0)
                             OR EXISTS (SELECT 1 FROM journal WHERE name = ?1
                                          AND instr(files, '\"sha256\":\"') > 0)",
                    )?
                    .query_row(params![name], |r| r.get(0))?;
                let mut removed = 0;
                for table in ["cells", "backlog", "journal"] {
                    removed += conn
                        .prepare_cached(&format!("DELETE FROM {table} WHERE name = ?1"))?
                        .execute(params![name])?;
                }
                conn.prepare_cached("DELETE FROM accepted WHERE name = ?1")?
                    .execute(params![name])?;
                if held_files {
                    drop_unreferenced_files(conn)?;
                }
                Ok(Done::Changed(removed > 0))
            }
            Write::DropBacklog { name, rows } => {
                let held_files: bool = conn
                    .prepare_cached(
                        "SELECT EXISTS (SELECT 1 FROM backlog WHERE name = ?1
                                          AND instr(mail, '\"sha256\":\"') > 0)",
                    )?
                    .query_row(params![name], |r| r.get(0))?;
                let mut removed = 0;
                let mut delete =
                    conn.prepare_cached("DELETE FROM backlog WHERE seq = ?1 AND name = ?2")?;
                for row in rows {
                    removed += delete.execute(params![row, name])?;
                }
                if held_files && removed > 0 {
                    drop_unreferenced_files(conn)?;
                }
                Ok(Done::Removed(removed))
            }
            Write::SaveBreaker { key, text } => {
                conn.prepare_cached(
                    "INSERT INTO breakers (key, state) VALUES (?1, ?2)
                     ON CONFLICT (key) DO UPDATE SET state = excluded.state",
                )?
                .execute(params![key, text])?;
                Ok(Done::Changed(true))
            }
            // Among the oldest lines only (the rowid's order): a log with nothing to remove
            // is not scanned whole.
            Write::PruneAudit { before_ms } => Ok(Done::Changed(
                conn.prepare_cached(
                    "DELETE FROM audit WHERE id IN (SELECT id FROM audit ORDER BY id LIMIT ?2)
                     AND at_ms < ?1",
                )?
                .execute(params![before_ms, crate::store::PRUNE_BATCH])?
                    > 0,
            )),
            Write::Audit(entry) => {
                conn.prepare_cached(
                    "INSERT INTO audit
                         (at_ms, resident, tool, args_hash, duration_ms, outcome, message)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?
                .execute(params![
                    i64::try_from(entry.at_ms).unwrap_or(i64::MAX),
                    entry.resident,
                    entry.tool,
                    entry.args_hash,
                    entry.duration_ms,
                    entry.outcome,
                    entry.message
                ])?;
                Ok(Done::Changed(true))
            }
            Write::Several(writes) => {
                for write in writes {
                    write.apply(conn)?;
                }
                Ok(Done::Changed(true))
            }
        }
    }
}

/// The writing connection, and the `synchronous` level it was last set to.
///
/// A batch of audit lines alone commits at `NORMAL`, every other transaction at `FULL`; the
/// level is a property of the connection, so a transaction that does not set it (an `update`)
/// would commit at whatever the last batch left. [`Writer::at`] sets it for each transaction and
/// skips the statement when the connection is already there (one statement less a commit).
pub(super) struct Writer {
    conn: Connection,
    /// `Some(waits_for_disk)` once set; `None` if a `PRAGMA` failed and the level is not known.
    durable: Option<bool>,
    /// The file as opened, and when it was last found still at its path.
    place: Place,
}

/// Where the store's file is, to notice it taken away while open: a state directory deleted or
/// moved under a running program left every later write going to a file nothing could reach
/// again, each answered as saved (mail acknowledged `durable`, and lost).
struct Place {
    path: std::path::PathBuf,
    /// (device, inode) of the file opened; `None` when it could not be read.
    opened: Option<(u64, u64)>,
    looked: Option<std::time::Instant>,
    /// Set for good once the file is found gone or replaced.
    gone: Option<String>,
    /// The last look found another file at the path: a second look in a row decides (an
    /// inode number a file system changes once must not stop every write).
    replaced_once: bool,
}

/// How often a write looks whether the file is still at its path (one `stat`).
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

fn identity(path: &std::path::Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

impl Writer {
    pub(super) fn new(conn: Connection, path: &std::path::Path) -> Writer {
        // Room for every statement the writes, `update` and the transactions run (about 30);
        // rusqlite keeps 16, which a resident's step with files and mail would cycle through.
        conn.set_prepared_statement_cache_capacity(64);
        Writer {
            conn,
            durable: None,
            place: Place {
                path: path.to_path_buf(),
                opened: identity(path).ok(),
                looked: None,
                gone: None,
                replaced_once: false,
            },
        }
    }

    /// Refuses to write once the file is no longer the one at its path (deleted, or its
    /// folder moved or deleted): looked at most once a [`LOOK_EVERY`].
    pub(super) fn still_there(&mut self) -> StoreResult<()> {
        let place = &mut self.place;
        if place.gone.is_none()
            && place.opened.is_some()
            && place.looked.is_none_or(|t| t.elapsed() >= LOOK_EVERY)
        {
            place.looked = Some(std::time::Instant::now());
            // Gone, or another file twice in a row; a look that fails otherwise (a permission
            // changed above it, a network file system's hiccup) says nothing.
            let lost = match identity(&place.path) {
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                Ok(now) if Some(now) == place.opened => {
                    place.replaced_once = false;
                    false
                }
                Ok(_) => std::mem::replace(&mut place.replaced_once, true),
            };
            if lost {
                let message = format!(
                    "{} was deleted, moved or replaced while this program had it open: nothing \
                     more is saved (what was saved went with it); put the state directory back, \
                     or restart the program to start a new one",
                    place.path.display()
                );
                tracing::error!("{message}");
                place.gone = Some(message);
            }
        }
        match &place.gone {
            Some(message) => Err(StoreError::Refused(message.clone())),
            None => Ok(()),
        }
    }

    /// The connection, set so that its next commit waits for the disk (`FULL`) or not
    /// (`NORMAL`).
    pub(super) fn at(&mut self, waits_for_disk: bool) -> rusqlite::Result<&mut Connection> {
        if self.durable != Some(waits_for_disk) {
            self.durable = None;
            let level = if waits_for_disk {
                "PRAGMA synchronous = FULL"
            } else {
                "PRAGMA synchronous = NORMAL"
            };
            self.conn.prepare_cached(level)?.execute([])?;
            self.durable = Some(waits_for_disk);
        }
        Ok(&mut self.conn)
    }
}

impl std::ops::Deref for Writer {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.conn
    }
}

/// Applies `writes` in one transaction: one commit (one fsync) for all. A write that fails is
/// rolled back alone and answered with its error while the others commit: SQLite undoes a failed
/// statement by itself, so only a write of several statements runs in a savepoint of its own. A
/// failure that ends the transaction (or a failed commit) fails them all, since none of them is
/// on disk then. `err` names the file in an error.
pub(super) fn apply_batch(
    writer: &mut Writer,
    writes: &[Write],
    err: &dyn Fn(rusqlite::Error) -> StoreError,
) -> Vec<StoreResult<Done>> {
    let all = |e: StoreError| writes.iter().map(|_| Err(e.clone())).collect();
    if let Err(e) = writer.still_there() {
        return all(e);
    }
    let conn = match writer.at(writes.iter().any(Write::waits_for_disk)) {
        Ok(conn) => conn,
        Err(e) => return all(err(e)),
    };
    let tx = match Immediate::begin(conn) {
        Ok(tx) => tx,
        Err(e) => return all(err(e)),
    };
    let mut outcomes = Vec::with_capacity(writes.len());
    for write in writes {
        let outcome = if writes.len() == 1 || write.is_one_statement() {
            write.apply(conn)
        } else {
            in_savepoint(conn, write)
        };
        match outcome {
            Ok(v) => outcomes.push(Ok(v)),
            // A lone write that failed: nothing to commit (the transaction rolls back on drop).
            Err(e) if writes.len() == 1 => return all(err(e)),
            // SQLite ended the transaction itself (a full disk, an I/O error): the writes before
            // this one are gone too, so none is reported done.
            Err(e) if conn.is_autocommit() => return all(err(e)),
            Err(e) => outcomes.push(Err(err(e))),
        }
    }
    match tx.commit() {
        Ok(()) => outcomes,
        Err(e) => all(err(e)),
    }
}

/// A write transaction begun with `BEGIN IMMEDIATE` and rolled back unless committed, as
/// rusqlite's `Transaction`, but with its statements prepared once a connection
/// (`prepare_cached`): rusqlite has SQLite parse `BEGIN`, `COMMIT` and each savepoint's two
/// statements afresh every time, about a third of a lone audit line's SQL work.
struct Immediate<'c> {
    conn: &'c Connection,
}

impl<'c> Immediate<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<Immediate<'c>> {
        run(conn, "BEGIN IMMEDIATE")?;
        Ok(Immediate { conn })
    }

    /// A commit that fails leaves the transaction to be rolled back on drop, as rusqlite's.
    fn commit(self) -> rusqlite::Result<()> {
        run(self.conn, "COMMIT")
    }
}

impl Drop for Immediate<'_> {
    fn drop(&mut self) {
        if !self.conn.is_autocommit() {
            let _ = run(self.conn, "ROLLBACK");
        }
    }
}

/// Runs one of the fixed statements above through the connection's statement cache.
fn run(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

/// Applies a write of several statements so that, if one fails, those before it are undone too.
fn in_savepoint(conn: &Connection, write: &Write) -> rusqlite::Result<Done> {
    run(conn, "SAVEPOINT write")?;
    match write.apply(conn) {
        Ok(done) => {
            run(conn, "RELEASE write")?;
            Ok(done)
        }
        Err(e) => {
            // Not possible when the failure ended the transaction; the caller sees that.
            if !conn.is_autocommit() {
                let _ = run(conn, "ROLLBACK TO write").and_then(|()| run(conn, "RELEASE write"));
            }
            Err(e)
        }
    }
}

fn ensure_cell(conn: &Connection, name: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT OR IGNORE INTO cells (name, messages, dropped) VALUES (?1, '[]', 0)",
    )?
    .execute(params![name])?;
    Ok(())
}

/// Removes the bytes of the files no conversation, held mail or journal entry refers to any
/// more: a conversation cleared (`colony conversations clear`, `ai.dismiss`) left every
/// attachment's bytes in the store for good (three 10 MB scans cleared, 30 MB kept). One pass
/// over what refers to files, in the clear's own transaction; a reference held in memory by a
/// running resident carries its bytes and stores them again at its next commit. Returns how
/// many were removed.
fn drop_unreferenced_files(conn: &Connection) -> rusqlite::Result<usize> {
    const KEY: &str = "\"sha256\":\"";
    let mut referenced = std::collections::HashSet::new();
    for (table, column) in [
        ("cells", "messages"),
        ("backlog", "mail"),
        ("journal", "files"),
    ] {
        let mut stmt = conn.prepare(&format!(
            "SELECT {column} FROM {table} WHERE instr({column}, '{KEY}') > 0"
        ))?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let text: String = row.get(0)?;
            for (at, _) in text.match_indices(KEY) {
                if let Some(sha) = text.get(at + KEY.len()..at + KEY.len() + 64) {
                    referenced.insert(sha.to_string());
                }
            }
        }
    }
    let stored: Vec<String> = conn
        .prepare("SELECT sha256 FROM files")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut delete = conn.prepare_cached("DELETE FROM files WHERE sha256 = ?1")?;
    let mut removed = 0;
    for sha in stored.iter().filter(|s| !referenced.contains(*s)) {
        removed += delete.execute(params![sha])?;
    }
    Ok(removed)
}

/// Writes the bytes of each file not stored yet (in the write's transaction, so a message never
/// refers to bytes that are not on disk).
fn save_files(conn: &Connection, files: &[FileBytes]) -> rusqlite::Result<()> {
    if files.is_empty() {
        return Ok(());
    }
    let mut known = conn.prepare_cached("SELECT 1 FROM files WHERE sha256 = ?1")?;
    let mut insert = conn.prepare_cached("INSERT INTO files (sha256, data) VALUES (?1, ?2)")?;
    for file in files {
        // Asked first so a step does not hand SQLite every attachment's bytes again.
        if !known.exists(params![file.sha256])? {
            insert.execute(params![file.sha256, &*file.data])?;
        }
    }
    Ok(())
}
