//! A program's store opened on a thread of its own while the runtime and the program's VM are
//! built.
//!
//! Opening a store is mostly waiting: the state directory's lock, SQLite's files, a new store's
//! two `fsync`s, `quick_check`. Building the Lua VM is mostly CPU. Done one after the other they
//! were about a third of a one-turn run's wall time before its first request; side by side they
//! overlap. What a program may rely on does not change: its script runs only once its store is
//! open, and not at all when the store cannot be opened ([`OpeningStore::wait`], which the Lua
//! host calls before the script's first line), with the error opening it would have given.
//!
//! Until then the store is an [`OpeningStore`]: the handle the VM's parts keep, whose every call
//! waits for the opening to end and then goes to the store it opened.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use serde_json::Value;

use super::select::ProgramStore;
use super::{
    AuditEntry, AuditFilter, BreakerState, JournalEntry, SavedResident, Store, StoreError,
    StoreResult,
};
use crate::residents::Mail;
use crate::vocab::Message;

/// The store a program is opening: a [`Store`] whose calls wait until it is open.
pub struct OpeningStore {
    opened: OnceLock<StoreResult<Arc<dyn Store>>>,
}

/// The opening under way, to be ended with [`Opening::finish`].
pub struct Opening {
    store: Arc<OpeningStore>,
    thread: std::thread::JoinHandle<StoreResult<ProgramStore>>,
}

impl Opening {
    /// Starts opening the program store `ProgramStore::open(dir, url, script)` would open, on a
    /// thread of its own.
    pub fn start(dir: PathBuf, url: Option<String>, script: PathBuf) -> std::io::Result<Opening> {
        Opening::spawn(move || ProgramStore::open(&dir, url.as_deref(), &script))
    }

    /// Runs `open` on a thread of its own. Whatever way it ends, those waiting are told: a
    /// panic is an error, never a wait that does not end.
    fn spawn(
        open: impl FnOnce() -> StoreResult<ProgramStore> + Send + 'static,
    ) -> std::io::Result<Opening> {
        let store = Arc::new(OpeningStore {
            opened: OnceLock::new(),
        });
        let told = TellOnDrop(store.clone());
        let thread = std::thread::Builder::new()
            .name("colony-store-open".into())
            .spawn(move || {
                let opened = open();
                let _ = told.0.opened.set(match &opened {
                    Ok(store) => Ok(store.dyn_store()),
                    Err(e) => Err(e.clone()),
                });
                opened
            })?;
        Ok(Opening { store, thread })
    }

    /// The store as the program's parts keep it.
    pub fn store(&self) -> Arc<OpeningStore> {
        self.store.clone()
    }

    /// Waits for the opening to end: the opened store (which holds the state directory's lock
    /// until it is dropped), or why it could not be opened.
    pub fn finish(self) -> StoreResult<ProgramStore> {
        self.thread.join().unwrap_or_else(|_| Err(panicked()))
    }
}

/// Why a store whose opening panicked is not open.
fn panicked() -> StoreError {
    StoreError::Io("the thread opening the store panicked".into())
}

/// Tells those waiting on the opening that it panicked, unless it ended and told them itself.
struct TellOnDrop(Arc<OpeningStore>);

impl Drop for TellOnDrop {
    fn drop(&mut self) {
        let _ = self.0.opened.set(Err(panicked()));
    }
}

impl OpeningStore {
    /// Waits until the store is open: `Err` is why it could not be.
    pub fn wait(&self) -> StoreResult<&Arc<dyn Store>> {
        self.opened.wait().as_ref().map_err(Clone::clone)
    }
}

impl Store for OpeningStore {
    fn get(&self, space: &str, key: &str) -> StoreResult<Option<Value>> {
        self.wait()?.get(space, key)
    }
    fn set(&self, space: &str, key: &str, value: &Value) -> StoreResult<()> {
        self.wait()?.set(space, key, value)
    }
    fn delete(&self, space: &str, key: &str) -> StoreResult<bool> {
        self.wait()?.delete(space, key)
    }
    fn list(&self, space: &str, prefix: &str) -> StoreResult<Vec<String>> {
        self.wait()?.list(space, prefix)
    }
    fn update(
        &self,
        space: &str,
        key: &str,
        f: &mut dyn FnMut(Option<Value>) -> Result<Option<Value>, String>,
    ) -> StoreResult<Option<Value>> {
        self.wait()?.update(space, key, f)
    }
    fn conversations(&self) -> StoreResult<Vec<String>> {
        self.wait()?.conversations()
    }
    fn load_cell(&self, name: &str) -> StoreResult<Option<SavedResident>> {
        self.wait()?.load_cell(name)
    }
    fn push_backlog(&self, name: &str, mail: &Mail) -> StoreResult<Option<i64>> {
        self.wait()?.push_backlog(name, mail)
    }
    fn commit_step(
        &self,
        name: &str,
        messages: &[Message],
        served: &[i64],
        dropped: u64,
    ) -> StoreResult<()> {
        self.wait()?.commit_step(name, messages, served, dropped)
    }
    fn journal(&self, name: &str, entry: &JournalEntry) -> StoreResult<()> {
        self.wait()?.journal(name, entry)
    }
    fn drop_backlog(&self, name: &str, rows: &[i64]) -> StoreResult<usize> {
        self.wait()?.drop_backlog(name, rows)
    }
    fn clear_cell(&self, name: &str) -> StoreResult<bool> {
        self.wait()?.clear_cell(name)
    }
    fn breaker(&self, key: &str) -> StoreResult<Option<BreakerState>> {
        self.wait()?.breaker(key)
    }
    fn save_breaker(&self, key: &str, state: &BreakerState) -> StoreResult<()> {
        self.wait()?.save_breaker(key, state)
    }
    fn audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        self.wait()?.audit(entry)
    }
    fn audit_all(&self, entries: &[AuditEntry]) -> StoreResult<()> {
        self.wait()?.audit_all(entries)
    }
    fn finish_call(
        &self,
        name: &str,
        audit: &AuditEntry,
        journal: Option<&JournalEntry>,
    ) -> StoreResult<()> {
        self.wait()?.finish_call(name, audit, journal)
    }
    fn audit_log(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditEntry>> {
        self.wait()?.audit_log(filter)
    }
    fn prune_audit(&self, before_ms: u64) -> StoreResult<bool> {
        self.wait()?.prune_audit(before_ms)
    }
    fn prepare_writes(&self) {
        // Before the store is open nobody writes: there is nothing to prepare for yet.
        if let Some(Ok(store)) = self.opened.get() {
            store.prepare_writes();
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::state_dir::StateDir;

    /// A call made while the store opens waits for it and reaches the store that was opened.
    #[test]
    fn calls_wait_for_the_opening_and_reach_the_store_it_opened() {
        let dir = tempfile::tempdir().unwrap();
        let opening = Opening::start(dir.path().to_path_buf(), None, "p.lua".into()).unwrap();
        let store = opening.store();
        store.set("", "k", &json!(1)).unwrap();
        assert_eq!(store.get("", "k").unwrap(), Some(json!(1)));
        let opened = opening.finish().unwrap();
        assert_eq!(opened.dyn_store().get("", "k").unwrap(), Some(json!(1)));
        assert!(dir.path().join("store.sqlite3").exists());
    }

    /// A turn's `prepare_writes` reaches the store the opening opened: its log is started
    /// (`SqliteStore::prepare_writes`). Before anything asks, the log is left empty.
    #[test]
    fn writes_are_prepared_for_in_the_store_that_was_opened() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("store.sqlite3-wal");
        let log = || wal.metadata().map(|m| m.len()).unwrap_or(0);
        let opening = Opening::start(dir.path().to_path_buf(), None, "p.lua".into()).unwrap();
        let store = opening.store();
        store.wait().unwrap();
        assert_eq!(log(), 0, "an opened store's log is empty");
        store.prepare_writes();
        let opened = opening.finish().unwrap();
        let ProgramStore::Dir(state) = &opened else {
            panic!("a state directory's store")
        };
        state.store().join_log_starter();
        assert!(log() > 0, "the log is started");
        store.set("", "k", &json!(1)).unwrap();
        drop((store, opened));
        assert!(!wal.exists(), "closing the store removes its log");
    }

    /// An opening that fails gives its error to whoever waits, to every call, and to `finish`.
    #[test]
    fn an_opening_that_fails_gives_its_error_to_every_caller() {
        let dir = tempfile::tempdir().unwrap();
        let held = StateDir::open(dir.path()).unwrap();
        let opening = Opening::start(dir.path().to_path_buf(), None, "p.lua".into()).unwrap();
        let store = opening.store();
        let why = store.wait().err().expect("a held directory is refused");
        assert!(matches!(why, StoreError::Locked(_)), "{why:?}");
        assert_eq!(store.get("", "k").unwrap_err(), why);
        assert_eq!(opening.finish().unwrap_err(), why);
        drop(held);
    }

    /// An opening that panics ends every wait with an error: the Lua thread waiting before the
    /// script's first line would otherwise wait for ever, and `colony run` with it.
    #[test]
    fn an_opening_that_panics_ends_every_wait_with_an_error() {
        let opening = Opening::spawn(|| panic!("a defect while opening")).unwrap();
        let store = opening.store();
        // Waited for on a thread of its own, so that a wait that never ends fails the test
        // rather than hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = store.clone();
        std::thread::spawn(move || tx.send(waiting.wait().err()));
        let why = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the wait ends")
            .expect("a panicked opening is not open");
        assert_eq!(why, panicked());
        assert_eq!(store.audit_log(&AuditFilter::default()).unwrap_err(), why);
        assert_eq!(opening.finish().unwrap_err(), why);
    }
}
