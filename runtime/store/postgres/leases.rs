//! Leases for placement: which node owns a resident, until when, and the fencing token that
//! makes a lost lease harmless.
//!
//! A lease is a row of `colony_leases`: the resident's name, the owner (a node's id), a token
//! from one sequence, and an expiry on the database's clock (so nodes' clocks need not agree).
//! [`PostgresStore::acquire`] takes a lease that is free, expired or already the caller's, each
//! time with a new token; [`PostgresStore::renew`] (the heartbeat) extends it while the token
//! is still the current one; [`PostgresStore::release`] hands it over at once (SIGTERM).
//!
//! Fencing: a node writes a resident's cell through a [`FencedStore`], whose every cell write
//! (`push_backlog`, `commit_step`, `journal`, `clear_cell`) checks, in the write's own
//! transaction, that the lease row still holds the node's token, and locks the row (`FOR
//! SHARE`) until it commits. A takeover updates that row, so it waits for writes in flight, and
//! once it has committed no write with the old token can: a node paused past its lease (GC,
//! SIGSTOP, a partition) that resumes and writes is refused with [`StoreError::Fenced`] instead
//! of overwriting what the new owner did.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::PostgresStore;
use crate::infer::breaker::BreakerState;
use crate::residents::Mail;
use crate::store::{
    AuditEntry, AuditFilter, JournalEntry, SavedResident, Store, StoreError, StoreResult,
};
use crate::vocab::Message;

/// A held lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// What is leased (a resident's name).
    pub name: String,
    /// Who holds it (a node's id).
    pub owner: String,
    /// The fencing token: grows with every acquisition, never reused.
    pub token: i64,
    /// When it expires, in milliseconds since the Unix epoch on the database's clock.
    pub expires_at_ms: i64,
}

/// What a cell write must find in the lease row to be allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub owner: String,
    pub token: i64,
}

pub(super) const LEASE_COLUMNS: &str =
    "name, owner, token, (extract(epoch FROM expires_at) * 1000)::bigint AS expires_at_ms";

pub(super) fn lease_of(row: &tokio_postgres::Row) -> Lease {
    Lease {
        name: row.get(0),
        owner: row.get(1),
        token: row.get(2),
        expires_at_ms: row.get(3),
    }
}

fn millis(ttl: Duration) -> f64 {
    ttl.as_secs_f64() * 1000.0
}

impl PostgresStore {
    /// Takes the lease on `name` for `owner` for `ttl`, if it is free, expired, or `owner`'s
    /// already: `Some` with a new token. `None` while another owner's lease runs.
    pub fn acquire(&self, name: &str, owner: &str, ttl: Duration) -> StoreResult<Option<Lease>> {
        self.plain("lease name", name)?;
        self.plain("lease owner", owner)?;
        let ms = millis(ttl);
        self.with(|client| async move {
            let row = client
                .query_opt(
                    &format!(
                        "INSERT INTO colony_leases (name, owner, token, expires_at) \
                         VALUES ($1, $2, nextval('colony_lease_tokens'), \
                                 now() + $3 * interval '1 millisecond') \
                         ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, \
                             token = excluded.token, expires_at = excluded.expires_at \
                           WHERE colony_leases.expires_at <= now() \
                              OR colony_leases.owner = excluded.owner \
                         RETURNING {LEASE_COLUMNS}"
                    ),
                    &[&name, &owner, &ms],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(row.as_ref().map(lease_of))
        })
    }

    /// The heartbeat: extends `lease` by `ttl` from now if its token is still the current one
    /// (even past its expiry, when nobody took it meanwhile). `None` when it was lost.
    pub fn renew(&self, lease: &Lease, ttl: Duration) -> StoreResult<Option<Lease>> {
        let ms = millis(ttl);
        self.with(|client| async move {
            let row = client
                .query_opt(
                    &format!(
                        "UPDATE colony_leases SET expires_at = now() + $3 * interval '1 millisecond' \
                         WHERE name = $1 AND token = $2 RETURNING {LEASE_COLUMNS}"
                    ),
                    &[&lease.name, &lease.token, &ms],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(row.as_ref().map(lease_of))
        })
    }

    /// Gives `lease` up at once (another node may take it without waiting for the expiry).
    /// Whether it was still held.
    pub fn release(&self, lease: &Lease) -> StoreResult<bool> {
        self.with(|client| async move {
            let n = client
                .execute(
                    "DELETE FROM colony_leases WHERE name = $1 AND token = $2",
                    &[&lease.name, &lease.token],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(n > 0)
        })
    }

    /// The lease on `name` as the database holds it (expired or not), if any.
    pub fn lease(&self, name: &str) -> StoreResult<Option<Lease>> {
        if name.contains('\0') {
            return Ok(None);
        }
        self.with(|client| async move {
            let row = client
                .query_opt(
                    &format!("SELECT {LEASE_COLUMNS} FROM colony_leases WHERE name = $1"),
                    &[&name],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(row.as_ref().map(lease_of))
        })
    }

    /// In a cell write's transaction: refuses it unless `fence` still matches the lease row of
    /// `name`, and keeps the row from changing until the write commits.
    pub(super) async fn check_fence(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        name: &str,
        fence: Option<&Fence>,
    ) -> StoreResult<()> {
        let Some(fence) = fence else {
            return Ok(());
        };
        let held = tx
            .query_opt(
                "SELECT 1 FROM colony_leases WHERE name = $1 AND owner = $2 AND token = $3 \
                 FOR SHARE",
                &[&name, &fence.owner, &fence.token],
            )
            .await
            .map_err(|e| self.err(e))?;
        if held.is_none() {
            return Err(StoreError::Fenced(format!(
                "{}: the write to {name:?} by {} was refused: its lease (token {}) was taken \
                 over or released",
                self.shown, fence.owner, fence.token
            )));
        }
        Ok(())
    }
}

/// A [`Store`] for one node: writes to a resident's cell go through only with the node's
/// current lease on that resident ([`FencedStore::hold`]); a resident it holds no lease on is
/// refused ([`StoreError::Fenced`]). Reads, the key-value space, breakers and the audit log pass
/// straight through.
pub struct FencedStore {
    inner: Arc<PostgresStore>,
    owner: String,
    tokens: Mutex<HashMap<String, i64>>,
}

impl FencedStore {
    pub fn new(inner: Arc<PostgresStore>, owner: &str) -> FencedStore {
        FencedStore {
            inner,
            owner: owner.to_string(),
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// Writes to `lease.name` go through with `lease`'s token from now on.
    pub fn hold(&self, lease: &Lease) {
        self.lock().insert(lease.name.clone(), lease.token);
    }

    /// Stops writing to `name` (its lease was released or lost).
    pub fn forget(&self, name: &str) {
        self.lock().remove(name);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fence(&self, name: &str) -> StoreResult<Fence> {
        match self.lock().get(name) {
            Some(&token) => Ok(Fence {
                owner: self.owner.clone(),
                token,
            }),
            None => Err(StoreError::Fenced(format!(
                "{}: the write to {name:?} by {} was refused: it holds no lease on it",
                self.inner.shown(),
                self.owner
            ))),
        }
    }
}

impl Store for FencedStore {
    fn get(&self, space: &str, key: &str) -> StoreResult<Option<Value>> {
        self.inner.get(space, key)
    }
    fn set(&self, space: &str, key: &str, value: &Value) -> StoreResult<()> {
        self.inner.set(space, key, value)
    }
    fn delete(&self, space: &str, key: &str) -> StoreResult<bool> {
        self.inner.delete(space, key)
    }
    fn list(&self, space: &str, prefix: &str) -> StoreResult<Vec<String>> {
        self.inner.list(space, prefix)
    }
    fn update(
        &self,
        space: &str,
        key: &str,
        f: &mut dyn FnMut(Option<Value>) -> Result<Option<Value>, String>,
    ) -> StoreResult<Option<Value>> {
        self.inner.update(space, key, f)
    }
    fn conversations(&self) -> StoreResult<Vec<String>> {
        self.inner.conversations()
    }
    fn load_cell(&self, name: &str) -> StoreResult<Option<SavedResident>> {
        self.inner.load_cell(name)
    }
    fn push_backlog(&self, name: &str, mail: &Mail) -> StoreResult<Option<i64>> {
        self.inner
            .push_backlog_fenced(name, mail, Some(&self.fence(name)?))
    }
    fn commit_step(
        &self,
        name: &str,
        messages: &[Message],
        served: &[i64],
        dropped: u64,
    ) -> StoreResult<()> {
        self.inner
            .commit_step_fenced(name, messages, served, dropped, Some(&self.fence(name)?))
    }
    fn journal(&self, name: &str, entry: &JournalEntry) -> StoreResult<()> {
        self.inner
            .journal_fenced(name, entry, Some(&self.fence(name)?))
    }
    fn drop_backlog(&self, name: &str, rows: &[i64]) -> StoreResult<usize> {
        self.inner
            .drop_backlog_fenced(name, rows, Some(&self.fence(name)?))
    }
    fn clear_cell(&self, name: &str) -> StoreResult<bool> {
        self.inner.clear_cell_fenced(name, Some(&self.fence(name)?))
    }
    fn breaker(&self, key: &str) -> StoreResult<Option<BreakerState>> {
        self.inner.breaker(key)
    }
    fn save_breaker(&self, key: &str, state: &BreakerState) -> StoreResult<()> {
        self.inner.save_breaker(key, state)
    }
    fn audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        self.inner.audit(entry)
    }
    fn audit_all(&self, entries: &[AuditEntry]) -> StoreResult<()> {
        self.inner.audit_all(entries)
    }
    fn audit_log(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditEntry>> {
        self.inner.audit_log(filter)
    }
    fn prune_audit(&self, before_ms: u64) -> StoreResult<bool> {
        self.inner.prune_audit(before_ms)
    }
}
