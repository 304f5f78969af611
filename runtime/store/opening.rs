//! A program's store opened on a thread of its own while the program's VM is built.
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
    AuditEntry, AuditFilter, BreakerState, JournalEntry, SavedResident, Store, StoreResult,
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
        let store = Arc::new(OpeningStore {
            opened: OnceLock::new(),
        });
        let slot = store.clone();
        let thread = std::thread::Builder::new()
            .name("colony-store-open".into())
            .spawn(move || {
                let opened = ProgramStore::open(&dir, url.as_deref(), &script);
                let outcome = match &opened {
                    Ok(store) => Ok(store.dyn_store()),
                    Err(e) => Err(e.clone()),
                };
                let _ = slot.opened.set(outcome);
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
        self.thread.join().unwrap_or_else(|_| {
            Err(super::StoreError::Io(
                "the thread opening the store panicked".into(),
            ))
        })
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
    fn push_backlog(&self, name: &str, mail: &Mail) -> StoreResult<bool> {
        self.wait()?.push_backlog(name, mail)
    }
    fn commit_step(
        &self,
        name: &str,
        messages: &[Message],
        served: usize,
        dropped: u64,
    ) -> StoreResult<()> {
        self.wait()?.commit_step(name, messages, served, dropped)
    }
    fn journal(&self, name: &str, entry: &JournalEntry) -> StoreResult<()> {
        self.wait()?.journal(name, entry)
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
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::StoreError;
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
}
