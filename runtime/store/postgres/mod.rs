//! A [`Store`] in PostgreSQL, for state that several colony processes (nodes) share.
//!
//! Selected by a `postgres://` URL (`[store] url` in the config, `--store URL`). Each write is
//! one transaction on a pooled connection ([`deadpool_postgres`]), answered once PostgreSQL has
//! committed it (with the server's default `synchronous_commit = on`, once it is in the server's
//! write-ahead log on disk); the server itself lets concurrent commits share a WAL flush, so
//! there is no group commit here. Values are kept as JSON text, as in the SQLite store, so
//! whatever `serde_json::Value` holds comes back exactly.
//!
//! The [`Store`] API is synchronous. The client's connections live on a small runtime of their
//! own ([`runtime`]); a call enters it and waits for its future on the calling thread (off
//! tokio's workers when it is one of them, [`super::off_worker`]), so the Lua thread's
//! current-thread runtime and a serve worker can both call it. The schema is in [`schema`];
//! errors name the database by its URL without the password ([`address::redact`]).

pub mod address;
pub mod leases;
mod nodes;
mod schema;
mod shared_files;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;

pub use address::{is_postgres, not_postgres, redact, schema_for};
pub use leases::{Fence, FencedStore, Lease};
pub use schema::SCHEMA_VERSION;

use super::off_worker::off_worker;
use super::{AuditEntry, AuditFilter, JournalEntry, SavedResident, Store, StoreError, StoreResult};
use crate::infer::breaker::BreakerState;
use crate::residents::Mail;
use crate::vocab::{FileRef, Message, Part};

/// The most connections one store keeps open.
const POOL_SIZE: usize = 16;
/// How long a call waits for a free connection (all busy, or the server unreachable).
const WAIT_FOR_CONNECTION: Duration = Duration::from_secs(30);

thread_local! {
    /// The store whose `update` function is running on this thread (its address), if any.
    static IN_UPDATE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The runtime the client's connections run on: two threads, shared by every PostgreSQL store
/// of the process, never shut down (a static is not dropped, so no store's end has to find a
/// context where a runtime may be dropped).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("colony-postgres")
            .enable_all()
            .build()
            .expect("the PostgreSQL client's runtime starts")
    })
}

/// A tokio-postgres error with its causes: its `Display` alone says only "db error" or "error
/// connecting to server".
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The PostgreSQL [`Store`].
pub struct PostgresStore {
    /// The URL without its password, for messages.
    shown: String,
    pool: Pool,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.shown)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to the database at `url` and brings its schema up to [`SCHEMA_VERSION`].
    /// [`StoreError::Io`] naming the URL (without its password) when it cannot be reached,
    /// [`StoreError::TooNew`] for a database a newer colony wrote, [`StoreError::Value`] for a
    /// URL that is not one.
    pub fn open(url: &str) -> StoreResult<PostgresStore> {
        PostgresStore::open_in(url, None)
    }

    /// [`PostgresStore::open`] with the tables in `schema` (created if missing) instead of
    /// the URL's default search path: one schema per program ([`address::schema_for`]).
    pub fn open_in(url: &str, schema: Option<&str>) -> StoreResult<PostgresStore> {
        PostgresStore::opening(url, schema, false)
    }

    /// [`PostgresStore::open_in`] for reading what a program stored (`colony conversations
    /// --store URL`): a `schema` the database does not hold is not created but refused, naming
    /// the programs that have state there (a mistyped name read as "nothing stored", and left
    /// an empty schema behind).
    pub fn open_existing_in(url: &str, schema: &str) -> StoreResult<PostgresStore> {
        PostgresStore::opening(url, Some(schema), true)
    }

    fn opening(url: &str, schema: Option<&str>, existing: bool) -> StoreResult<PostgresStore> {
        let shown = redact(url);
        let config = address::config(url, schema)?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                // An idle connection is checked with an empty query before it is handed out: one
                // the server dropped (a restart, a failover, `pg_terminate_backend`) is replaced
                // instead of failing the call. (`Fast` only asks whether the client noticed,
                // which it may not have yet.)
                recycling_method: RecyclingMethod::Verified,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .wait_timeout(Some(WAIT_FOR_CONNECTION))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Io(format!("{shown}: cannot make a connection pool: {e}")))?;
        let store = PostgresStore { shown, pool };
        store.block(async {
            let mut client = store.connection().await?;
            if existing && let Some(schema) = schema {
                schema::exists(&client, &store.shown, schema).await?;
            }
            // A reading command does not upgrade a store the programs of an older colony may
            // be running on (there is no lock: its nodes would then refuse the store as newer).
            let upgrade = !existing;
            schema::migrate(&mut client, &store.shown, schema, upgrade).await
        })?;
        Ok(store)
    }

    /// The URL without its password.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The schema version the database is at (after opening, always [`SCHEMA_VERSION`]).
    pub fn schema_version(&self) -> StoreResult<i32> {
        self.block(async {
            let client = self.connection().await?;
            let row = client
                .query_one("SELECT version FROM colony_schema", &[])
                .await
                .map_err(|e| self.err(e))?;
            Ok(row.get(0))
        })
    }

    /// Runs `f` to its end on this thread, its I/O on the client's runtime.
    fn block<F: Future>(&self, f: F) -> F::Output {
        off_worker(|| {
            let _enter = runtime().enter();
            futures::executor::block_on(f)
        })
    }

    /// A pooled connection; when none can be had, an error naming the database.
    async fn connection(&self) -> StoreResult<deadpool_postgres::Object> {
        use deadpool_postgres::PoolError;
        self.pool.get().await.map_err(|e| {
            use tokio_postgres::error::SqlState;
            let why = match &e {
                PoolError::Backend(e) => describe(e),
                PoolError::Timeout(_) => format!(
                    "no connection within {} s (the server is slow to answer or every \
                     connection is busy)",
                    WAIT_FOR_CONNECTION.as_secs()
                ),
                other => other.to_string(),
            };
            let refused = match &e {
                PoolError::Backend(e) => e.code().is_some_and(|c| {
                    [
                        SqlState::INVALID_PASSWORD,
                        SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                        SqlState::INVALID_CATALOG_NAME,
                    ]
                    .contains(c)
                }),
                _ => false,
            };
            match refused {
                true => StoreError::Refused(format!(
                    "the PostgreSQL store {} refused the login: {why}",
                    self.shown
                )),
                false => StoreError::Io(format!(
                    "cannot reach the PostgreSQL store {}: {why}",
                    self.shown
                )),
            }
        })
    }

    /// Refuses a call from inside this store's own `update` function.
    fn not_in_update(&self) -> StoreResult<()> {
        if IN_UPDATE.with(|c| c.get()) == self as *const _ as usize {
            return Err(StoreError::Value(format!(
                "{}: the store cannot be used from inside an update function",
                self.shown
            )));
        }
        Ok(())
    }

    /// Runs `f` with a connection, as one call of the API.
    fn with<T, F, Fut>(&self, f: F) -> StoreResult<T>
    where
        F: FnOnce(deadpool_postgres::Object) -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        self.not_in_update()?;
        self.block(async {
            let client = self.connection().await?;
            f(client).await
        })
    }

    fn err(&self, e: tokio_postgres::Error) -> StoreError {
        StoreError::Io(format!("{}: {}", self.shown, describe(&e)))
    }

    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> StoreResult<String> {
        serde_json::to_string(value).map_err(|e| {
            StoreError::Value(format!("{}: cannot write a value as JSON: {e}", self.shown))
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
                self.shown
            ))
        })
    }

    /// PostgreSQL's text cannot hold a NUL character: such a name is refused up front, named.
    fn plain(&self, what: &str, text: &str) -> StoreResult<()> {
        if text.contains('\0') {
            return Err(StoreError::Value(format!(
                "{}: the {what} {text:?} holds a NUL character, which PostgreSQL cannot store",
                self.shown
            )));
        }
        Ok(())
    }

    /// A cell's rows, read in one snapshot.
    async fn read_cell(
        &self,
        client: &mut deadpool_postgres::Object,
        name: &str,
    ) -> StoreResult<Option<SavedResident>> {
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(|e| self.err(e))?;
        let e = |e| self.err(e);
        let Some(row) = tx
            .query_opt(
                "SELECT messages, dropped FROM colony_cells WHERE name = $1",
                &[&name],
            )
            .await
            .map_err(e)?
        else {
            return Ok(None);
        };
        let messages: String = row.get(0);
        let dropped: i64 = row.get(1);
        let backlog = tx
            .query(
                "SELECT seq, mail FROM colony_backlog WHERE name = $1 ORDER BY seq",
                &[&name],
            )
            .await
            .map_err(e)?;
        let journal = tx
            .query(
                "SELECT call_id, tool, result, files FROM colony_journal WHERE name = $1 \
                 ORDER BY seq",
                &[&name],
            )
            .await
            .map_err(e)?;
        let mut messages: Vec<Message> =
            self.decode(format_args!("the conversation of {name:?}"), &messages)?;
        let mut backlog = backlog
            .iter()
            .map(|r| {
                let mail = self.decode::<Mail>(format_args!("the backlog of {name:?}"), r.get(1));
                mail.map(|m| Mail {
                    saved: Some(r.get(0)),
                    ..m
                })
            })
            .collect::<StoreResult<Vec<Mail>>>()?;
        let mut journal = journal
            .iter()
            .map(|r| {
                let result: Option<&str> = r.get(2);
                let files: Option<&str> = r.get(3);
                Ok(JournalEntry {
                    call_id: r.get(0),
                    tool: r.get(1),
                    result: result
                        .map(|t| self.decode(format_args!("the journal of {name:?}"), t))
                        .transpose()?,
                    files: files
                        .map(|t| self.decode(format_args!("the journal of {name:?}"), t))
                        .transpose()?
                        .unwrap_or_default(),
                })
            })
            .collect::<StoreResult<Vec<JournalEntry>>>()?;
        let mut refs: Vec<&mut FileRef> = messages
            .iter_mut()
            .flat_map(|m| m.parts.iter_mut())
            .filter_map(|p| match p {
                Part::File(f) => Some(f),
                _ => None,
            })
            .chain(backlog.iter_mut().flat_map(|m| m.files.iter_mut()))
            .chain(journal.iter_mut().flat_map(|e| e.files.iter_mut()))
            .filter(|f| f.data.is_none())
            .collect();
        if !refs.is_empty() {
            let mut wanted: Vec<&str> = refs.iter().map(|f| f.sha256.as_str()).collect();
            wanted.sort_unstable();
            wanted.dedup();
            let rows = tx
                .query(
                    "SELECT sha256, data FROM colony_files WHERE sha256 = ANY($1)",
                    &[&wanted],
                )
                .await
                .map_err(e)?;
            let bytes: HashMap<String, Arc<[u8]>> = rows
                .iter()
                .map(|r| (r.get::<_, String>(0), Arc::from(r.get::<_, &[u8]>(1))))
                .collect();
            for file in refs.iter_mut() {
                file.data = bytes.get(&file.sha256).cloned();
            }
        }
        drop(refs);
        tx.commit().await.map_err(e)?;
        Ok(Some(SavedResident {
            messages,
            backlog,
            dropped: dropped.max(0) as u64,
            journal,
        }))
    }
}

/// Whether any of `texts` holds a NUL character: no such name can have been stored, so a read
/// of one finds nothing (PostgreSQL would refuse the text outright).
fn has_nul(texts: &[&str]) -> bool {
    texts.iter().any(|t| t.contains('\0'))
}

/// Marks `store`'s update function as running on this thread until dropped.
struct UpdateGuard(usize);

impl UpdateGuard {
    fn enter(store: &PostgresStore) -> UpdateGuard {
        UpdateGuard(IN_UPDATE.with(|c| c.replace(store as *const _ as usize)))
    }
}

impl Drop for UpdateGuard {
    fn drop(&mut self) {
        IN_UPDATE.with(|c| c.set(self.0));
    }
}

/// Makes sure the cell `name` has a row (mail and journal entries may come before its first
/// commit).
async fn ensure_cell(
    tx: &deadpool_postgres::Transaction<'_>,
    name: &str,
) -> Result<(), tokio_postgres::Error> {
    let stmt = tx
        .prepare_cached(
            "INSERT INTO colony_cells (name, messages, dropped) VALUES ($1, '[]', 0) \
             ON CONFLICT (name) DO NOTHING",
        )
        .await?;
    tx.execute(&stmt, &[&name]).await?;
    Ok(())
}

/// Stores the bytes of each file that carries them and is not stored yet, in the write's own
/// transaction (a message never refers to bytes that are not committed).
async fn save_files<'a>(
    tx: &deadpool_postgres::Transaction<'_>,
    files: impl Iterator<Item = &'a FileRef>,
) -> Result<(), tokio_postgres::Error> {
    for file in files {
        let Some(data) = &file.data else { continue };
        let known = tx
            .prepare_cached("SELECT 1 FROM colony_files WHERE sha256 = $1")
            .await?;
        // Asked first so a step does not send every attachment's bytes again.
        if tx.query_opt(&known, &[&file.sha256]).await?.is_some() {
            continue;
        }
        let insert = tx
            .prepare_cached(
                "INSERT INTO colony_files (sha256, data) VALUES ($1, $2) \
                 ON CONFLICT (sha256) DO NOTHING",
            )
            .await?;
        let bytes: &[u8] = data;
        tx.execute(&insert, &[&file.sha256, &bytes]).await?;
    }
    Ok(())
}

/// Runs one statement in its own transaction-less call; the number of rows it touched.
async fn exec(
    client: &deadpool_postgres::Object,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, tokio_postgres::Error> {
    let stmt = client.prepare_cached(sql).await?;
    client.execute(&stmt, params).await
}

/// The writes to a cell, through a lease's fence when one is given ([`leases`]).
impl PostgresStore {
    pub(crate) fn push_backlog_fenced(
        &self,
        name: &str,
        mail: &Mail,
        fence: Option<&Fence>,
    ) -> StoreResult<Option<i64>> {
        self.plain("resident name", name)?;
        let text = self.encode(mail)?;
        self.with(|mut client| async move {
            let e = |e| self.err(e);
            let tx = client.transaction().await.map_err(e)?;
            self.check_fence(&tx, name, fence).await?;
            if let Some(id) = &mail.id {
                let stmt = tx
                    .prepare_cached(
                        "INSERT INTO colony_accepted (name, id) VALUES ($1, $2) \
                         ON CONFLICT (name, id) DO NOTHING",
                    )
                    .await
                    .map_err(e)?;
                if tx.execute(&stmt, &[&name, id]).await.map_err(e)? == 0 {
                    return Ok(None);
                }
            }
            ensure_cell(&tx, name).await.map_err(e)?;
            save_files(&tx, mail.files.iter()).await.map_err(e)?;
            let stmt = tx
                .prepare_cached(
                    "INSERT INTO colony_backlog (name, mail) VALUES ($1, $2) RETURNING seq",
                )
                .await
                .map_err(e)?;
            let row: i64 = tx
                .query_one(&stmt, &[&name, &text])
                .await
                .map_err(e)?
                .get(0);
            tx.commit().await.map_err(e)?;
            Ok(Some(row))
        })
    }

    pub(crate) fn commit_step_fenced(
        &self,
        name: &str,
        messages: &[Message],
        served: &[i64],
        dropped: u64,
        fence: Option<&Fence>,
    ) -> StoreResult<()> {
        self.plain("resident name", name)?;
        let text = self.encode(messages)?;
        let dropped = i64::try_from(dropped).unwrap_or(i64::MAX);
        self.with(|mut client| async move {
            let e = |e| self.err(e);
            let tx = client.transaction().await.map_err(e)?;
            self.check_fence(&tx, name, fence).await?;
            save_files(&tx, messages.iter().flat_map(Message::files))
                .await
                .map_err(e)?;
            let stmt = tx
                .prepare_cached(
                    "INSERT INTO colony_cells (name, messages, dropped) VALUES ($1, $2, $3) \
                     ON CONFLICT (name) DO UPDATE SET messages = excluded.messages, \
                                                      dropped = excluded.dropped",
                )
                .await
                .map_err(e)?;
            tx.execute(&stmt, &[&name, &text, &dropped])
                .await
                .map_err(e)?;
            if !served.is_empty() {
                let stmt = tx
                    .prepare_cached("DELETE FROM colony_backlog WHERE name = $1 AND seq = ANY($2)")
                    .await
                    .map_err(e)?;
                tx.execute(&stmt, &[&name, &served]).await.map_err(e)?;
            }
            let stmt = tx
                .prepare_cached("DELETE FROM colony_journal WHERE name = $1")
                .await
                .map_err(e)?;
            tx.execute(&stmt, &[&name]).await.map_err(e)?;
            tx.commit().await.map_err(e)?;
            Ok(())
        })
    }

    pub(crate) fn journal_fenced(
        &self,
        name: &str,
        entry: &JournalEntry,
        fence: Option<&Fence>,
    ) -> StoreResult<()> {
        self.plain("resident name", name)?;
        let result = entry.result.as_ref().map(|r| self.encode(r)).transpose()?;
        let files = (!entry.files.is_empty())
            .then(|| self.encode(&entry.files))
            .transpose()?;
        self.with(|mut client| async move {
            let e = |e| self.err(e);
            let tx = client.transaction().await.map_err(e)?;
            self.check_fence(&tx, name, fence).await?;
            ensure_cell(&tx, name).await.map_err(e)?;
            save_files(&tx, entry.files.iter()).await.map_err(e)?;
            let stmt = tx
                .prepare_cached(
                    "INSERT INTO colony_journal (name, call_id, tool, result, files) \
                     VALUES ($1, $2, $3, $4, $5) \
                     ON CONFLICT (name, call_id) DO UPDATE SET tool = excluded.tool, \
                         result = excluded.result, files = excluded.files",
                )
                .await
                .map_err(e)?;
            tx.execute(
                &stmt,
                &[&name, &entry.call_id, &entry.tool, &result, &files],
            )
            .await
            .map_err(e)?;
            tx.commit().await.map_err(e)?;
            Ok(())
        })
    }

    /// [`Store::drop_backlog`]; with a fence, only while it holds. (The bytes of the mails'
    /// attachments are kept, as a clear keeps them here: see the README.)
    pub(crate) fn drop_backlog_fenced(
        &self,
        name: &str,
        rows: &[i64],
        fence: Option<&Fence>,
    ) -> StoreResult<usize> {
        if has_nul(&[name]) || rows.is_empty() {
            return Ok(0);
        }
        self.with(|mut client| async move {
            let e = |e| self.err(e);
            let tx = client.transaction().await.map_err(e)?;
            self.check_fence(&tx, name, fence).await?;
            let removed = tx
                .execute(
                    "DELETE FROM colony_backlog WHERE name = $1 AND seq = ANY($2)",
                    &[&name, &rows],
                )
                .await
                .map_err(e)?;
            tx.commit().await.map_err(e)?;
            Ok(removed as usize)
        })
    }

    pub(crate) fn clear_cell_fenced(&self, name: &str, fence: Option<&Fence>) -> StoreResult<bool> {
        if has_nul(&[name]) {
            return Ok(false);
        }
        self.with(|mut client| async move {
            let e = |e| self.err(e);
            let tx = client.transaction().await.map_err(e)?;
            self.check_fence(&tx, name, fence).await?;
            let mut removed = 0;
            for table in ["colony_cells", "colony_backlog", "colony_journal"] {
                removed += tx
                    .execute(&format!("DELETE FROM {table} WHERE name = $1"), &[&name])
                    .await
                    .map_err(e)?;
            }
            tx.execute("DELETE FROM colony_accepted WHERE name = $1", &[&name])
                .await
                .map_err(e)?;
            tx.commit().await.map_err(e)?;
            Ok(removed > 0)
        })
    }
}

impl Store for PostgresStore {
    fn get(&self, space: &str, key: &str) -> StoreResult<Option<Value>> {
        if has_nul(&[space, key]) {
            return Ok(None);
        }
        let text: Option<String> = self.with(|client| async move {
            let stmt = client
                .prepare_cached("SELECT value FROM colony_kv WHERE space = $1 AND key = $2")
                .await
                .map_err(|e| self.err(e))?;
            let row = client
                .query_opt(&stmt, &[&space, &key])
                .await
                .map_err(|e| self.err(e))?;
            Ok(row.map(|r| r.get(0)))
        })?;
        text.map(|t| self.decode(format_args!("the value of {key:?}"), &t))
            .transpose()
    }

    fn set(&self, space: &str, key: &str, value: &Value) -> StoreResult<()> {
        self.plain("workspace", space)?;
        self.plain("key", key)?;
        let text = self.encode(value)?;
        self.with(|client| async move {
            exec(
                &client,
                "INSERT INTO colony_kv (space, key, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (space, key) DO UPDATE SET value = excluded.value",
                &[&space, &key, &text],
            )
            .await
            .map_err(|e| self.err(e))?;
            Ok(())
        })
    }

    fn delete(&self, space: &str, key: &str) -> StoreResult<bool> {
        if has_nul(&[space, key]) {
            return Ok(false);
        }
        self.with(|client| async move {
            let n = exec(
                &client,
                "DELETE FROM colony_kv WHERE space = $1 AND key = $2",
                &[&space, &key],
            )
            .await
            .map_err(|e| self.err(e))?;
            Ok(n > 0)
        })
    }

    fn list(&self, space: &str, prefix: &str) -> StoreResult<Vec<String>> {
        if has_nul(&[space, prefix]) {
            return Ok(Vec::new());
        }
        self.with(|client| async move {
            // A range on the key (collation "C": byte order), not LIKE: `%` and `_` in a
            // prefix are plain characters. `starts_with` is PostgreSQL's prefix test.
            let stmt = client
                .prepare_cached(
                    "SELECT key FROM colony_kv WHERE space = $1 AND key >= $2 \
                     AND starts_with(key, $2) ORDER BY key",
                )
                .await
                .map_err(|e| self.err(e))?;
            let rows = client
                .query(&stmt, &[&space, &prefix])
                .await
                .map_err(|e| self.err(e))?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    fn update(
        &self,
        space: &str,
        key: &str,
        f: &mut dyn FnMut(Option<Value>) -> Result<Option<Value>, String>,
    ) -> StoreResult<Option<Value>> {
        self.plain("workspace", space)?;
        self.plain("key", key)?;
        self.with(|mut client| async move {
            let e = |e| self.err(e);
            let tx = client.transaction().await.map_err(e)?;
            let select = "SELECT value FROM colony_kv WHERE space = $1 AND key = $2 FOR UPDATE";
            let mut row = tx.query_opt(select, &[&space, &key]).await.map_err(e)?;
            if row.is_none() {
                // No row to lock: insert a placeholder (never committed: the update or delete
                // below replaces it), so a concurrent `set` or `update` of the key waits for
                // this transaction instead of landing between the read and the write. If
                // another transaction inserted the key meanwhile, this waits for it and reads
                // what it committed.
                let inserted = tx
                    .execute(
                        "INSERT INTO colony_kv (space, key, value) VALUES ($1, $2, 'null') \
                         ON CONFLICT (space, key) DO NOTHING",
                        &[&space, &key],
                    )
                    .await
                    .map_err(e)?;
                if inserted == 0 {
                    row = tx.query_opt(select, &[&space, &key]).await.map_err(e)?;
                }
            }
            let current = row
                .map(|r| self.decode::<Value>(format_args!("the value of {key:?}"), r.get(0)))
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
                        "UPDATE colony_kv SET value = $3 WHERE space = $1 AND key = $2",
                        &[&space, &key, &text],
                    )
                    .await
                    .map_err(e)?;
                }
                None => {
                    tx.execute(
                        "DELETE FROM colony_kv WHERE space = $1 AND key = $2",
                        &[&space, &key],
                    )
                    .await
                    .map_err(e)?;
                }
            }
            tx.commit().await.map_err(e)?;
            Ok(new)
        })
    }

    fn conversations(&self) -> StoreResult<Vec<String>> {
        self.with(|client| async move {
            let rows = client
                .query("SELECT name FROM colony_cells ORDER BY name", &[])
                .await
                .map_err(|e| self.err(e))?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    fn load_cell(&self, name: &str) -> StoreResult<Option<SavedResident>> {
        if has_nul(&[name]) {
            return Ok(None);
        }
        self.with(|mut client| async move { self.read_cell(&mut client, name).await })
    }

    fn push_backlog(&self, name: &str, mail: &Mail) -> StoreResult<Option<i64>> {
        self.push_backlog_fenced(name, mail, None)
    }

    fn commit_step(
        &self,
        name: &str,
        messages: &[Message],
        served: &[i64],
        dropped: u64,
    ) -> StoreResult<()> {
        self.commit_step_fenced(name, messages, served, dropped, None)
    }

    fn journal(&self, name: &str, entry: &JournalEntry) -> StoreResult<()> {
        self.journal_fenced(name, entry, None)
    }

    fn drop_backlog(&self, name: &str, rows: &[i64]) -> StoreResult<usize> {
        self.drop_backlog_fenced(name, rows, None)
    }
    fn clear_cell(&self, name: &str) -> StoreResult<bool> {
        self.clear_cell_fenced(name, None)
    }
    fn breaker(&self, key: &str) -> StoreResult<Option<BreakerState>> {
        if has_nul(&[key]) {
            return Ok(None);
        }
        let text: Option<String> = self.with(|client| async move {
            let row = client
                .query_opt("SELECT state FROM colony_breakers WHERE key = $1", &[&key])
                .await
                .map_err(|e| self.err(e))?;
            Ok(row.map(|r| r.get(0)))
        })?;
        text.map(|t| self.decode(format_args!("the breaker state {key:?}"), &t))
            .transpose()
    }

    fn save_breaker(&self, key: &str, state: &BreakerState) -> StoreResult<()> {
        self.plain("breaker key", key)?;
        let text = self.encode(state)?;
        self.with(|client| async move {
            exec(
                &client,
                "INSERT INTO colony_breakers (key, state) VALUES ($1, $2) \
                 ON CONFLICT (key) DO UPDATE SET state = excluded.state",
                &[&key, &text],
            )
            .await
            .map_err(|e| self.err(e))?;
            Ok(())
        })
    }

    fn audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        let at_ms = i64::try_from(entry.at_ms).unwrap_or(i64::MAX);
        // Text PostgreSQL cannot hold (a NUL) is shown escaped rather than losing the line.
        let clean = |s: &str| s.replace('\0', "\\u0000");
        let (resident, tool) = (clean(&entry.resident), clean(&entry.tool));
        let message = entry.message.as_deref().map(clean);
        self.with(|client| async move {
            exec(
                &client,
                "INSERT INTO colony_audit \
                     (at_ms, resident, tool, args_hash, duration_ms, outcome, message) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &at_ms,
                    &resident,
                    &tool,
                    &entry.args_hash,
                    &entry.duration_ms,
                    &entry.outcome,
                    &message,
                ],
            )
            .await
            .map_err(|e| self.err(e))?;
            Ok(())
        })
    }

    fn prune_audit(&self, before_ms: u64) -> StoreResult<bool> {
        let before_ms = i64::try_from(before_ms).unwrap_or(i64::MAX);
        let batch = i64::from(super::PRUNE_BATCH);
        self.with(|client| async move {
            // Among the oldest lines only: a log with nothing to remove is not scanned whole.
            let removed = exec(
                &client,
                "DELETE FROM colony_audit WHERE id IN \
                     (SELECT id FROM colony_audit ORDER BY id LIMIT $2) \
                 AND at_ms < $1",
                &[&before_ms, &batch],
            )
            .await
            .map_err(|e| self.err(e))?;
            Ok(removed > 0)
        })
    }

    fn audit_log(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditEntry>> {
        self.with(|client| async move {
            let rows = client
                .query(
                    "SELECT at_ms, resident, tool, args_hash, duration_ms, outcome, message \
                     FROM colony_audit \
                     WHERE ($1::text IS NULL OR resident = $1) AND ($2::text IS NULL OR tool = $2) \
                     ORDER BY id",
                    &[&filter.resident, &filter.tool],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(rows
                .iter()
                .map(|r| AuditEntry {
                    at_ms: r.get::<_, i64>(0).max(0) as u64,
                    resident: r.get(1),
                    tool: r.get(2),
                    args_hash: r.get(3),
                    duration_ms: r.get(4),
                    outcome: r.get(5),
                    message: r.get(6),
                })
                .collect())
        })
    }
}
