//! What a file must be for the SQLite store to open it, and the schema it is brought to.
//!
//! Opening never "repairs": a file that is not SQLite, is not a colony store, fails
//! `PRAGMA quick_check` of a table other than the audit log ([`quick_check`]), or was written
//! by a newer colony (`PRAGMA user_version` above [`SCHEMA_VERSION`]) is refused with
//! [`StoreError::Damaged`] or [`StoreError::TooNew`] and left exactly as it was.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, TransactionBehavior};

use super::super::{StoreError, StoreResult};

/// `PRAGMA application_id` of a colony store ("Coln"): tells our files from other SQLite files.
pub const APPLICATION_ID: i32 = 0x436f_6c6e;

/// The schema version this build writes: the number of `MIGRATIONS`.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How long a write waits for another connection's transaction before failing.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

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
    // 5: the audit log without `AUTOINCREMENT` and without its two indexes. A script's every tool
    // call commits one line, and each of the three wrote a page of its own to the WAL (the
    // `sqlite_sequence` row, an index leaf each) beside the table's: four pages a line where one
    // does. Lines are deleted only oldest first (`[store] keep_audit`), so a plain rowid still
    // grows with each line (restarting at 1 only once every line is gone); the filters
    // of `colony audit` scan the table, which a reader can afford where every call cannot.
    "CREATE TABLE audit_lines (
         id          INTEGER PRIMARY KEY,
         at_ms       INTEGER NOT NULL,
         resident    TEXT NOT NULL,
         tool        TEXT NOT NULL,
         args_hash   TEXT NOT NULL,
         duration_ms REAL NOT NULL,
         outcome     TEXT NOT NULL,
         message     TEXT
     );
     INSERT INTO audit_lines
         SELECT id, at_ms, resident, tool, args_hash, duration_ms, outcome, message FROM audit;
     DROP TABLE audit;
     ALTER TABLE audit_lines RENAME TO audit;
     DELETE FROM sqlite_sequence WHERE name = 'audit';",
];

/// A new store, as [`empty_store_image`] writes it: `MIGRATIONS` applied to an empty file,
/// stamped at their version, compacted and switched to WAL mode. A new store is these bytes
/// written out, where building it with SQLite took 1.5 to 2 ms of CPU (parsing and running
/// the schema's statements, opening and closing a connection), most of a first run's start.
/// A test fails when a new step of `MIGRATIONS` is not in it yet, and says how to write it
/// anew; were an old one shipped anyway, opening would bring the new store up to date.
const EMPTY_STORE: &[u8] = include_bytes!("empty_store.sqlite3");

/// Opens (creating if missing) the file at `path` as the store's writing connection: checked,
/// in WAL mode with `synchronous=FULL`, its schema brought up to [`SCHEMA_VERSION`].
pub(super) fn open_checked(path: &Path) -> StoreResult<Connection> {
    let shown = path.display();
    // Whether the file is the store this call built, written out a moment ago.
    let built_here = match path.try_exists() {
        Ok(false) => {
            refuse_orphan_log(path)?;
            create(path)?
        }
        Ok(true) => {
            check_header(path)?;
            check_writable(path)?;
            refuse_lost_log(path)?;
            false
        }
        Err(e) => return Err(StoreError::Io(format!("{shown}: cannot look for it: {e}"))),
    };
    let mut conn = Connection::open(path).map_err(|e| classify(path, "cannot open it", e))?;
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
    // A store this call has just built and written out has nothing to find (about 0.2 ms of
    // a first run's start); one another opener put in place first is checked as any other.
    if !built_here {
        quick_check(&conn, path, version)?;
    }

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

    migrate(&mut conn, path, version)?;
    Ok(conn)
}

/// Creates the store at `path`, at [`SCHEMA_VERSION`] and in WAL mode, all at once: the bytes of
/// [`EMPTY_STORE`] written to a file of its own beside it (one `fsync`) and linked into place
/// (one more for the directory). Built in place, the same store took seven `fsync`s (the switch
/// to WAL through a rollback journal, then the schema through the WAL) and copied the schema
/// once more at the first checkpoint. `path` is either absent or a whole store. Linking never
/// replaces: a store that another process created meanwhile is the one opened, and this one is
/// dropped. What a creation cut short left beside it (its process gone) is removed by the next.
///
/// `true`: the store in place is the one this call built; `false`: another opener's.
fn create(path: &Path) -> StoreResult<bool> {
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let shown = path.display();
    let io = |doing: &str, e: std::io::Error| StoreError::Io(format!("{shown}: {doing}: {e}"));
    let dir = folder_of(path);
    let Some(name) = path.file_name() else {
        return Err(StoreError::Io(format!("{shown}: not a file name")));
    };
    if !dir.is_dir() {
        return Err(StoreError::Io(format!(
            "{shown}: cannot create it: its folder {} does not exist",
            dir.display()
        )));
    }
    clear_creations_cut_short(dir, name)
        .map_err(|e| io("cannot remove what an earlier creation left", e))?;
    let mut building = name.to_owned();
    building.push(format!(
        "{CREATING}{}.{}",
        std::process::id(),
        BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let building = dir.join(building);
    let built = (|| {
        write_out(&building, EMPTY_STORE).map_err(|e| io("cannot create it", e))?;
        match std::fs::hard_link(&building, path) {
            Ok(()) => Ok(true),
            // Another process created it meanwhile: that store stands.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            // A file system without hard links: renamed, which replaces.
            Err(_) => std::fs::rename(&building, path)
                .map(|()| true)
                .map_err(|e| io("cannot put it in place", e)),
        }
    })();
    let _ = std::fs::remove_file(&building);
    let ours = built?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("cannot write its directory out", e))?;
    Ok(ours)
}

/// A store file that is gone while its WAL is still there was removed without it: SQLite would
/// replay that log into the new store made in its place, bringing back what the person removing
/// it meant to remove (or pages of it, which is worse). Nothing is created then, and nothing
/// removed: the person decides.
fn refuse_orphan_log(path: &Path) -> StoreResult<()> {
    let wal = beside(path, "-wal");
    if wal.exists() {
        return Err(StoreError::Damaged(format!(
            "{} is missing but its write-ahead log {} is there: the store was removed without \
             it. Restore the store, or remove {} and {}-shm too to start afresh; nothing was \
             changed",
            path.display(),
            wal.display(),
            wal.display(),
            path.display()
        )));
    }
    Ok(())
}

/// Refuses a store whose `-wal` is gone while its `-shm` says the log held commits not yet
/// copied into the store (the `-wal` deleted after a crash): SQLite opened it as it was before
/// them, without a word, and every mail acknowledged since the last checkpoint was gone.
fn refuse_lost_log(path: &Path) -> StoreResult<()> {
    let (wal, shm) = (beside(path, "-wal"), beside(path, "-shm"));
    if wal.exists() {
        return Ok(());
    }
    // The WAL index's header (native byte order): `isInit` at 12, `mxFrame` (the last valid
    // frame) at 16; the checkpoint's `nBackfill` (frames copied into the store) at 96.
    // Believed only as SQLite believes it: the version it writes, and its two copies alike (a
    // crash of the machine leaves a -shm never written out, which must not refuse a good store).
    let mut head = [0u8; 100];
    let read = File::open(&shm).and_then(|mut f| f.read_exact(&mut head));
    let version = u32::from_ne_bytes([head[0], head[1], head[2], head[3]]);
    if read.is_err() || head[12] != 1 || version != 3_007_000 || head[..48] != head[48..96] {
        return Ok(());
    }
    let word = |at: usize| u32::from_ne_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let (frames, copied) = (word(16), word(96));
    if frames <= copied {
        return Ok(());
    }
    Err(StoreError::Damaged(format!(
        "{} is missing, though {} says it held {} frames of commits not yet in {}: what was \
         saved last is gone with it (deleted after a crash?). Put the -wal back; or remove {} \
         to open the store without them; nothing was changed",
        wal.display(),
        shm.display(),
        frames - copied,
        path.display(),
        shm.display()
    )))
}

/// The file SQLite keeps beside the store at `path`: `beside(path, "-wal")`.
fn beside(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    std::path::PathBuf::from(name)
}

/// The folder holding `path` (`.` for a bare name).
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// What names a store being built: `store.sqlite3.creating.PID.N`.
const CREATING: &str = ".creating.";

/// Removes the files of creations of the store `name` in `dir` whose process is gone (it was
/// killed while building): the half-built store and its `-wal` and `-shm`.
fn clear_creations_cut_short(dir: &Path, name: &std::ffi::OsStr) -> std::io::Result<()> {
    let mut prefix = name.to_owned();
    prefix.push(CREATING);
    let prefix = prefix.to_string_lossy().into_owned();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let file = entry.file_name();
        let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(prefix.as_str())) else {
            continue;
        };
        let pid = rest.split('.').next().and_then(|p| p.parse::<i32>().ok());
        if pid.is_some_and(process_is_gone) {
            match std::fs::remove_file(entry.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Whether no process `pid` runs (signal 0 checks without sending anything).
fn process_is_gone(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only looks the process up.
    pid > 0
        && unsafe { libc::kill(pid, 0) } == -1
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Refuses a store this user may not write, or whose `-wal` or `-shm` beside it (or their
/// folder) it may not: SQLite opens such a file read-only without a word, so a service started
/// as healthy and then refused every mail as `not_saved`, or its residents sat in a store
/// outage for good (a store left owned by root by an earlier `sudo colony run`, say).
fn check_writable(path: &Path) -> StoreResult<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let files = [
        path.to_path_buf(),
        beside(path, "-wal"),
        beside(path, "-shm"),
        folder_of(path).to_path_buf(),
    ];
    for file in files {
        let Ok(c) = std::ffi::CString::new(file.as_os_str().as_bytes()) else {
            continue;
        };
        // The effective user's right, as the open will be (access(2) asks for the real one's).
        // SAFETY: `c` is a NUL-terminated path that lives across the call.
        if unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) } == 0
        {
            continue;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::NotFound {
            continue;
        }
        let whose = std::fs::metadata(&file)
            .map(|m| format!(" (owner uid {}, mode {:o})", m.uid(), m.mode() & 0o7777))
            .unwrap_or_default();
        return Err(StoreError::Refused(format!(
            "{} cannot be written by this user{whose}: {e}; the store is left as it is \
             (give this user the state directory and its files, chown -R)",
            file.display()
        )));
    }
    Ok(())
}

/// Another connection to the checked file at `path`, for reading only: WAL lets it read
/// committed data while the writing connection commits.
pub(super) fn open_reader(path: &Path) -> StoreResult<Connection> {
    let conn = Connection::open(path).map_err(|e| classify(path, "cannot open it", e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| classify(path, "cannot set the busy timeout", e))?;
    conn.pragma_update(None, "query_only", true)
        .map_err(|e| classify(path, "cannot open it for reading", e))?;
    Ok(conn)
}

fn migrate(conn: &mut Connection, path: &Path, from: i64) -> StoreResult<()> {
    migrate_between(conn, path, from, SCHEMA_VERSION)
}

/// A store file as an older colony left it: its schema at `version` (for the tests of a
/// migration).
#[cfg(test)]
pub(super) fn create_at_version(path: &Path, version: i64) -> Connection {
    let mut conn = Connection::open(path).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    migrate_between(&mut conn, path, 0, version).unwrap();
    conn
}

/// Takes the schema from version `from` to `to` in one transaction: a new store (every step)
/// commits, and waits for the disk, once instead of once a step, and a step that fails leaves
/// the file at the version it had.
fn migrate_between(conn: &mut Connection, path: &Path, from: i64, to: i64) -> StoreResult<()> {
    if from >= to {
        return Ok(());
    }
    let what = format!("cannot bring its schema to version {to}");
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| classify(path, &what, e))?;
    for (i, step) in MIGRATIONS
        .iter()
        .enumerate()
        .take(to as usize)
        .skip(from as usize)
    {
        let what = format!("cannot bring its schema to version {}", i + 1);
        tx.execute_batch(step)
            .map_err(|e| classify(path, &what, e))?;
    }
    stamp(&tx, path, to)?;
    tx.commit().map_err(|e| classify(path, &what, e))?;
    Ok(())
}

/// Writes `bytes` to the new file `path` and waits for the disk: nothing of it is in place
/// before all of it is durable. Readable and writable by its owner, readable by others, as
/// SQLite creates a database (the umask applies).
fn write_out(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Writes the file [`EMPTY_STORE`] is: `MIGRATIONS` applied one after another in one
/// transaction, stamped, compacted (`VACUUM`: what a migration dropped leaves no free pages) and
/// switched to WAL mode. Its bytes depend only on the statements and SQLite's file format.
#[cfg(test)]
pub(super) fn empty_store_image(path: &Path) -> Vec<u8> {
    let mut conn = Connection::open(path).unwrap();
    migrate_between(&mut conn, path, 0, SCHEMA_VERSION).unwrap();
    conn.execute_batch("VACUUM").unwrap();
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.close().unwrap();
    std::fs::read(path).unwrap()
}

/// Marks the file as a colony store with its schema at version `to`.
fn stamp(conn: &Connection, path: &Path, to: i64) -> StoreResult<()> {
    let what = format!("cannot bring its schema to version {to}");
    conn.pragma_update(None, "application_id", APPLICATION_ID)
        .and_then(|()| conn.pragma_update(None, "user_version", to))
        .map_err(|e| classify(path, &what, e))
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

/// The table `quick_check` leaves out at open: the audit log.
const LOG_TABLE: &str = "audit";

/// The tables of the current schema.
const TABLES: &[&str] = &[
    "kv", "cells", "backlog", "journal", "breakers", "audit", "accepted", "files",
];

/// `PRAGMA quick_check` of every table but the audit log ([`LOG_TABLE`]), one table at a time.
///
/// The log grows by a line with every tool call, so after a while a service's store is mostly
/// log, and checking it whole made every start cost time in proportion to the program's
/// history (2 M lines, 210 MB: opening took 318 to 336 ms instead of 26 to 30, page cache warm;
/// `benches/store.rs` section 2). Nothing resumes from the log: it is read by `colony audit` and appended to, and SQLite reports damage on the pages
/// those read (answered as [`StoreError::Damaged`], naming the file). The tables a program
/// resumes from (conversations, backlogs, journals, breakers, files, `store.*`) are checked
/// whole, with their indexes, before anything is written, and each must be there.
fn quick_check(conn: &Connection, path: &Path, version: i64) -> StoreResult<()> {
    let all: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table'")
        .and_then(|mut s| {
            s.query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()
        })
        .map_err(|e| classify(path, "cannot read its schema", e))?;
    // A table gone (dropped by hand, a tool's "clean-up") passed the check: the program started
    // and wrote before a resident met "no such table". (An older schema is migrated after this,
    // with tables of its own.)
    let missing: Vec<&str> = TABLES
        .iter()
        .copied()
        .filter(|t| version == SCHEMA_VERSION && !all.iter().any(|have| have == t))
        .collect();
    if !missing.is_empty() {
        return Err(StoreError::Damaged(format!(
            "{} is damaged: its table(s) {} are missing; it was left as it is",
            path.display(),
            missing.join(", ")
        )));
    }
    let tables: Vec<&String> = all.iter().filter(|t| *t != LOG_TABLE).collect();
    let mut problems = Vec::new();
    for table in &tables {
        conn.pragma(None, "quick_check", table, |r| {
            let line: String = r.get(0)?;
            if line != "ok" {
                problems.push(line);
            }
            Ok(())
        })
        .map_err(|e| classify(path, "cannot check it", e))?;
    }
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

/// Whether the file system holding `path` has no space left for this user.
fn disk_is_full(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(folder_of(path).as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a NUL-terminated path; `stats` is written by the call before it is read.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut stats) } != 0 {
        return false;
    }
    // Less than SQLite needs to make its files: the -shm grows in 32 KiB regions, and the log
    // takes a header and a page; a quota's limit is not seen here.
    (stats.f_bavail as u128) * (stats.f_frsize as u128) < 64 * 1024
}

/// A rusqlite error as a [`StoreError`] naming the file: corruption is `Damaged`, the rest `Io`.
pub(super) fn classify(path: &Path, doing: &str, e: rusqlite::Error) -> StoreError {
    let shown = path.display();
    let sep = if doing.is_empty() { "" } else { ": " };
    // A row whose value is not of its column's type (a NULL where colony writes a time) was
    // not written by colony: damage, which `colony audit` showed as rusqlite's "Invalid column
    // type Null at index: 0, name: at_ms".
    if matches!(
        e,
        rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
    ) {
        return StoreError::Damaged(format!(
            "{shown} is damaged: a row holds a value of the wrong type ({e}); it was left as it is"
        ));
    }
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => StoreError::Damaged(format!(
            "{shown} is not a colony store (not an SQLite database): {e}; it was left as it is"
        )),
        Some(ErrorCode::DatabaseCorrupt) => StoreError::Damaged(format!(
            "{shown} is damaged: {doing}{sep}{e}; it was left as it is"
        )),
        // A folder or file this user may not write (SQLite writes the store and, beside it, its
        // -wal and -shm): "attempt to write a readonly database" named neither.
        Some(ErrorCode::ReadOnly) => StoreError::Refused(format!(
            "{shown} cannot be written: {doing}{sep}{e} (the file, its -wal or -shm beside it, \
             or their folder is read-only to this user)"
        )),
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => StoreError::Io(format!(
            "{shown} is busy (another connection kept it locked): {doing}{sep}{e}"
        )),
        // SQLite says "disk I/O error" when it cannot make its -shm or -wal on a full disk,
        // which sent people looking for failing hardware.
        Some(ErrorCode::SystemIoFailure) if disk_is_full(path) => StoreError::Io(format!(
            "{shown}: {doing}{sep}no space left on the disk ({e})"
        )),
        _ => StoreError::Io(format!("{shown}: {doing}{sep}{e}")),
    }
}
