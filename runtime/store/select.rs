//! Which store a program's state goes to: SQLite in its state directory (the default), or the
//! PostgreSQL database a `postgres://` URL names (`--store URL`, else `[store] url` in the
//! config), shared by every node that is given the same URL.

use std::path::Path;
use std::sync::Arc;

use super::postgres::{PostgresStore, schema_for};
use super::state_dir::StateDir;
use super::{Store, StoreResult};

/// An opened program store.
#[derive(Debug)]
pub enum ProgramStore {
    /// SQLite in a state directory, locked by this process while it is open.
    Dir(StateDir),
    /// A PostgreSQL database (no lock: several processes share it).
    Postgres(Arc<PostgresStore>),
}

impl ProgramStore {
    /// Opens the PostgreSQL store at `url` when there is one (the tables of `script`'s program
    /// in a schema of their own, [`schema_for`]), else the state directory `dir` (creating it,
    /// and locking it).
    pub fn open(dir: &Path, url: Option<&str>, script: &Path) -> StoreResult<ProgramStore> {
        match url {
            Some(url) => Ok(ProgramStore::Postgres(Arc::new(PostgresStore::open_in(
                url,
                Some(&schema_for(script)),
            )?))),
            None => StateDir::open(dir).map(ProgramStore::Dir),
        }
    }

    /// The PostgreSQL store at `url` holding `script`'s program, for reading what it stored:
    /// an error, creating nothing, when it holds no state of that program.
    pub fn open_existing(url: &str, script: &Path) -> StoreResult<ProgramStore> {
        PostgresStore::open_existing_in(url, &schema_for(script))
            .map(|store| ProgramStore::Postgres(Arc::new(store)))
    }

    /// The store as the trait object the residents use.
    pub fn dyn_store(&self) -> Arc<dyn Store> {
        match self {
            ProgramStore::Dir(dir) => dir.dyn_store(),
            ProgramStore::Postgres(store) => store.clone(),
        }
    }

    /// Where it is, for messages: the directory, or the URL without its password.
    pub fn place(&self) -> String {
        match self {
            ProgramStore::Dir(dir) => dir.path().display().to_string(),
            ProgramStore::Postgres(store) => store.shown().to_string(),
        }
    }
}

/// The store URL in force: `flag` (`--store`), else the config's `[store] url`.
pub fn url(flag: Option<&str>, config: &crate::config::Config) -> Option<String> {
    flag.map(str::to_string)
        .or_else(|| config.store.as_ref().and_then(|s| s.url.clone()))
        .filter(|u| !u.trim().is_empty())
}
