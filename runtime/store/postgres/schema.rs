//! The PostgreSQL store's schema and the versioned steps that bring a database to it.
//!
//! Every table is prefixed `colony_`, so a database that holds other tables can host a store
//! beside them. The version is the one row of `colony_schema`; opening takes a transaction-level
//! advisory lock first, so nodes starting together migrate one after the other, and refuses a
//! database a newer colony wrote ([`StoreError::TooNew`]), leaving it untouched. Keys and names
//! use the `"C"` collation: listing and ordering are by bytes, as in the SQLite store.

use super::super::{StoreError, StoreResult};

/// The schema version this build writes: the number of [`MIGRATIONS`].
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// The advisory lock key opening holds while it reads and migrates the schema ("Coln").
const MIGRATION_LOCK: i64 = 0x436f_6c6e;

/// One step per version: `MIGRATIONS[i]` takes a database from version `i` to `i + 1`. Append
/// only; never edit a released step.
const MIGRATIONS: &[&str] = &[
    // 1: everything the SQLite store holds at its version 4.
    r#"CREATE TABLE colony_kv (
         space TEXT COLLATE "C" NOT NULL,
         key   TEXT COLLATE "C" NOT NULL,
         value TEXT NOT NULL,
         PRIMARY KEY (space, key)
     );
     CREATE TABLE colony_cells (
         name     TEXT COLLATE "C" PRIMARY KEY,
         messages TEXT NOT NULL,
         dropped  BIGINT NOT NULL DEFAULT 0
     );
     CREATE TABLE colony_backlog (
         seq  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
         name TEXT COLLATE "C" NOT NULL,
         mail TEXT NOT NULL
     );
     CREATE INDEX colony_backlog_by_name ON colony_backlog (name, seq);
     CREATE TABLE colony_journal (
         seq     BIGINT GENERATED ALWAYS AS IDENTITY,
         name    TEXT COLLATE "C" NOT NULL,
         call_id TEXT NOT NULL,
         tool    TEXT NOT NULL,
         result  TEXT,
         files   TEXT,
         PRIMARY KEY (name, call_id)
     );
     CREATE TABLE colony_accepted (
         name TEXT COLLATE "C" NOT NULL,
         id   TEXT NOT NULL,
         PRIMARY KEY (name, id)
     );
     CREATE TABLE colony_files (
         sha256 TEXT PRIMARY KEY,
         data   BYTEA NOT NULL
     );
     CREATE TABLE colony_breakers (
         key   TEXT PRIMARY KEY,
         state TEXT NOT NULL
     );
     CREATE TABLE colony_audit (
         id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
         at_ms       BIGINT NOT NULL,
         resident    TEXT NOT NULL,
         tool        TEXT NOT NULL,
         args_hash   TEXT NOT NULL,
         duration_ms DOUBLE PRECISION NOT NULL,
         outcome     TEXT NOT NULL,
         message     TEXT
     );
     CREATE INDEX colony_audit_by_resident ON colony_audit (resident, id);
     CREATE INDEX colony_audit_by_tool ON colony_audit (tool, id);"#,
    // 2: leases (placement): who owns what until when, and the fencing token of that ownership.
    r#"CREATE TABLE colony_leases (
         name       TEXT COLLATE "C" PRIMARY KEY,
         owner      TEXT NOT NULL,
         token      BIGINT NOT NULL,
         expires_at TIMESTAMPTZ NOT NULL
     );
     CREATE SEQUENCE colony_lease_tokens;"#,
    // 3: the nodes of a cluster, each alive until its heartbeat's expiry.
    r#"CREATE TABLE colony_nodes (
         node       TEXT COLLATE "C" PRIMARY KEY,
         expires_at TIMESTAMPTZ NOT NULL
     );"#,
    // 4: which process beats each node's heart, so a second process given the same name is
    // refused instead of taking the first one's leases as its own.
    r#"ALTER TABLE colony_nodes ADD COLUMN instance TEXT NOT NULL DEFAULT '';"#,
    // 5: the program's identity in this database, which names its mail stream (two clusters
    // with a program of the same name on one NATS server read each other's mail).
    r#"CREATE TABLE colony_identity (id TEXT NOT NULL);
     INSERT INTO colony_identity (id) SELECT md5(random()::text || clock_timestamp()::text);"#,
];

/// `Ok` when the database behind `client` holds the program schema `schema`; else an error
/// naming the programs whose schemas it holds.
pub(super) async fn exists(
    client: &tokio_postgres::Client,
    shown: &str,
    schema: &str,
) -> StoreResult<()> {
    let rows = client
        .query(
            "SELECT nspname::text FROM pg_namespace WHERE starts_with(nspname, 'colony_') \
             ORDER BY 1",
            &[],
        )
        .await
        .map_err(|e| {
            StoreError::Io(format!(
                "{shown}: cannot list its schemas: {}",
                super::describe(&e)
            ))
        })?;
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    if names.iter().any(|n| n == schema) {
        return Ok(());
    }
    // Only schemas that hold something: the reading commands of older colonies made an empty
    // one for every name they were given, which are no programs.
    let mut programs: Vec<&str> = Vec::new();
    for name in &names {
        let quoted = name.replace('"', "\"\"");
        let held = format!(
            "SELECT EXISTS (SELECT 1 FROM \"{quoted}\".colony_kv) \
                 OR EXISTS (SELECT 1 FROM \"{quoted}\".colony_cells) \
                 OR EXISTS (SELECT 1 FROM \"{quoted}\".colony_audit)"
        );
        // A schema without those tables is not a store colony wrote.
        let holds = client
            .query_one(&held, &[])
            .await
            .is_ok_and(|r| r.get::<_, bool>(0));
        if holds && let Some(program) = name.strip_prefix("colony_") {
            programs.push(program);
        }
    }
    let there = if programs.is_empty() {
        "it holds no program's state".to_string()
    } else {
        format!("the programs with state there: {}", programs.join(", "))
    };
    Err(StoreError::Io(format!(
        "{shown} holds no state of this program (no schema {schema}: it has not run with this \
         store, or its file is named otherwise; {there})"
    )))
}

/// Brings the database behind `client` (its tables in `schema`, created if missing, when one is
/// given) to [`SCHEMA_VERSION`]; `shown` names it in errors. Without `upgrade`, a store at an
/// older version is refused, left as it is.
pub(super) async fn migrate(
    client: &mut tokio_postgres::Client,
    shown: &str,
    schema: Option<&str>,
    upgrade: bool,
) -> StoreResult<()> {
    let err = |doing: &str, e: tokio_postgres::Error| {
        StoreError::Io(format!("{shown}: {doing}: {}", super::describe(&e)))
    };
    let tx = client
        .transaction()
        .await
        .map_err(|e| err("cannot open a transaction", e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| err("cannot take the schema lock", e))?;
    if let Some(schema) = schema {
        // A name `schema_for` made: letters, digits and `_` only, so quoting is enough.
        tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
            .await
            .map_err(|e| err(&format!("cannot create the schema {schema}"), e))?;
    }
    let has_schema: bool = tx
        .query_one("SELECT to_regclass('colony_schema') IS NOT NULL", &[])
        .await
        .map_err(|e| err("cannot read its schema", e))?
        .get(0);
    let version: i32 = if has_schema {
        let rows = tx
            .query("SELECT version FROM colony_schema", &[])
            .await
            .map_err(|e| err("cannot read its schema version", e))?;
        match rows.as_slice() {
            [row] => row.get(0),
            _ => {
                return Err(StoreError::Damaged(format!(
                    "{shown}: colony_schema holds {} rows instead of one; the database was left \
                     as it is",
                    rows.len()
                )));
            }
        }
    } else {
        let kv: bool = tx
            .query_one("SELECT to_regclass('colony_kv') IS NOT NULL", &[])
            .await
            .map_err(|e| err("cannot read its schema", e))?
            .get(0);
        if kv {
            return Err(StoreError::Damaged(format!(
                "{shown} holds colony tables without colony_schema: not a store colony wrote; \
                 it was left as it is"
            )));
        }
        // A schema made by hand (or by an older reading command), empty: no program's state,
        // not "an older colony's store at version 0".
        if !upgrade {
            return Err(StoreError::Io(format!(
                "{shown} holds no state of this program (its schema{} is empty: the program has \
                 not run with this store)",
                schema.map(|s| format!(" {s}")).unwrap_or_default()
            )));
        }
        tx.batch_execute(
            "CREATE TABLE colony_schema (version INTEGER NOT NULL);
             INSERT INTO colony_schema (version) VALUES (0);",
        )
        .await
        .map_err(|e| err("cannot create colony_schema", e))?;
        0
    };
    if version > SCHEMA_VERSION {
        return Err(StoreError::TooNew(format!(
            "{shown} was written by a newer colony (store schema version {version}; this colony \
             knows versions up to {SCHEMA_VERSION}); it was left as it is: run it with that \
             newer colony"
        )));
    }
    if version < 0 {
        return Err(StoreError::Damaged(format!(
            "{shown} has an impossible schema version {version}; it was left as it is"
        )));
    }
    if !upgrade && version < SCHEMA_VERSION {
        return Err(StoreError::TooOld(format!(
            "{shown} was written by an older colony (store schema version {version}; this \
             colony writes version {SCHEMA_VERSION}); reading it here would upgrade it under the \
             programs of that colony that may run on it, so it was left as it is: read it with \
             that colony, or run the program with this one first (which upgrades it)"
        )));
    }
    for (i, step) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let to = i as i32 + 1;
        let what = format!("cannot bring its schema to version {to}");
        tx.batch_execute(step).await.map_err(|e| err(&what, e))?;
        tx.execute("UPDATE colony_schema SET version = $1", &[&to])
            .await
            .map_err(|e| err(&what, e))?;
    }
    tx.commit()
        .await
        .map_err(|e| err("cannot commit its schema", e))
}
