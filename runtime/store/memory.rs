//! A [`Store`] in memory: for programs run without a state directory (`colony ask`, an embedding
//! application that keeps nothing) and for tests. It forgets everything on exit, and of the audit
//! log it keeps the newest [`AUDIT_KEPT`] lines.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;

use super::{AuditEntry, AuditFilter, JournalEntry, SavedResident, Store, StoreError, StoreResult};
use crate::infer::breaker::BreakerState;
use crate::residents::Mail;
use crate::vocab::Message;

thread_local! {
    /// Set while an update function runs on this thread: the store refuses calls from inside
    /// it instead of deadlocking on its own lock.
    static IN_UPDATE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    kv: BTreeMap<(String, String), Value>,
    cells: BTreeMap<String, SavedResident>,
    breakers: BTreeMap<String, BreakerState>,
    accepted: std::collections::BTreeSet<(String, String)>,
    /// The last backlog row numbered (rows are never numbered twice).
    rows: i64,
    /// The newest [`AUDIT_KEPT`] audit lines.
    audit: VecDeque<AuditEntry>,
}

/// How many audit lines a memory store keeps: a program without a state directory that calls
/// tools for days (an embedding application's) would otherwise grow by every call it makes. The
/// durable stores keep every line.
pub const AUDIT_KEPT: usize = 10_000;

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn lock(&self) -> StoreResult<MutexGuard<'_, Inner>> {
        if IN_UPDATE.with(|c| c.get()) {
            return Err(StoreError::Value(
                "the store cannot be used from inside an update function".into(),
            ));
        }
        Ok(self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Store for MemoryStore {
    fn get(&self, space: &str, key: &str) -> StoreResult<Option<Value>> {
        Ok(self.lock()?.kv.get(&(space.into(), key.into())).cloned())
    }

    fn set(&self, space: &str, key: &str, value: &Value) -> StoreResult<()> {
        self.lock()?
            .kv
            .insert((space.into(), key.into()), value.clone());
        Ok(())
    }

    fn delete(&self, space: &str, key: &str) -> StoreResult<bool> {
        Ok(self
            .lock()?
            .kv
            .remove(&(space.into(), key.into()))
            .is_some())
    }

    fn list(&self, space: &str, prefix: &str) -> StoreResult<Vec<String>> {
        Ok(self
            .lock()?
            .kv
            .range((space.to_string(), prefix.to_string())..)
            .take_while(|((s, k), _)| s == space && k.starts_with(prefix))
            .map(|((_, k), _)| k.clone())
            .collect())
    }

    fn update(
        &self,
        space: &str,
        key: &str,
        f: &mut dyn FnMut(Option<Value>) -> Result<Option<Value>, String>,
    ) -> StoreResult<Option<Value>> {
        let mut inner = self.lock()?;
        let k = (space.to_string(), key.to_string());
        IN_UPDATE.with(|c| c.set(true));
        let new = f(inner.kv.get(&k).cloned());
        IN_UPDATE.with(|c| c.set(false));
        let new = new.map_err(StoreError::Value)?;
        match &new {
            Some(v) => inner.kv.insert(k, v.clone()),
            None => inner.kv.remove(&k),
        };
        Ok(new)
    }

    fn conversations(&self) -> StoreResult<Vec<String>> {
        Ok(self.lock()?.cells.keys().cloned().collect())
    }

    fn load_cell(&self, name: &str) -> StoreResult<Option<SavedResident>> {
        Ok(self.lock()?.cells.get(name).cloned())
    }

    fn push_backlog(&self, name: &str, mail: &Mail) -> StoreResult<Option<i64>> {
        let mut inner = self.lock()?;
        if let Some(id) = &mail.id
            && !inner.accepted.insert((name.into(), id.clone()))
        {
            return Ok(None);
        }
        inner.rows += 1;
        let row = inner.rows;
        inner
            .cells
            .entry(name.into())
            .or_default()
            .backlog
            .push(Mail {
                saved: Some(row),
                ..mail.clone()
            });
        Ok(Some(row))
    }

    fn commit_step(
        &self,
        name: &str,
        messages: &[Message],
        served: &[i64],
        dropped: u64,
    ) -> StoreResult<()> {
        let mut inner = self.lock()?;
        let cell = inner.cells.entry(name.into()).or_default();
        cell.messages = messages.to_vec();
        cell.backlog
            .retain(|m| m.saved.is_none_or(|row| !served.contains(&row)));
        cell.dropped = dropped;
        cell.journal.clear();
        Ok(())
    }

    fn journal(&self, name: &str, entry: &JournalEntry) -> StoreResult<()> {
        let mut inner = self.lock()?;
        let journal = &mut inner.cells.entry(name.into()).or_default().journal;
        match journal.iter_mut().find(|e| e.call_id == entry.call_id) {
            Some(e) => *e = entry.clone(),
            None => journal.push(entry.clone()),
        }
        Ok(())
    }

    fn drop_backlog(&self, name: &str, rows: &[i64]) -> StoreResult<usize> {
        let mut inner = self.lock()?;
        let Some(cell) = inner.cells.get_mut(name) else {
            return Ok(0);
        };
        let before = cell.backlog.len();
        cell.backlog
            .retain(|m| m.saved.is_none_or(|row| !rows.contains(&row)));
        Ok(before - cell.backlog.len())
    }

    fn clear_cell(&self, name: &str) -> StoreResult<bool> {
        let mut inner = self.lock()?;
        inner.accepted.retain(|(n, _)| n != name);
        Ok(inner.cells.remove(name).is_some())
    }

    fn breaker(&self, key: &str) -> StoreResult<Option<BreakerState>> {
        Ok(self.lock()?.breakers.get(key).cloned())
    }

    fn save_breaker(&self, key: &str, state: &BreakerState) -> StoreResult<()> {
        self.lock()?.breakers.insert(key.into(), state.clone());
        Ok(())
    }

    fn audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        let mut inner = self.lock()?;
        if inner.audit.len() == AUDIT_KEPT {
            inner.audit.pop_front();
        }
        inner.audit.push_back(entry.clone());
        Ok(())
    }

    fn prune_audit(&self, before_ms: u64) -> StoreResult<bool> {
        let mut inner = self.lock()?;
        let window = inner.audit.len().min(super::PRUNE_BATCH as usize);
        let mut removed = false;
        let mut kept = std::collections::VecDeque::with_capacity(inner.audit.len());
        for (n, line) in inner.audit.drain(..).enumerate() {
            if n < window && line.at_ms < before_ms {
                removed = true;
            } else {
                kept.push_back(line);
            }
        }
        inner.audit = kept;
        Ok(removed)
    }

    fn audit_log(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditEntry>> {
        Ok(self
            .lock()?
            .audit
            .iter()
            .filter(|e| filter.resident.as_ref().is_none_or(|r| &e.resident == r))
            .filter(|e| filter.tool.as_ref().is_none_or(|t| &e.tool == t))
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_log_keeps_the_newest_lines() {
        let store = MemoryStore::new();
        let made = AUDIT_KEPT as u64 + 5;
        for n in 0..made {
            store.audit(&AuditEntry::numbered(n)).unwrap();
        }
        let kept = store.audit_log(&AuditFilter::default()).unwrap();
        assert_eq!(kept.len(), AUDIT_KEPT);
        assert_eq!(
            kept.first().map(|e| e.at_ms),
            Some(5),
            "the five oldest are dropped"
        );
        assert_eq!(kept.last().map(|e| e.at_ms), Some(made - 1));
    }

    #[test]
    fn pruning_removes_the_oldest_lines_past_the_keep() {
        let store = MemoryStore::new();
        for n in 0..10 {
            store.audit(&AuditEntry::numbered(n)).unwrap();
        }
        assert!(!store.prune_audit(0).unwrap());
        assert!(store.prune_audit(4).unwrap());
        assert!(!store.prune_audit(4).unwrap());
        let kept = store.audit_log(&AuditFilter::default()).unwrap();
        assert_eq!(
            kept.iter().map(|e| e.at_ms).collect::<Vec<_>>(),
            (4..10).collect::<Vec<_>>()
        );
    }
}
