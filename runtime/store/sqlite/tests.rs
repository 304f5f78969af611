use std::sync::Arc;

use serde_json::json;

use super::open::BUSY_TIMEOUT;
use super::*;
use crate::infer::breaker::BreakerStatus;
use crate::vocab::{Part, Role, ToolCall, ToolResult};

fn fresh() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
    (dir, store)
}

fn mail(content: &str) -> Mail {
    Mail::new("alice", "bob", content, 0)
}

/// Runs `sql` on the store's writing connection (a test's trigger, say).
fn on_writer(store: &SqliteStore, sql: &str) {
    store.write.lock().unwrap().execute_batch(sql).unwrap();
}

/// Applies `writes` as one batch on the store's writing connection.
fn batch(store: &SqliteStore, writes: &[Write]) -> Vec<StoreResult<Done>> {
    writes::apply_batch(&mut store.write.lock().unwrap(), writes, &|e| store.err(e))
}

/// Overwrites the root page of `table` in the closed store at `path` with garbage; answers the
/// file's bytes as written and its page size.
fn scribble_root(path: &std::path::Path, table: &str) -> (Vec<u8>, usize) {
    let root: i64 = Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT rootpage FROM sqlite_schema WHERE name = ?1",
            [table],
            |r| r.get(0),
        )
        .unwrap();
    let mut bytes = std::fs::read(path).unwrap();
    let page = u16::from_be_bytes([bytes[16], bytes[17]]) as usize;
    let at = (root as usize - 1) * page;
    for b in &mut bytes[at..at + page] {
        *b = 0xA5;
    }
    std::fs::write(path, &bytes).unwrap();
    (bytes, page)
}

/// The `n`th of a script's audit lines, each with its own arguments' hash.
fn audit_line(n: u64) -> AuditEntry {
    AuditEntry {
        at_ms: n,
        resident: "script".into(),
        tool: "add".into(),
        args_hash: format!("{n:064x}"),
        duration_ms: 1.0,
        outcome: "ok".into(),
        message: None,
    }
}

fn result(call_id: &str, content: &str) -> ToolResult {
    ToolResult {
        call_id: call_id.into(),
        name: "read".into(),
        content: content.into(),
        is_error: false,
    }
}

#[test]
fn values_round_trip_exactly() {
    let (_dir, store) = fresh();
    let values = [
        json!(null),
        json!(true),
        json!(0),
        json!(-1),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(1.0),
        json!(0.1 + 0.2),
        json!(1e-300),
        json!(f64::MAX),
        json!(5e-324),
        json!(-0.0),
        json!("héllo ✓ 🐝 \u{0} \"quoted\" \\ \n"),
        json!({}),
        json!([]),
        json!({"a": [], "b": {}, "c": [1, 2.5, "x", {"d": null}], "é": {"z": 1, "a": 2}}),
    ];
    for (i, v) in values.iter().enumerate() {
        let key = format!("k{i}");
        store.set("", &key, v).unwrap();
        let back = store.get("", &key).unwrap().unwrap();
        assert_eq!(&back, v, "value {i}");
        // Same variant, not merely equal: integers stay integers, floats stay floats.
        assert_eq!(back.to_string(), v.to_string(), "value {i}");
        if let (Some(a), Some(b)) = (back.as_f64(), v.as_f64()) {
            assert_eq!(a.to_bits(), b.to_bits(), "value {i}");
        }
    }
    assert!(store.get("", "k1").unwrap().unwrap().is_boolean());
    assert!(store.get("", "k6").unwrap().unwrap().is_f64());
    assert!(store.get("", "k2").unwrap().unwrap().is_i64());
    assert!(store.get("", "k13").unwrap().unwrap().is_object());
    assert!(store.get("", "k14").unwrap().unwrap().is_array());
    assert_eq!(store.get("", "missing").unwrap(), None);
}

#[test]
fn arbitrary_floats_round_trip_bit_for_bit() {
    let (_dir, store) = fresh();
    // A xorshift walk over bit patterns: every finite f64 must come back identical.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let floats: Vec<f64> = std::iter::from_fn(|| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        Some(f64::from_bits(x))
    })
    .filter(|f| f.is_finite())
    .take(2000)
    .collect();
    let value = Value::Array(floats.iter().map(|f| json!(f)).collect());
    store.set("", "floats", &value).unwrap();
    let back = store.get("", "floats").unwrap().unwrap();
    for (a, b) in back.as_array().unwrap().iter().zip(&floats) {
        assert_eq!(a.as_f64().unwrap().to_bits(), b.to_bits(), "{b:e}");
    }
}

/// Starting the log writes its header and a page ahead of the first write and changes nothing
/// a reader sees; a log that has frames already is left as it is.
#[test]
fn starting_the_log_writes_its_header_and_changes_nothing() {
    let (dir, store) = fresh();
    let wal = dir.path().join("store.sqlite3-wal");
    let log = || std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert_eq!(log(), 0, "a store just opened has an empty log");
    start_log(&store.write, &store.path).unwrap();
    let started = log();
    assert!(started > 32, "the header and a frame: {started} bytes");
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    store.set("", "k", &json!(1)).unwrap();
    let written = log();
    assert!(written > started, "{written} bytes after a write");
    start_log(&store.write, &store.path).unwrap();
    assert_eq!(log(), written, "a log with frames is left alone");
    assert_eq!(store.get("", "k").unwrap(), Some(json!(1)));
    drop(store);
    let reopened = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
    assert_eq!(reopened.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(reopened.get("", "k").unwrap(), Some(json!(1)));
}

/// `prepare_writes` starts the log on a thread of its own, once for the store's life; closing
/// the store waits for that thread (it holds the writing connection), then closes as always.
#[test]
fn writes_are_prepared_for_once_and_the_close_waits_for_it() {
    let (dir, store) = fresh();
    let wal = dir.path().join("store.sqlite3-wal");
    let log = || std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    store.prepare_writes();
    store.join_log_starter();
    let started = log();
    assert!(started > 0, "the log is started");
    store.prepare_writes();
    assert!(
        store.log_starter.lock().unwrap().is_none(),
        "a second call starts nothing"
    );
    assert_eq!(log(), started);
    // Dropped at once, its starter still writing and syncing the log: the close waits for it
    // (else the starter's connection, closing last, would remove the log after `drop`).
    let (dir, store) = fresh();
    store.prepare_writes();
    drop(store);
    assert!(!dir.path().join("store.sqlite3-wal").exists());
    let reopened = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
    assert_eq!(reopened.schema_version().unwrap(), SCHEMA_VERSION);
}

#[test]
fn opens_in_wal_mode_with_full_sync() {
    let (_dir, store) = fresh();
    let conn = store.writer().unwrap();
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let sync: i64 = conn
        .pragma_query_value(None, "synchronous", |r| r.get(0))
        .unwrap();
    assert_eq!(sync, 2, "FULL");
    let timeout: i64 = conn
        .pragma_query_value(None, "busy_timeout", |r| r.get(0))
        .unwrap();
    assert_eq!(timeout, BUSY_TIMEOUT.as_millis() as i64);
    let app: i32 = conn
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .unwrap();
    assert_eq!(app, APPLICATION_ID);
}

/// A new store is whole in its own file from the start: the schema is not waiting in the WAL
/// for a checkpoint, so the file alone (copied while colony runs) is a store at this version.
#[test]
fn a_new_store_holds_its_schema_in_its_own_file() {
    let (dir, store) = fresh();
    let copy = dir.path().join("copy.sqlite3");
    std::fs::copy(dir.path().join("store.sqlite3"), &copy).unwrap();
    let conn = Connection::open(&copy).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(store);
}

/// Every table, column and index of the store at `conn`, one line each, in a stable order.
fn shape(conn: &Connection) -> Vec<String> {
    let rows = |sql: &str| -> Vec<String> {
        let mut stmt = conn.prepare(sql).unwrap();
        let n = stmt.column_count();
        let mut lines: Vec<String> = stmt
            .query_map([], |r| {
                (0..n)
                    .map(|i| {
                        r.get::<_, rusqlite::types::Value>(i)
                            .map(|v| format!("{v:?}"))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(|v| v.join(" "))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        lines.sort();
        lines
    };
    let names = |sql: &str| -> Vec<String> {
        let mut stmt = conn.prepare(sql).unwrap();
        let mut names: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        names.sort();
        names
    };
    let mut shape = Vec::new();
    for t in names("SELECT name FROM pragma_table_list WHERE schema = 'main'") {
        shape.extend(rows(&format!(
            "SELECT 'table', name, type, ncol, wr, strict FROM pragma_table_list('{t}') \
             WHERE schema = 'main'"
        )));
        shape.extend(rows(&format!(
            "SELECT '{t} column', * FROM pragma_table_xinfo('{t}')"
        )));
        for i in names(&format!("SELECT name FROM pragma_index_list('{t}')")) {
            shape.extend(rows(&format!(
                "SELECT '{t} index', name, \"unique\", origin, partial FROM \
                 pragma_index_list('{t}') WHERE name = '{i}'"
            )));
            shape.extend(rows(&format!(
                "SELECT '{i} key', * FROM pragma_index_xinfo('{i}')"
            )));
        }
    }
    shape
}

/// A new store is written from the bytes of `EMPTY_STORE`; a store an older colony made reaches
/// the same version through `MIGRATIONS`. The two must be the same store: every table, column,
/// key and index alike.
#[test]
fn a_new_store_has_the_schema_the_migrations_build() {
    let dir = tempfile::tempdir().unwrap();
    let migrated = super::open::create_at_version(&dir.path().join("old.sqlite3"), SCHEMA_VERSION);
    let (_fresh_dir, fresh) = fresh();
    let built = shape(&fresh.writer().unwrap());
    assert!(built.len() > 40, "{built:#?}");
    assert_eq!(built, shape(&migrated));
}

/// `EMPTY_STORE`, the file a new store is, must be what this colony's `MIGRATIONS` build (less
/// the SQLite version that wrote it, bytes 92 to 99 of the header). A step added to
/// `MIGRATIONS` fails here until the file is written anew, which
/// `COLONY_WRITE_EMPTY_STORE=1 cargo test --lib empty_store` does.
#[test]
fn the_empty_store_is_what_the_migrations_build() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(file!())
        .with_file_name("empty_store.sqlite3");
    let dir = tempfile::tempdir().unwrap();
    let built = super::open::empty_store_image(&dir.path().join("image.sqlite3"));
    if std::env::var_os("COLONY_WRITE_EMPTY_STORE").is_some() {
        std::fs::write(&file, &built).unwrap();
    }
    let shipped = std::fs::read(&file).unwrap();
    let without_version =
        |b: &[u8]| [&b[..92.min(b.len())], b.get(100..).unwrap_or_default()].concat();
    assert!(
        without_version(&shipped) == without_version(&built),
        "{} is not the store this colony's migrations build (schema version {SCHEMA_VERSION}, \
         {} bytes built, {} shipped): write it anew with \
         COLONY_WRITE_EMPTY_STORE=1 cargo test --lib empty_store",
        file.display(),
        built.len(),
        shipped.len()
    );
}

/// What a creation cut short left beside the store (its half-built file and that file's WAL,
/// its process gone) is removed by the next, which then creates the store; a creation whose
/// process still runs is left to it.
#[test]
fn a_creation_cut_short_is_cleared_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    // No process has an id this high (Linux allows at most 2^22).
    let gone = "store.sqlite3.creating.2147483000.0";
    let running = "store.sqlite3.creating.1.0";
    for leftover in [gone, &format!("{gone}-wal"), running] {
        std::fs::write(dir.path().join(leftover), b"half written").unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    store.set("", "k", &json!(1)).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "store.sqlite3",
            "store.sqlite3-shm",
            "store.sqlite3-wal",
            running
        ],
        "the store, its WAL, and the creation still in progress"
    );
}

/// A store whose folder does not exist is not created, and the error names the folder.
#[test]
fn a_store_in_a_missing_folder_is_refused_naming_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gone").join("store.sqlite3");
    let err = match SqliteStore::open(&path) {
        Ok(_) => panic!("a store was created in a missing folder"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&format!(
            "its folder {} does not exist",
            dir.path().join("gone").display()
        )),
        "{err}"
    );
}

/// A store removed without its write-ahead log is not made again on top of that log (SQLite
/// would replay it into the new store, bringing the removed data back): refused, naming both,
/// and nothing is changed.
#[test]
fn a_store_removed_without_its_log_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    let wal = dir.path().join("store.sqlite3-wal");
    std::fs::write(&wal, b"the log of a store that was removed").unwrap();
    let err = match SqliteStore::open(&path) {
        Ok(_) => panic!("a store was made on top of an orphan log"),
        Err(e) => e,
    };
    assert!(matches!(err, StoreError::Damaged(_)), "{err}");
    let said = err.to_string();
    assert!(
        said.contains("store.sqlite3 is missing but its write-ahead log"),
        "{said}"
    );
    assert!(said.contains("store.sqlite3-wal"), "{said}");
    assert!(!path.exists());
    assert_eq!(
        std::fs::read(&wal).unwrap(),
        b"the log of a store that was removed"
    );
}

/// A store whose `-wal` was deleted after a crash, its `-shm` saying the log held commits not
/// yet in the store, is refused and left as it is: SQLite opened it as it was before them,
/// without a word, and what was acknowledged since the last checkpoint was gone.
#[test]
fn a_store_whose_log_was_deleted_after_a_crash_is_refused() {
    let (dir, store) = fresh();
    let path = dir.path().join("store.sqlite3");
    for n in 0..5 {
        store.set("", &format!("k{n}"), &json!(n)).unwrap();
    }
    // The crash: the connections are never closed, so nothing is checkpointed.
    std::mem::forget(store);
    std::fs::remove_file(dir.path().join("store.sqlite3-wal")).unwrap();
    let err = match SqliteStore::open(&path) {
        Ok(_) => panic!("a store whose log was deleted opened as if nothing was lost"),
        Err(e) => e,
    };
    assert!(matches!(err, StoreError::Damaged(_)), "{err}");
    let said = err.to_string();
    assert!(
        said.contains("store.sqlite3-wal is missing, though"),
        "{said}"
    );
    assert!(said.contains("frames of commits not yet in"), "{said}");
    assert!(
        dir.path().join("store.sqlite3-shm").exists(),
        "left as it was"
    );
}

/// Two openers that find no store create one each at once: one is put in place and both open
/// it (linking never replaces a store another opener put there first, with its writes).
#[test]
fn two_openers_creating_at_once_share_one_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    let barrier = Arc::new(std::sync::Barrier::new(8));
    let stores: Vec<SqliteStore> = (0..8)
        .map(|_| {
            let (path, barrier) = (path.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                SqliteStore::open(&path).unwrap()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    for (i, store) in stores.iter().enumerate() {
        store.set("", &format!("k{i}"), &json!(i)).unwrap();
    }
    for store in &stores {
        for i in 0..stores.len() {
            assert_eq!(store.get("", &format!("k{i}")).unwrap(), Some(json!(i)));
        }
    }
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("creating"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `.cargo/config.toml` builds the bundled SQLite without the extensions the store never uses
/// (about 0.5 MB of the release binary); the store runs on what is left.
#[test]
fn the_bundled_sqlite_leaves_out_the_extensions_the_store_never_uses() {
    let (_dir, store) = fresh();
    let conn = store.writer().unwrap();
    let mut stmt = conn.prepare("PRAGMA compile_options").unwrap();
    let options: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        options.iter().any(|o| o == "THREADSAFE=1"),
        "the options are listed: {options:?}"
    );
    for left_out in [
        "ENABLE_FTS3",
        "ENABLE_FTS5",
        "ENABLE_RTREE",
        "ENABLE_DBSTAT_VTAB",
        "ENABLE_STAT4",
        "SOUNDEX",
    ] {
        assert!(
            !options.iter().any(|o| o == left_out),
            "{left_out} is built in: {options:?}"
        );
    }
}

#[test]
fn values_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    let v = json!({"n": 3, "f": 3.0, "s": "ü", "e": [], "o": {}});
    {
        let store = SqliteStore::open(&path).unwrap();
        store.set("ws", "k", &v).unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.get("ws", "k").unwrap(), Some(v));
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
}

#[test]
fn spaces_are_separate_and_delete_reports_existence() {
    let (_dir, store) = fresh();
    store.set("", "k", &json!(1)).unwrap();
    store.set("w1", "k", &json!(2)).unwrap();
    assert_eq!(store.get("", "k").unwrap(), Some(json!(1)));
    assert_eq!(store.get("w1", "k").unwrap(), Some(json!(2)));
    assert_eq!(store.get("w2", "k").unwrap(), None);
    store.set("", "k", &json!("over")).unwrap();
    assert_eq!(store.get("", "k").unwrap(), Some(json!("over")));
    assert!(store.delete("w1", "k").unwrap());
    assert!(!store.delete("w1", "k").unwrap());
    assert_eq!(store.get("w1", "k").unwrap(), None);
    assert_eq!(store.get("", "k").unwrap(), Some(json!("over")));
}

#[test]
fn list_is_in_byte_order_and_prefixes_are_literal() {
    let (_dir, store) = fresh();
    let keys = [
        "b",
        "a",
        "a%",
        "a%b",
        "a_",
        "a_b",
        "ab",
        "aXb",
        "a",
        "A",
        "é",
        "z",
        "~",
        "a\u{10FFFF}",
        "a\u{10FFFF}x",
        "",
    ];
    for k in keys {
        store.set("", k, &json!(k)).unwrap();
    }
    store.set("other", "a1", &json!(1)).unwrap();
    let mut sorted: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    sorted.sort();
    sorted.dedup();
    assert_eq!(store.list("", "").unwrap(), sorted);
    assert_eq!(store.list("", "a%").unwrap(), ["a%", "a%b"]);
    assert_eq!(store.list("", "a_").unwrap(), ["a_", "a_b"]);
    assert_eq!(
        store.list("", "a").unwrap(),
        [
            "a",
            "a%",
            "a%b",
            "aXb",
            "a_",
            "a_b",
            "ab",
            "a\u{10FFFF}",
            "a\u{10FFFF}x"
        ]
    );
    assert_eq!(
        store.list("", "a\u{10FFFF}").unwrap(),
        ["a\u{10FFFF}", "a\u{10FFFF}x"]
    );
    assert_eq!(store.list("", "%").unwrap(), Vec::<String>::new());
    assert_eq!(store.list("", "é").unwrap(), ["é"]);
    assert_eq!(store.list("other", "").unwrap(), ["a1"]);
    assert_eq!(store.list("nobody", "").unwrap(), Vec::<String>::new());
}

#[test]
fn prefix_successor_is_the_next_string() {
    assert_eq!(prefix_successor(""), None);
    assert_eq!(prefix_successor("ab").as_deref(), Some("ac"));
    assert_eq!(prefix_successor("a%").as_deref(), Some("a&"));
    assert_eq!(prefix_successor("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
    assert_eq!(prefix_successor("a\u{10FFFF}").as_deref(), Some("b"));
    assert_eq!(prefix_successor("\u{10FFFF}"), None);
}

#[test]
fn update_is_atomic_across_threads() {
    let (_dir, store) = fresh();
    let store = Arc::new(store);
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for _ in 0..500 {
                    store
                        .update("", "counter", &mut |v| {
                            let n = v.and_then(|v| v.as_i64()).unwrap_or(0);
                            Ok(Some(json!(n + 1)))
                        })
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(store.get("", "counter").unwrap(), Some(json!(1000)));
}

#[test]
fn update_returns_the_new_value_deletes_and_rolls_back_on_error() {
    let (_dir, store) = fresh();
    let seen = store
        .update("w", "k", &mut |v| {
            assert_eq!(v, None);
            Ok(Some(json!({"n": 1})))
        })
        .unwrap();
    assert_eq!(seen, Some(json!({"n": 1})));
    let err = store
        .update("w", "k", &mut |_| Err("nope".to_string()))
        .unwrap_err();
    assert_eq!(err.kind(), "value_error");
    assert!(err.to_string().contains("nope"), "{err}");
    assert_eq!(store.get("w", "k").unwrap(), Some(json!({"n": 1})));
    assert_eq!(store.update("w", "k", &mut |_| Ok(None)).unwrap(), None);
    assert_eq!(store.get("w", "k").unwrap(), None);
}

#[test]
fn the_store_refuses_calls_from_inside_update_instead_of_deadlocking() {
    let (_dir, store) = fresh();
    let mut inner = None;
    store
        .update("", "k", &mut |_| {
            inner = Some(store.get("", "other"));
            Ok(Some(json!(1)))
        })
        .unwrap();
    let err = inner.unwrap().unwrap_err();
    assert_eq!(err.kind(), "value_error");
    assert!(
        err.to_string().contains("inside an update function"),
        "{err}"
    );
    // And usable again afterwards.
    assert_eq!(store.get("", "k").unwrap(), Some(json!(1)));
}

#[test]
fn commit_step_replaces_messages_serves_backlog_sets_dropped_and_clears_journal() {
    let (_dir, store) = fresh();
    assert_eq!(store.load_cell("alice").unwrap(), None);
    for i in 0..4 {
        store
            .push_backlog("alice", &mail(&format!("m{i}")))
            .unwrap();
    }
    store.push_backlog("bob", &mail("for bob")).unwrap();
    store
        .journal(
            "alice",
            &JournalEntry {
                call_id: "c1".into(),
                tool: "read".into(),
                result: None,
                files: Vec::new(),
            },
        )
        .unwrap();
    store
        .journal(
            "bob",
            &JournalEntry {
                call_id: "c1".into(),
                tool: "read".into(),
                result: None,
                files: Vec::new(),
            },
        )
        .unwrap();

    let cell = store.load_cell("alice").unwrap().unwrap();
    assert!(cell.messages.is_empty());
    assert_eq!(
        cell.backlog
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>(),
        ["m0", "m1", "m2", "m3"]
    );
    let rows: Vec<i64> = cell.backlog.iter().map(|m| m.saved.unwrap()).collect();
    assert_eq!(cell.journal.len(), 1);

    let messages = vec![
        Message::user("[mail from bob] m0"),
        Message::user("[mail from bob] m1"),
        Message::assistant("done"),
    ];
    store
        .commit_step("alice", &messages, &rows[..2], 7)
        .unwrap();
    let cell = store.load_cell("alice").unwrap().unwrap();
    assert_eq!(cell.messages, messages);
    assert_eq!(
        cell.backlog
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>(),
        ["m2", "m3"]
    );
    assert_eq!(cell.dropped, 7);
    assert!(cell.journal.is_empty());

    // Another cell is untouched.
    let bob = store.load_cell("bob").unwrap().unwrap();
    assert_eq!(bob.backlog, vec![mail("for bob")]);
    assert_eq!(bob.journal.len(), 1);

    // Naming rows already served too empties the backlog; dropped can go back to 0.
    store
        .commit_step("alice", &messages[..1], &rows, 0)
        .unwrap();
    let cell = store.load_cell("alice").unwrap().unwrap();
    assert_eq!(cell.messages, messages[..1]);
    assert!(cell.backlog.is_empty());
    assert_eq!(cell.dropped, 0);
    assert_eq!(store.conversations().unwrap(), ["alice", "bob"]);
}

#[test]
fn commit_step_creates_a_cell_and_backlog_keeps_arrival_order() {
    let (_dir, store) = fresh();
    store.commit_step("carol", &[], &[], 0).unwrap();
    assert_eq!(
        store.load_cell("carol").unwrap(),
        Some(SavedResident::default())
    );
    let mut with_files = mail("with files");
    with_files.files = vec![crate::files::record(
        "a.txt",
        None,
        std::sync::Arc::from(&b"attached"[..]),
    )];
    with_files.hop = 2;
    // Interleave two names: each keeps its own arrival order.
    for i in 0..20 {
        store
            .push_backlog("carol", &mail(&format!("c{i}")))
            .unwrap();
        store.push_backlog("dave", &mail(&format!("d{i}"))).unwrap();
    }
    store.push_backlog("carol", &with_files).unwrap();
    let cell = store.load_cell("carol").unwrap().unwrap();
    let mut expected: Vec<Mail> = (0..20).map(|i| mail(&format!("c{i}"))).collect();
    expected.push(with_files);
    assert_eq!(cell.backlog, expected);
    let attached = &cell.backlog[20].files[0];
    assert_eq!(attached.data.as_deref(), Some(&b"attached"[..]));
    let rows: Vec<i64> = cell.backlog.iter().map(|m| m.saved.unwrap()).collect();
    store.commit_step("carol", &[], &rows[..5], 0).unwrap();
    let cell = store.load_cell("carol").unwrap().unwrap();
    assert_eq!(cell.backlog, expected[5..]);
    assert_eq!(store.load_cell("dave").unwrap().unwrap().backlog.len(), 20);
}

#[test]
fn journal_records_start_then_result_in_order_and_commit_step_clears_it() {
    let (_dir, store) = fresh();
    let start = |id: &str| JournalEntry {
        call_id: id.into(),
        tool: "read".into(),
        result: None,
        files: Vec::new(),
    };
    store.journal("a", &start("c2")).unwrap();
    store.journal("a", &start("c1")).unwrap();
    let finished = JournalEntry {
        call_id: "c2".into(),
        tool: "read".into(),
        result: Some(result("c2", "contents ✓")),
        files: Vec::new(),
    };
    store.journal("a", &finished).unwrap();
    let cell = store.load_cell("a").unwrap().unwrap();
    assert_eq!(cell.journal, vec![finished, start("c1")]);
    store
        .commit_step("a", &[Message::assistant("ok")], &[], 0)
        .unwrap();
    assert!(store.load_cell("a").unwrap().unwrap().journal.is_empty());
}

#[test]
fn messages_with_tool_calls_round_trip() {
    let (_dir, store) = fresh();
    let messages = vec![
        Message::new(Role::System, vec![Part::text("be brief")]),
        Message::user("read a.txt"),
        Message::new(
            Role::Assistant,
            vec![
                Part::Reasoning {
                    text: "thinking".into(),
                    opaque: None,
                },
                Part::text("reading"),
                Part::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "read".into(),
                    arguments: "{\"path\":\"a.txt\"}".into(),
                    opaque: None,
                }),
            ],
        ),
        Message::new(Role::Tool, vec![Part::ToolResult(result("c1", "hello"))]),
    ];
    store.commit_step("r", &messages, &[], 0).unwrap();
    assert_eq!(store.load_cell("r").unwrap().unwrap().messages, messages);
}

#[test]
fn file_bytes_are_stored_once_and_put_back_on_load() {
    let (_dir, store) = fresh();
    let file = crate::files::record("n.csv", None, std::sync::Arc::from(&b"a,b\n1,2\n"[..]));
    let messages = vec![
        Message::new(
            Role::User,
            vec![Part::text("see"), Part::File(file.clone())],
        ),
        Message::new(Role::User, vec![Part::File(file.clone())]),
    ];
    store.commit_step("r", &messages, &[], 0).unwrap();
    store.commit_step("r", &messages, &[], 0).unwrap();
    let stored: i64 = store
        .writer()
        .unwrap()
        .query_row("SELECT count(*) FROM files", [], |r| r.get(0))
        .unwrap();
    assert_eq!(stored, 1);
    let text: String = store
        .writer()
        .unwrap()
        .query_row("SELECT messages FROM cells", [], |r| r.get(0))
        .unwrap();
    assert!(
        !text.contains("1,2"),
        "the conversation holds a reference only: {text}"
    );
    let loaded = store.load_cell("r").unwrap().unwrap().messages;
    assert_eq!(loaded, messages);
    for m in &loaded {
        let f = m.files().next().unwrap();
        assert_eq!(f.data.as_deref(), Some(&b"a,b\n1,2\n"[..]));
    }
}

#[test]
fn a_journaled_result_keeps_its_files() {
    let (_dir, store) = fresh();
    let file = crate::files::record(
        "chart.png",
        None,
        std::sync::Arc::from(&b"\x89PNG\r\n\x1a\nx"[..]),
    );
    let entry = JournalEntry {
        call_id: "c1".into(),
        tool: "plot".into(),
        result: Some(result("c1", "the chart")),
        files: vec![file.clone()],
    };
    store.journal("r", &entry).unwrap();
    let cell = store.load_cell("r").unwrap().unwrap();
    assert_eq!(cell.journal, vec![entry]);
    assert_eq!(cell.journal[0].files[0].data, file.data);
}

#[test]
fn a_mail_id_is_accepted_once_until_the_cell_is_cleared() {
    let (_dir, store) = fresh();
    let mut m = mail("one");
    m.id = Some("feed-1".into());
    assert!(store.push_backlog("alice", &m).unwrap().is_some());
    assert!(
        store.push_backlog("alice", &m).unwrap().is_none(),
        "a repeat is not appended"
    );
    assert!(
        store.push_backlog("bob", &m).unwrap().is_some(),
        "ids are per resident"
    );
    assert!(
        store
            .push_backlog("alice", &mail("no id"))
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .push_backlog("alice", &mail("no id"))
            .unwrap()
            .is_some(),
        "no id: no dedupe"
    );
    assert_eq!(store.load_cell("alice").unwrap().unwrap().backlog.len(), 3);
    store.clear_cell("alice").unwrap();
    assert!(store.push_backlog("alice", &m).unwrap().is_some());
}

#[test]
fn clear_cell_removes_messages_backlog_and_journal() {
    let (_dir, store) = fresh();
    store
        .commit_step("a", &[Message::user("hi")], &[], 3)
        .unwrap();
    store.push_backlog("a", &mail("held")).unwrap();
    store
        .journal(
            "a",
            &JournalEntry {
                call_id: "c".into(),
                tool: "t".into(),
                result: None,
                files: Vec::new(),
            },
        )
        .unwrap();
    store.push_backlog("b", &mail("keep")).unwrap();
    assert!(store.clear_cell("a").unwrap());
    assert!(!store.clear_cell("a").unwrap());
    assert_eq!(store.load_cell("a").unwrap(), None);
    assert_eq!(store.conversations().unwrap(), ["b"]);
    // A new cell of the same name starts empty.
    store.push_backlog("a", &mail("new")).unwrap();
    let cell = store.load_cell("a").unwrap().unwrap();
    assert!(cell.messages.is_empty() && cell.journal.is_empty());
    assert_eq!(cell.dropped, 0);
    assert_eq!(cell.backlog, vec![mail("new")]);
}

#[test]
fn breaker_round_trip() {
    let (_dir, store) = fresh();
    assert_eq!(store.breaker("ai/breaker").unwrap(), None);
    let state = BreakerState {
        status: BreakerStatus::Open,
        failures: 3,
        last_error: Some("503 from anthropic".into()),
        next_probe_ms: Some(1_700_000_000_123),
        probe_interval_ms: 60_000,
        since_ms: 1_700_000_000_000,
    };
    store.save_breaker("ai/breaker", &state).unwrap();
    assert_eq!(store.breaker("ai/breaker").unwrap(), Some(state.clone()));
    let closed = BreakerState {
        status: BreakerStatus::Closed,
        failures: 0,
        next_probe_ms: None,
        ..state
    };
    store.save_breaker("ai/breaker", &closed).unwrap();
    assert_eq!(store.breaker("ai/breaker").unwrap(), Some(closed));
    assert_eq!(store.breaker("other").unwrap(), None);
}

/// A transaction of audit lines only commits without the fsync (`synchronous=NORMAL`); one that
/// holds anything else, an audit line with its journal entry included, waits for the disk. The
/// lines are kept all the same, across closing and opening the store.
#[test]
fn audit_lines_alone_commit_without_waiting_for_the_disk() {
    let (dir, store) = fresh();
    let synchronous = |store: &SqliteStore| -> i64 {
        store
            .writer()
            .unwrap()
            .pragma_query_value(None, "synchronous", |r| r.get(0))
            .unwrap()
    };
    store.audit(&audit_line(1)).unwrap();
    assert_eq!(synchronous(&store), 1, "NORMAL after an audit line");
    store.finish_call("script", &audit_line(2), None).unwrap();
    assert_eq!(
        synchronous(&store),
        1,
        "NORMAL after a call with no journal"
    );
    let journal = JournalEntry {
        call_id: "c1".into(),
        tool: "add".into(),
        result: None,
        files: Vec::new(),
    };
    store
        .finish_call("r", &audit_line(3), Some(&journal))
        .unwrap();
    assert_eq!(synchronous(&store), 2, "FULL with a journal entry");
    store.audit(&audit_line(4)).unwrap();
    store.set("kv", "k", &json!(1)).unwrap();
    assert_eq!(synchronous(&store), 2, "FULL after a value");
    // An update is its own transaction on the same connection: it must not commit at the level
    // an audit line left.
    store.audit(&audit_line(5)).unwrap();
    assert_eq!(synchronous(&store), 1, "NORMAL after an audit line");
    store
        .update("kv", "k", &mut |v| {
            Ok(Some(json!(v.and_then(|v| v.as_i64()).unwrap_or(0) + 1)))
        })
        .unwrap();
    assert_eq!(synchronous(&store), 2, "FULL after an update");
    drop(store);
    let store = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
    let kept: Vec<u64> = store
        .audit_log(&AuditFilter::default())
        .unwrap()
        .iter()
        .map(|e| e.at_ms)
        .collect();
    assert_eq!(kept, [1, 2, 3, 4, 5]);
}

/// Version 5 rebuilt the audit table without `AUTOINCREMENT` and its indexes (a line writes one
/// page, not four): an older store keeps its lines, in order, and new ones come after them.
#[test]
fn an_older_stores_audit_lines_are_kept_in_order_by_the_leaner_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    {
        let conn = super::open::create_at_version(&path, 4);
        for (n, resident) in [(1, "alice"), (2, "bob"), (3, "alice")] {
            conn.execute(
                "INSERT INTO audit (at_ms, resident, tool, args_hash, duration_ms, outcome, message)
                 VALUES (?1, ?2, 'read', 'h', 1.5, 'error', 'went wrong')",
                params![n, resident],
            )
            .unwrap();
        }
        // The last line was deleted by hand: AUTOINCREMENT would not reuse its id, a rowid
        // would, but ids only need to grow from the lines that are there.
        conn.execute("DELETE FROM audit WHERE at_ms = 3", [])
            .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    store
        .audit(&AuditEntry {
            at_ms: 4,
            resident: "alice".into(),
            tool: "write".into(),
            args_hash: "h2".into(),
            duration_ms: 2.0,
            outcome: "ok".into(),
            message: None,
        })
        .unwrap();
    let lines = store.audit_log(&AuditFilter::default()).unwrap();
    let at: Vec<u64> = lines.iter().map(|e| e.at_ms).collect();
    assert_eq!(at, [1, 2, 4]);
    assert_eq!(lines[0].message.as_deref(), Some("went wrong"));
    assert_eq!(lines[0].duration_ms, 1.5);
    let alice = AuditFilter {
        resident: Some("alice".into()),
        tool: None,
    };
    let at: Vec<u64> = store
        .audit_log(&alice)
        .unwrap()
        .iter()
        .map(|e| e.at_ms)
        .collect();
    assert_eq!(at, [1, 4]);
    let conn = store.writer().unwrap();
    let extra: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE tbl_name = 'audit' AND type = 'index'
             UNION ALL SELECT name FROM sqlite_sequence WHERE name IN ('audit', 'audit_lines')
             UNION ALL SELECT name FROM sqlite_master WHERE name = 'audit_lines'",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(extra.is_empty(), "left over: {extra:?}");
}

#[test]
fn audit_log_filters_by_resident_and_tool_in_order() {
    let (_dir, store) = fresh();
    let entry = |at_ms: u64, resident: &str, tool: &str, outcome: &str| AuditEntry {
        at_ms,
        resident: resident.into(),
        tool: tool.into(),
        args_hash: format!("{at_ms:064x}"),
        duration_ms: at_ms as f64 / 8.0,
        outcome: outcome.into(),
        message: (outcome != "ok").then(|| format!("{tool} went wrong")),
    };
    let all = vec![
        entry(3, "alice", "read", "ok"),
        entry(1, "bob", "read", "error"),
        entry(2, "alice", "write", "thrown"),
        entry(4, "script", "read", "ok"),
    ];
    for e in &all {
        store.audit(e).unwrap();
    }
    assert_eq!(store.audit_log(&AuditFilter::default()).unwrap(), all);
    let alice = AuditFilter {
        resident: Some("alice".into()),
        tool: None,
    };
    assert_eq!(
        store.audit_log(&alice).unwrap(),
        vec![all[0].clone(), all[2].clone()]
    );
    let reads = AuditFilter {
        resident: None,
        tool: Some("read".into()),
    };
    assert_eq!(
        store.audit_log(&reads).unwrap(),
        vec![all[0].clone(), all[1].clone(), all[3].clone()]
    );
    let both = AuditFilter {
        resident: Some("alice".into()),
        tool: Some("read".into()),
    };
    assert_eq!(store.audit_log(&both).unwrap(), vec![all[0].clone()]);
    let none = AuditFilter {
        resident: Some("nobody".into()),
        tool: None,
    };
    assert!(store.audit_log(&none).unwrap().is_empty());
}

#[test]
fn a_newer_schema_is_too_new_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    {
        let store = SqliteStore::open(&path).unwrap();
        store.set("", "k", &json!(1)).unwrap();
    }
    {
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", 999).unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert_eq!(err.kind(), "too_new", "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("999"), "{msg}");
    assert!(msg.contains(&format!("up to {SCHEMA_VERSION}")), "{msg}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let conn = Connection::open(&path).unwrap();
    let v: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(v, 999);
}

#[test]
fn garbage_is_damaged_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    let garbage: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert_eq!(err.kind(), "damaged", "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("not an SQLite database"), "{msg}");
    assert_eq!(std::fs::read(&path).unwrap(), garbage);
    // Nothing was created beside it either.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["store.sqlite3"]);
}

#[test]
fn corrupt_pages_are_damaged_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    {
        let store = SqliteStore::open(&path).unwrap();
        for i in 0..200 {
            store
                .set("", &format!("key{i:04}"), &json!("x".repeat(100)))
                .unwrap();
        }
    }
    let mut bytes = std::fs::read(&path).unwrap();
    let page = u16::from_be_bytes([bytes[16], bytes[17]]) as usize;
    assert!(bytes.len() >= 3 * page);
    // Scribble over the second page (a b-tree page of the schema's tables).
    for b in &mut bytes[page..2 * page] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert_eq!(err.kind(), "damaged", "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

/// Every table a program resumes from is checked at open, not only the first.
#[test]
fn damage_in_any_table_but_the_log_is_refused_at_open() {
    for table in ["cells", "journal", "files", "accepted"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sqlite3");
        drop(SqliteStore::open(&path).unwrap());
        let (bytes, _) = scribble_root(&path, table);
        let err = SqliteStore::open(&path).unwrap_err();
        assert_eq!(err.kind(), "damaged", "{table}: {err}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{table}");
    }
}

/// A row whose value is not its column's type is damage, said as such when it is read (it was
/// rusqlite's "Invalid column type Text at index: 0, name: at_ms").
#[test]
fn a_row_of_the_wrong_type_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    {
        let store = SqliteStore::open(&path).unwrap();
        store.audit_all(&[audit_line(1)]).unwrap();
    }
    Connection::open(&path)
        .unwrap()
        .execute_batch("UPDATE audit SET at_ms = 'yesterday'")
        .unwrap();
    let store = SqliteStore::open(&path).unwrap();
    let err = store.audit_log(&AuditFilter::default()).unwrap_err();
    assert_eq!(err.kind(), "damaged", "{err}");
    assert!(
        err.to_string()
            .contains("a row holds a value of the wrong type"),
        "{err}"
    );
}

/// A store with a table gone is refused at open, naming it: it opened, and the program wrote
/// before a resident met "no such table".
#[test]
fn a_table_gone_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    drop(SqliteStore::open(&path).unwrap());
    Connection::open(&path)
        .unwrap()
        .execute_batch("DROP TABLE backlog")
        .unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert_eq!(err.kind(), "damaged", "{err}");
    assert!(
        err.to_string().contains("its table(s) backlog are missing"),
        "{err}"
    );
}

/// The audit log is left out of the check at open (it is most of a long-lived store), so damage
/// there does not keep a program from its state; it is reported, as damage, when the log is read.
#[test]
fn a_damaged_audit_log_is_reported_when_read_not_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    {
        let store = SqliteStore::open(&path).unwrap();
        store.set("", "kept", &json!("state")).unwrap();
        let lines: Vec<AuditEntry> = (0..2000u64).map(audit_line).collect();
        store.audit_all(&lines).unwrap();
    }
    let (bytes, page) = scribble_root(&path, "audit");
    assert!(
        bytes.len() > 20 * page,
        "the log spans pages (an empty store has 15)"
    );

    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.get("", "kept").unwrap(), Some(json!("state")));
    let err = store.audit_log(&AuditFilter::default()).unwrap_err();
    assert_eq!(err.kind(), "damaged", "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[test]
fn another_sqlite_database_is_not_a_colony_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert_eq!(err.kind(), "damaged", "{err}");
    assert!(err.to_string().contains("not a colony store"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn an_empty_file_is_refused_and_left_untouched() {
    // A store colony opened is never empty: an empty file lost its contents (or never was
    // a store), and starting afresh in it would lose the program's state silently.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    std::fs::write(&path, b"").unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert_eq!(err.kind(), "damaged", "{err}");
    assert!(err.to_string().contains("is empty (0 bytes)"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"");
}

// --- group commit ---

#[test]
fn writes_from_many_threads_each_get_their_own_outcome_and_all_are_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    let store = SqliteStore::open(&path).unwrap();
    const THREADS: usize = 16;
    let accepted: Vec<Vec<Option<i64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = &store;
                s.spawn(move || {
                    // Two threads share each mail id: exactly one of them has it accepted.
                    (0..20)
                        .map(|i| {
                            let mut m = mail(&format!("{t}-{i}"));
                            m.id = Some(format!("{}-{i}", t / 2));
                            store.set("", &format!("{t}/{i}"), &json!(i)).unwrap();
                            store.push_backlog("inbox", &m).unwrap()
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for pair in accepted.chunks(2) {
        for (i, (a, b)) in pair[0].iter().zip(&pair[1]).enumerate() {
            assert!(
                a.is_some() ^ b.is_some(),
                "id {i} of a pair accepted exactly once"
            );
        }
    }
    let commits = store.commits();
    assert_eq!(commits.writes, (THREADS * 20 * 2) as u64);
    drop(store);
    let store = SqliteStore::open(&path).unwrap();
    for t in 0..THREADS {
        for i in 0..20 {
            assert_eq!(store.get("", &format!("{t}/{i}")).unwrap(), Some(json!(i)));
        }
    }
    let cell = store.load_cell("inbox").unwrap().unwrap();
    assert_eq!(cell.backlog.len(), THREADS / 2 * 20);
}

#[test]
fn a_write_that_fails_in_a_batch_is_rolled_back_alone() {
    let (_dir, store) = fresh();
    // A trigger refuses one key, as a full disk or a constraint could refuse one write.
    on_writer(
        &store,
        "CREATE TEMP TRIGGER refuse BEFORE INSERT ON kv WHEN NEW.key = 'bad'
         BEGIN SELECT RAISE(ABORT, 'refused'); END;",
    );
    let set = |key: &str| Write::Set {
        space: String::new(),
        key: key.into(),
        text: "1".into(),
    };
    let writes = [set("a"), set("bad"), set("b")];
    let outcomes = batch(&store, &writes);
    assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
    let err = outcomes[1].as_ref().unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    assert_eq!(store.get("", "a").unwrap(), Some(json!(1)));
    assert_eq!(store.get("", "bad").unwrap(), None);
    assert_eq!(store.get("", "b").unwrap(), Some(json!(1)));
    // Alone, the refused write fails and leaves nothing behind.
    let lone = batch(&store, &[set("bad")]);
    assert!(lone[0].is_err());
    assert_eq!(store.get("", "bad").unwrap(), None);
}

#[test]
fn a_write_of_several_statements_that_fails_in_a_batch_is_undone_whole() {
    let (_dir, store) = fresh();
    // Accepting mail makes the resident's cell, then appends to its backlog: the append is
    // refused after the cell was made, so the cell must go too (a savepoint undoes it; SQLite
    // alone would only undo the failed statement).
    on_writer(
        &store,
        "CREATE TEMP TRIGGER refuse BEFORE INSERT ON backlog WHEN NEW.name = 'refused'
         BEGIN SELECT RAISE(ABORT, 'refused'); END;",
    );
    let accept = |name: &str| Write::PushBacklog {
        name: name.into(),
        text: serde_json::to_string(&mail("hi")).unwrap(),
        id: Some(format!("{name}-1")),
        files: Vec::new(),
    };
    let set = Write::Set {
        space: String::new(),
        key: "a".into(),
        text: "1".into(),
    };
    let writes = [accept("taken"), accept("refused"), set];
    let outcomes = batch(&store, &writes);
    assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
    assert!(
        outcomes[1]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("refused")
    );
    assert_eq!(store.load_cell("taken").unwrap().unwrap().backlog.len(), 1);
    assert!(
        store.load_cell("refused").unwrap().is_none(),
        "its cell is undone"
    );
    assert_eq!(store.get("", "a").unwrap(), Some(json!(1)));
    // Its mail id was not taken either: once allowed, the same mail is accepted.
    on_writer(&store, "DROP TRIGGER refuse");
    let again = batch(&store, &[accept("refused")]);
    assert!(matches!(again[0], Ok(Done::Appended(Some(_)))), "{again:?}");
}

/// 64 tasks on a runtime of 2 workers commit while the writing connection is held: every one of
/// them queues (they wait off the workers; blocking them would stall the rest), then the queue
/// goes in one transaction behind the first.
#[test]
fn residents_committing_at_once_share_one_transaction() {
    const TASKS: usize = 64;
    let (_dir, store) = fresh();
    let store = Arc::new(store);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let held = store.write.lock().unwrap();
    let before = store.commits();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = store.clone();
            rt.spawn(async move {
                let messages = vec![Message::user(format!("step of {t}"))];
                store.commit_step(&format!("r{t}"), &messages, &[], 0)
            })
        })
        .collect();
    // The first write's leader waits for the connection; the other 63 queue behind it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while store.writes.queued() < TASKS - 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        store.writes.queued(),
        TASKS - 1,
        "every task queued its write"
    );
    drop(held);
    for t in tasks {
        rt.block_on(t).unwrap().unwrap();
    }
    let after = store.commits();
    assert_eq!(after.writes - before.writes, TASKS as u64);
    assert_eq!(
        after.transactions - before.transactions,
        2,
        "the first, then the 63 together"
    );
    for t in 0..TASKS {
        let cell = store.load_cell(&format!("r{t}")).unwrap().unwrap();
        assert_eq!(cell.messages, vec![Message::user(format!("step of {t}"))]);
    }
}

// --- resuming: the cells in one pass ---

#[test]
fn a_resume_reads_every_cell_in_one_pass_and_never_misses_a_write_made_since() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    let n = cells::IN_ONE_PASS as usize + 6;
    let name = |i: usize| format!("r{i:03}");
    let mut rows = Vec::new();
    {
        let store = SqliteStore::open(&path).unwrap();
        for i in 0..n {
            let messages = [Message::user(format!("hello {i}"))];
            store.commit_step(&name(i), &messages, &[], 0).unwrap();
            rows.extend(
                store
                    .push_backlog(&name(i), &mail(&format!("mail {i}")))
                    .unwrap(),
            );
            if i % 2 == 0 {
                let started = JournalEntry {
                    call_id: "call_1".into(),
                    tool: "read".into(),
                    result: None,
                    files: Vec::new(),
                };
                store.journal(&name(i), &started).unwrap();
            }
        }
    }
    let store = SqliteStore::open(&path).unwrap();
    let first = store.load_cell(&name(0)).unwrap().unwrap();
    assert!(
        matches!(*store.kept.lock().unwrap(), Kept::Cells { .. }),
        "the first load read them all"
    );
    assert_eq!(first.messages, vec![Message::user("hello 0")]);
    assert_eq!(first.backlog, vec![mail("mail 0")]);
    assert_eq!(first.journal.len(), 1);

    // Written after the pass: a load sees the write, not the text read before it.
    store
        .commit_step(&name(1), &[Message::user("changed")], &rows[1..2], 0)
        .unwrap();
    store.push_backlog(&name(2), &mail("later")).unwrap();
    let one = store.load_cell(&name(1)).unwrap().unwrap();
    assert_eq!(one.messages, vec![Message::user("changed")]);
    assert!(one.backlog.is_empty(), "the served mail left the backlog");
    let two = store.load_cell(&name(2)).unwrap().unwrap();
    assert_eq!(two.backlog, vec![mail("mail 2"), mail("later")]);
    // Loaded again: from SQLite now, the same.
    assert_eq!(store.load_cell(&name(0)).unwrap().unwrap(), first);
    // Every other cell as reading it alone gives it.
    for i in 3..n {
        let kept = store.load_cell(&name(i)).unwrap().unwrap();
        let alone = cells::read_one(&mut store.read.lock().unwrap(), &name(i))
            .unwrap()
            .unwrap();
        assert_eq!(
            kept,
            store.decode_cell(&name(i), alone).unwrap(),
            "{}",
            name(i)
        );
    }
    assert!(
        matches!(*store.kept.lock().unwrap(), Kept::Done),
        "nothing is kept once every cell was loaded"
    );
    assert_eq!(store.load_cell("nobody").unwrap(), None);
}

#[test]
fn a_small_store_reads_its_cells_one_by_one() {
    let (_dir, store) = fresh();
    store
        .commit_step("alice", &[Message::user("hi")], &[], 0)
        .unwrap();
    assert!(store.load_cell("alice").unwrap().is_some());
    assert!(matches!(*store.kept.lock().unwrap(), Kept::Done));
}

// --- a finished call: audit line and journal entry in one transaction ---

#[test]
fn a_finished_call_writes_its_audit_line_and_journal_entry_in_one_transaction() {
    let (_dir, store) = fresh();
    let audit = AuditEntry {
        at_ms: 7,
        resident: "bob".into(),
        tool: "read".into(),
        args_hash: format!("{:064x}", 7),
        duration_ms: 1.5,
        outcome: "ok".into(),
        message: None,
    };
    let journal = JournalEntry {
        call_id: "c1".into(),
        tool: "read".into(),
        result: Some(result("c1", "done")),
        files: Vec::new(),
    };
    let before = store.commits();
    store.finish_call("bob", &audit, Some(&journal)).unwrap();
    let after = store.commits();
    assert_eq!(after.transactions - before.transactions, 1, "one fsync");
    assert_eq!(
        store.audit_log(&AuditFilter::default()).unwrap(),
        vec![audit.clone()]
    );
    assert_eq!(
        store.load_cell("bob").unwrap().unwrap().journal,
        vec![journal]
    );
    // A resident that keeps no conversation audits only: no cell appears for it.
    store.finish_call("carol", &audit, None).unwrap();
    assert_eq!(store.audit_log(&AuditFilter::default()).unwrap().len(), 2);
    assert!(store.load_cell("carol").unwrap().is_none());
}

/// The steps a store needs run in one transaction: a step that fails leaves the file at the
/// version it had, the steps before it undone (a new store commits once, not once a step).
#[test]
fn a_migration_that_fails_leaves_the_store_at_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    {
        let conn = super::open::create_at_version(&path, 3);
        // Step 5 creates this table: it fails there, after step 4 added a column.
        conn.execute_batch("CREATE TABLE audit_lines (x)").unwrap();
    }
    assert!(SqliteStore::open(&path).is_err());
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, 3);
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('audit')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert!(!columns.iter().any(|c| c == "message"), "{columns:?}");
}

/// The hashes of the file bytes the store holds, in order.
fn stored_files(store: &SqliteStore) -> Vec<String> {
    let conn = store.writer().unwrap();
    let mut stmt = conn
        .prepare("SELECT sha256 FROM files ORDER BY sha256")
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// A cleared conversation's files go with it, unless something else still refers to them (a
/// conversation, a held mail): clearing left every attachment's bytes in the store for good.
#[test]
fn a_cleared_conversation_takes_the_bytes_no_one_else_refers_to() {
    let (_dir, store) = fresh();
    let file = |name: &str, bytes: &'static [u8]| {
        crate::files::record(name, None, std::sync::Arc::from(bytes))
    };
    let (own, shared, other, held) = (
        file("own.csv", b"own\n"),
        file("shared.csv", b"shared\n"),
        file("other.csv", b"other\n"),
        file("held.csv", b"held\n"),
    );
    let with = |files: Vec<crate::vocab::FileRef>| {
        vec![Message::new(
            Role::User,
            files.into_iter().map(Part::File).collect(),
        )]
    };
    store
        .commit_step("r", &with(vec![own.clone(), shared.clone()]), &[], 0)
        .unwrap();
    store
        .commit_step("s", &with(vec![other.clone(), shared.clone()]), &[], 0)
        .unwrap();
    let mut waiting = mail("with a file");
    waiting.files = vec![held.clone()];
    store.push_backlog("t", &waiting).unwrap();
    let stored = || stored_files(&store);
    let shas = |files: &[&crate::vocab::FileRef]| {
        let mut v: Vec<String> = files.iter().map(|f| f.sha256.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(stored(), shas(&[&own, &shared, &other, &held]));
    assert!(store.clear_cell("r").unwrap());
    assert_eq!(stored(), shas(&[&shared, &other, &held]));
    assert!(store.clear_cell("s").unwrap());
    assert_eq!(stored(), shas(&[&held]));
    assert!(store.clear_cell("t").unwrap());
    assert!(stored().is_empty());
}

/// Held mail dropped (`colony conversations drop`, a scan too large for the model) takes the
/// bytes of its attachments that nothing else refers to, as a clear does; they stayed for good.
#[test]
fn dropped_held_mail_takes_the_bytes_no_one_else_refers_to() {
    let (_dir, store) = fresh();
    let file = |name: &str, bytes: &'static [u8]| {
        crate::files::record(name, None, std::sync::Arc::from(bytes))
    };
    let (scan, kept) = (file("scan.png", b"huge\n"), file("kept.csv", b"kept\n"));
    let mut big = mail("a scan");
    big.files = vec![scan.clone()];
    let mut small = mail("a table");
    small.files = vec![kept.clone()];
    let big_row = store.push_backlog("t", &big).unwrap().unwrap();
    store.push_backlog("t", &small).unwrap();
    let stored = || stored_files(&store);
    assert_eq!(stored().len(), 2);
    assert_eq!(store.drop_backlog("t", &[big_row]).unwrap(), 1);
    assert_eq!(stored(), vec![kept.sha256.clone()]);
    let cell = store.load_cell("t").unwrap().unwrap();
    assert_eq!(cell.backlog.len(), 1);
    assert_eq!(
        cell.backlog[0].files[0].data.as_deref(),
        Some(&b"kept\n"[..])
    );
}
