//! Reading persisted residents' cells, one at a time or all in one pass.
//!
//! A program resumes its residents one `ai.spawn` at a time, and each asks for its own cell. For
//! a store of many cells, asking SQLite once per cell (a read transaction and three lookups
//! each) is most of a resume, so the first `load_cell` of a store holding at least
//! [`IN_ONE_PASS`] cells reads every cell in one scan of each table and keeps their text
//! ([`Kept`]); each later `load_cell` takes its own from there and decodes only it. A cell's kept
//! text is dropped as soon as a write to that cell has committed (before its caller is answered),
//! so a load never returns less than what was acknowledged; a cell not kept (written since, or
//! never there) is read from SQLite as before. What is never asked for goes with the store, or
//! after [`KEPT_FOR`] without a load.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, params};

/// The fewest cells worth reading in one pass.
pub(super) const IN_ONE_PASS: i64 = 64;

/// How long the cells read in one pass are kept without a load asking for one.
const KEPT_FOR: Duration = Duration::from_secs(60);

/// A cell's rows as SQLite holds them (JSON text).
#[derive(Debug, Default)]
pub(super) struct RawCell {
    pub messages: String,
    pub dropped: i64,
    /// The backlog's rows (their `seq`, their mail), oldest first.
    pub backlog: Vec<(i64, String)>,
    /// The journal, in the order the calls were recorded.
    pub journal: Vec<RawEntry>,
}

#[derive(Debug)]
pub(super) struct RawEntry {
    pub call_id: String,
    pub tool: String,
    pub result: Option<String>,
    pub files: Option<String>,
}

/// Whether the cells were read in one pass, and what of it is left.
#[derive(Debug, Default)]
pub(super) enum Kept {
    /// No cell was loaded yet.
    #[default]
    Untried,
    Cells {
        cells: HashMap<String, RawCell>,
        last_taken: Instant,
    },
    /// Read one by one (a small store, or what was read in one pass is used up).
    Done,
}

impl Kept {
    /// The kept text of `name`'s cell, if it is kept.
    pub fn take(&mut self, name: &str) -> Option<RawCell> {
        self.expire();
        let Kept::Cells { cells, last_taken } = self else {
            return None;
        };
        let cell = cells.remove(name);
        *last_taken = Instant::now();
        if cells.is_empty() {
            *self = Kept::Done;
        }
        cell
    }

    /// Drops `name`'s kept text: its cell was written.
    pub fn forget(&mut self, name: &str) {
        self.expire();
        if let Kept::Cells { cells, .. } = self {
            cells.remove(name);
            if cells.is_empty() {
                *self = Kept::Done;
            }
        }
    }

    fn expire(&mut self) {
        if let Kept::Cells { last_taken, .. } = self
            && last_taken.elapsed() > KEPT_FOR
        {
            *self = Kept::Done;
        }
    }
}

/// Every cell, in one read transaction: one scan of each table.
pub(super) fn read_all(conn: &mut Connection) -> rusqlite::Result<HashMap<String, RawCell>> {
    let tx = conn.transaction()?;
    let mut cells: HashMap<String, RawCell> = HashMap::new();
    {
        let mut stmt = tx.prepare("SELECT name, messages, dropped FROM cells")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            cells.insert(
                r.get(0)?,
                RawCell {
                    messages: r.get(1)?,
                    dropped: r.get(2)?,
                    ..RawCell::default()
                },
            );
        }
        let mut stmt = tx.prepare("SELECT name, seq, mail FROM backlog ORDER BY seq")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let name: String = r.get(0)?;
            if let Some(cell) = cells.get_mut(&name) {
                cell.backlog.push((r.get(1)?, r.get(2)?));
            }
        }
        let mut stmt =
            tx.prepare("SELECT name, call_id, tool, result, files FROM journal ORDER BY rowid")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let name: String = r.get(0)?;
            if let Some(cell) = cells.get_mut(&name) {
                cell.journal.push(RawEntry {
                    call_id: r.get(1)?,
                    tool: r.get(2)?,
                    result: r.get(3)?,
                    files: r.get(4)?,
                });
            }
        }
    }
    tx.commit()?;
    Ok(cells)
}

/// How many cells the store holds.
pub(super) fn count(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT count(*) FROM cells")?
        .query_row([], |r| r.get(0))
}

/// One cell, in one read transaction.
pub(super) fn read_one(conn: &mut Connection, name: &str) -> rusqlite::Result<Option<RawCell>> {
    let tx = conn.transaction()?;
    let row: Option<(String, i64)> = tx
        .prepare_cached("SELECT messages, dropped FROM cells WHERE name = ?1")?
        .query_row(params![name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((messages, dropped)) = row else {
        return Ok(None);
    };
    let backlog = tx
        .prepare_cached("SELECT seq, mail FROM backlog WHERE name = ?1 ORDER BY seq")?
        .query_map(params![name], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<Vec<(i64, String)>>>()?;
    let journal = tx
        .prepare_cached(
            "SELECT call_id, tool, result, files FROM journal WHERE name = ?1 ORDER BY rowid",
        )?
        .query_map(params![name], |r| {
            Ok(RawEntry {
                call_id: r.get(0)?,
                tool: r.get(1)?,
                result: r.get(2)?,
                files: r.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<RawEntry>>>()?;
    tx.commit()?;
    Ok(Some(RawCell {
        messages,
        dropped,
        backlog,
        journal,
    }))
}
