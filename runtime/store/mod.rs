//! The durable store (ARCHITECTURE.md, "The store's guarantees"): what a program keeps across
//! restarts.
//!
//! - the Lua-visible key-value space (`store.get/set/delete/list/update`), one namespace per
//!   workspace (`""` is the program's global space);
//! - persisted conversations (`conversations/<name>`): the messages, the held backlog of mail
//!   accepted but not yet served, and the journal of the step in flight (tool results that
//!   finished before a restart are reused, never re-run);
//! - breaker states (`ai/breaker`);
//! - the audit log of tool calls.
//!
//! Everything goes through the [`Store`] trait so the embedded SQLite default ([`sqlite`]) can
//! give way to another backend (PostgreSQL) without touching the residents. Calls are
//! synchronous: a write returns once it is durable (with `synchronous=FULL`, after an fsync).
//! The SQLite store lets writes that arrive together share one transaction and one fsync
//! ([`group_commit`]), and a call made on a tokio worker waits off it ([`off_worker`]), so a
//! caller on an async runtime makes them directly.

pub mod audit_batch;
mod group_commit;
pub mod memory;
pub(crate) mod off_worker;
pub mod opening;
pub mod postgres;
pub mod select;
pub mod sqlite;
pub mod state_dir;

pub use group_commit::Commits;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::infer::breaker::BreakerState;
use crate::residents::Mail;
use crate::vocab::{FileRef, Message, ToolResult};

/// Why the store could not do something. The message names the file and what is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    /// Another process holds the state directory.
    #[error("{0}")]
    Locked(String),
    /// The file was written by a newer colony.
    #[error("{0}")]
    TooNew(String),
    /// A shared store an older colony wrote, opened only to be read: upgrading it would leave
    /// the programs still running on it a store they refuse.
    #[error("{0}")]
    TooOld(String),
    /// The file is not a colony store, or is damaged.
    #[error("{0}")]
    Damaged(String),
    /// Reading or writing failed.
    #[error("{0}")]
    Io(String),
    /// A value that JSON cannot hold, or an update function that failed.
    #[error("{0}")]
    Value(String),
    /// A write through a lease another node has taken over (or that was released): refused.
    #[error("{0}")]
    Fenced(String),
    /// The database refused us for good: a wrong password, a role or a database that does not
    /// exist. Trying again changes nothing until someone fixes the settings.
    #[error("{0}")]
    Refused(String),
}

impl StoreError {
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Locked(_) => "locked",
            StoreError::TooNew(_) => "too_new",
            StoreError::TooOld(_) => "too_old",
            StoreError::Refused(_) => "refused",
            StoreError::Damaged(_) => "damaged",
            StoreError::Io(_) => "io_error",
            StoreError::Value(_) => "value_error",
            StoreError::Fenced(_) => "fenced",
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// What the store keeps of a persisted resident (its "cell"): what a restart resumes from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SavedResident {
    /// The committed conversation.
    pub messages: Vec<Message>,
    /// Mail accepted (`ai.mail` answered `true`) and not yet served, oldest first, each with
    /// the row it is saved as ([`Mail::saved`]).
    pub backlog: Vec<Mail>,
    /// Older arrivals the outage bound discarded, not yet reported to the model.
    pub dropped: u64,
    /// The step in flight when the program stopped: its calls, started or finished.
    pub journal: Vec<JournalEntry>,
}

/// One tool call of the step in flight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub call_id: String,
    pub tool: String,
    /// `None` while it runs; the result once it finished.
    pub result: Option<ToolResult>,
    /// The files the result carries (a store keeps their bytes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileRef>,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Wall-clock milliseconds since the Unix epoch, when the call finished.
    pub at_ms: u64,
    /// The resident whose turn made the call, or `script` for a script's own turn.
    pub resident: String,
    pub tool: String,
    /// SHA-256 of the arguments' JSON text, hex.
    pub args_hash: String,
    pub duration_ms: f64,
    /// `ok`, `error`, `thrown`, `bad_arguments`, `schema`, `deadline`, `unknown_tool`,
    /// `interrupted`, `not_run`.
    pub outcome: String,
    /// What the model was told of a call that did not go well (redacted); `None` for `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
impl AuditEntry {
    /// Line `n` of the store's unit tests: a script's call of tool `t{n}` at `n` ms.
    pub(crate) fn numbered(n: u64) -> AuditEntry {
        AuditEntry {
            at_ms: n,
            resident: "script".into(),
            tool: format!("t{n}"),
            args_hash: String::new(),
            duration_ms: 0.0,
            outcome: "ok".into(),
            message: None,
        }
    }
}

/// Which audit lines to list.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub resident: Option<String>,
    pub tool: Option<String>,
}

/// The most audit lines one [`Store::prune_audit`] removes: the oldest lines are looked for
/// among this many, so a call's work is bounded whatever the log's length.
pub const PRUNE_BATCH: u32 = 10_000;

/// The store's operations. Implementations are `Send + Sync` and serialise their own writes.
pub trait Store: Send + Sync {
    // --- key-value, per workspace ("" is the global space) ---

    fn get(&self, space: &str, key: &str) -> StoreResult<Option<Value>>;
    fn set(&self, space: &str, key: &str, value: &Value) -> StoreResult<()>;
    /// Whether the key existed.
    fn delete(&self, space: &str, key: &str) -> StoreResult<bool>;
    /// The keys starting with `prefix`, in byte order.
    fn list(&self, space: &str, prefix: &str) -> StoreResult<Vec<String>>;
    /// Atomic read-modify-write: `f` gets the current value and returns the new one (`None`
    /// deletes). No other write lands between the read and the write.
    fn update(
        &self,
        space: &str,
        key: &str,
        f: &mut dyn FnMut(Option<Value>) -> Result<Option<Value>, String>,
    ) -> StoreResult<Option<Value>>;

    // --- persisted conversations ---

    /// The names with a cell, in order.
    fn conversations(&self) -> StoreResult<Vec<String>>;
    fn load_cell(&self, name: &str) -> StoreResult<Option<SavedResident>>;
    /// Appends accepted mail to the backlog (before `ai.mail` answers `true`): the row it was
    /// saved as ([`Mail::saved`]), which the commit that serves it names. A mail with an `id`
    /// this cell has accepted before is not appended again: `Ok(None)`. Rows are never numbered
    /// twice, so a commit repeated after its answer was lost removes nothing it should not.
    fn push_backlog(&self, name: &str, mail: &Mail) -> StoreResult<Option<i64>>;
    /// One transaction after a step: the conversation becomes `messages`, the backlog rows
    /// `served` are removed (their mail is in `messages` now; rows already gone are skipped),
    /// `dropped` is set, and the journal is cleared.
    fn commit_step(
        &self,
        name: &str,
        messages: &[Message],
        served: &[i64],
        dropped: u64,
    ) -> StoreResult<()>;
    /// Removes held mail without serving it (`colony conversations drop`): the backlog rows
    /// `rows` of `name` (rows already gone are skipped), its conversation and journal left as
    /// they are. Answers how many were removed. SQLite takes the bytes of their attachments
    /// that nothing else refers to with them, as a clear does.
    fn drop_backlog(&self, name: &str, rows: &[i64]) -> StoreResult<usize>;
    /// Records that a call of the step in flight started (`result: None`) or finished.
    fn journal(&self, name: &str, entry: &JournalEntry) -> StoreResult<()>;
    /// Removes the cell (`ai.dismiss`), the mail ids it accepted included.
    fn clear_cell(&self, name: &str) -> StoreResult<bool>;

    // --- breaker ---

    fn breaker(&self, key: &str) -> StoreResult<Option<BreakerState>>;
    fn save_breaker(&self, key: &str, state: &BreakerState) -> StoreResult<()>;

    // --- audit ---

    fn audit(&self, entry: &AuditEntry) -> StoreResult<()>;
    /// Several lines at once ([`audit_batch`]): SQLite writes them in one transaction; this
    /// default writes them one after the other.
    fn audit_all(&self, entries: &[AuditEntry]) -> StoreResult<()> {
        entries.iter().try_for_each(|e| self.audit(e))
    }
    /// A call finished: its audit line and, for a kept conversation, its journal entry (`name`'s),
    /// together. SQLite writes both in one transaction, so a finished call waits for one fsync,
    /// not two; this default writes them one after the other, the audit line first (a call the
    /// journal records as finished is always audited).
    fn finish_call(
        &self,
        name: &str,
        audit: &AuditEntry,
        journal: Option<&JournalEntry>,
    ) -> StoreResult<()> {
        self.audit(audit)?;
        match journal {
            Some(entry) => self.journal(name, entry),
            None => Ok(()),
        }
    }
    fn audit_log(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditEntry>>;
    /// Removes audit lines older than `before_ms` (ms since the epoch), oldest first, at most
    /// [`PRUNE_BATCH`] a call so that the writes waiting behind it wait little: `true` when
    /// it removed any (call again). `[store] keep_audit` ([`crate::residents::retention`]).
    fn prune_audit(&self, before_ms: u64) -> StoreResult<bool> {
        let _ = before_ms;
        Ok(false)
    }

    /// Writes are likely soon (a turn that may call tools has begun, and a call writes its
    /// audit line): the store may get ready for them beside what the caller does meanwhile.
    /// Returns at once. SQLite starts its log ([`sqlite::SqliteStore::prepare_writes`]).
    /// Nothing by default.
    fn prepare_writes(&self) {}
}
