//! The store's contract, one set of tests run against every backend: SQLite in a temporary
//! file and PostgreSQL in a fresh database on a real server (tests/support/postgres.rs starts
//! one on 127.0.0.1). Round trips, atomic updates, commit_step, the journal, accepted mail ids,
//! breaker states, the audit log, files by hash, and many writers at once.

mod support;

use std::sync::Arc;

use colony::infer::breaker::{BreakerState, BreakerStatus};
use colony::residents::Mail;
use colony::store::postgres::PostgresStore;
use colony::store::sqlite::SqliteStore;
use colony::store::{AuditEntry, AuditFilter, JournalEntry, SavedResident, Store};
use colony::vocab::{Message, Part, Role, ToolCall, ToolResult};
use serde_json::{Value, json};

/// A store under test, and how to open it again (a restart).
struct Backend {
    store: Arc<dyn Store>,
    reopen: Box<dyn Fn() -> Arc<dyn Store> + Send + Sync>,
    _dir: Option<tempfile::TempDir>,
}

impl std::ops::Deref for Backend {
    type Target = dyn Store;
    fn deref(&self) -> &(dyn Store + 'static) {
        &*self.store
    }
}

fn sqlite() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    Backend {
        store,
        reopen: Box::new(move || Arc::new(SqliteStore::open(&path).unwrap())),
        _dir: Some(dir),
    }
}

fn postgres() -> Backend {
    let url = support::postgres::database();
    let store: Arc<dyn Store> = Arc::new(PostgresStore::open(&url).unwrap());
    Backend {
        store,
        reopen: Box::new(move || Arc::new(PostgresStore::open(&url).unwrap())),
        _dir: None,
    }
}

/// Each named test function, once per backend: `sqlite::NAME` and `postgres::NAME`.
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $( #[test] fn $name() { super::$name(&super::sqlite()) } )*
        }
        mod on_postgres {
            $( #[test] fn $name() { super::$name(&super::postgres()) } )*
        }
    };
}

on_every_backend!(
    values_round_trip_exactly,
    arbitrary_floats_round_trip_bit_for_bit,
    values_survive_reopening,
    spaces_are_separate_and_delete_reports_existence,
    list_is_in_byte_order_and_prefixes_are_literal,
    update_is_atomic_across_threads,
    update_and_set_of_a_new_key_never_interleave,
    update_returns_the_new_value_deletes_and_rolls_back_on_error,
    the_store_refuses_calls_from_inside_update_instead_of_deadlocking,
    commit_step_replaces_messages_serves_backlog_sets_dropped_and_clears_journal,
    commit_step_creates_a_cell_and_backlog_keeps_arrival_order,
    commit_step_removes_the_rows_it_names_and_no_other,
    drop_backlog_removes_held_mail_and_leaves_the_rest,
    journal_records_start_then_result_in_order_and_commit_step_clears_it,
    messages_with_tool_calls_round_trip,
    file_bytes_are_put_back_on_load_after_a_restart,
    a_journaled_result_keeps_its_files,
    a_mail_id_is_accepted_once_until_the_cell_is_cleared,
    clear_cell_removes_messages_backlog_and_journal,
    breaker_round_trip,
    audit_log_filters_by_resident_and_tool_in_order,
    pruning_the_audit_log_removes_the_oldest_lines_a_batch_at_a_time,
    writes_from_many_threads_each_get_their_own_outcome_and_all_are_durable,
);

fn mail(content: &str) -> Mail {
    Mail::new("alice", "bob", content, 0)
}

fn result(call_id: &str, content: &str) -> ToolResult {
    ToolResult {
        call_id: call_id.into(),
        name: "read".into(),
        content: content.into(),
        is_error: false,
    }
}

fn started(id: &str) -> JournalEntry {
    JournalEntry {
        call_id: id.into(),
        tool: "read".into(),
        result: None,
        files: Vec::new(),
    }
}

fn values_round_trip_exactly(store: &Backend) {
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
    assert!(store.get("", "k6").unwrap().unwrap().is_f64());
    assert!(store.get("", "k2").unwrap().unwrap().is_i64());
    assert_eq!(store.get("", "missing").unwrap(), None);
}

fn arbitrary_floats_round_trip_bit_for_bit(store: &Backend) {
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

fn values_survive_reopening(store: &Backend) {
    let v = json!({"n": 3, "f": 3.0, "s": "ü", "e": [], "o": {}});
    store.set("ws", "k", &v).unwrap();
    store
        .commit_step("r", &[Message::user("kept")], &[], 0)
        .unwrap();
    let again = (store.reopen)();
    assert_eq!(again.get("ws", "k").unwrap(), Some(v));
    assert_eq!(
        again.load_cell("r").unwrap().unwrap().messages,
        [Message::user("kept")]
    );
}

fn spaces_are_separate_and_delete_reports_existence(store: &Backend) {
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

fn list_is_in_byte_order_and_prefixes_are_literal(store: &Backend) {
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

fn update_is_atomic_across_threads(store: &Backend) {
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..100 {
                    store
                        .update("", "counter", &mut |v| {
                            let n = v.and_then(|v| v.as_i64()).unwrap_or(0);
                            Ok(Some(json!(n + 1)))
                        })
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(store.get("", "counter").unwrap(), Some(json!(400)));
}

/// An update of a key nobody holds yet, racing plain sets and other updates of it: each update
/// sees either nothing or the value of one whole write, and no increment is lost.
fn update_and_set_of_a_new_key_never_interleave(store: &Backend) {
    for round in 0..20 {
        let key = format!("fresh{round}");
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    store
                        .update("", &key, &mut |v| {
                            let n = v
                                .map(|v| v["n"].as_i64().expect("a whole value"))
                                .unwrap_or(0);
                            Ok(Some(json!({"n": n + 1})))
                        })
                        .unwrap();
                });
            }
        });
        assert_eq!(
            store.get("", &key).unwrap(),
            Some(json!({"n": 3})),
            "round {round}"
        );
    }
    // A set racing an update of a missing key: the update either ran first (the set's value
    // stands) or after it (the set's value plus one); never the update's value over the set's.
    for round in 0..20 {
        let key = format!("raced{round}");
        std::thread::scope(|s| {
            s.spawn(|| store.set("", &key, &json!(100)).unwrap());
            s.spawn(|| {
                store
                    .update("", &key, &mut |v| {
                        Ok(Some(json!(v.and_then(|v| v.as_i64()).unwrap_or(0) + 1)))
                    })
                    .unwrap()
            });
        });
        let end = store.get("", &key).unwrap().unwrap().as_i64().unwrap();
        // 100: the update ran first and the set overwrote it; 101: the set ran first.
        assert!(end == 100 || end == 101, "round {round}: {end}");
    }
}

fn update_returns_the_new_value_deletes_and_rolls_back_on_error(store: &Backend) {
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
    // A failed update of a missing key leaves it missing.
    store
        .update("w", "absent", &mut |_| Err("no".to_string()))
        .unwrap_err();
    assert_eq!(store.get("w", "absent").unwrap(), None);
    assert_eq!(store.list("w", "").unwrap(), ["k"]);
    assert_eq!(store.update("w", "k", &mut |_| Ok(None)).unwrap(), None);
    assert_eq!(store.get("w", "k").unwrap(), None);
    // Deleting a key that never was leaves nothing behind either.
    assert_eq!(store.update("w", "never", &mut |_| Ok(None)).unwrap(), None);
    assert_eq!(store.list("w", "").unwrap(), Vec::<String>::new());
}

fn the_store_refuses_calls_from_inside_update_instead_of_deadlocking(store: &Backend) {
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
    assert_eq!(store.get("", "k").unwrap(), Some(json!(1)));
}

fn commit_step_replaces_messages_serves_backlog_sets_dropped_and_clears_journal(store: &Backend) {
    assert_eq!(store.load_cell("alice").unwrap(), None);
    let rows: Vec<i64> = (0..4)
        .map(|i| {
            store
                .push_backlog("alice", &mail(&format!("m{i}")))
                .unwrap()
                .expect("a mail without an id is appended")
        })
        .collect();
    store.push_backlog("bob", &mail("for bob")).unwrap();
    store.journal("alice", &started("c1")).unwrap();
    store.journal("bob", &started("c1")).unwrap();

    let cell = store.load_cell("alice").unwrap().unwrap();
    assert!(cell.messages.is_empty());
    let contents = |c: &SavedResident| {
        c.backlog
            .iter()
            .map(|m| m.content.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(contents(&cell), ["m0", "m1", "m2", "m3"]);
    let saved: Vec<Option<i64>> = cell.backlog.iter().map(|m| m.saved).collect();
    assert_eq!(saved, rows.iter().copied().map(Some).collect::<Vec<_>>());
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
    assert_eq!(contents(&cell), ["m2", "m3"]);
    assert_eq!(cell.dropped, 7);
    assert!(cell.journal.is_empty());

    let bob = store.load_cell("bob").unwrap().unwrap();
    assert_eq!(bob.backlog, vec![mail("for bob")]);
    assert_eq!(bob.journal.len(), 1);

    store
        .commit_step("alice", &messages[..1], &rows, 0)
        .unwrap();
    let cell = store.load_cell("alice").unwrap().unwrap();
    assert_eq!(cell.messages, messages[..1]);
    assert!(cell.backlog.is_empty());
    assert_eq!(cell.dropped, 0);
    assert_eq!(store.conversations().unwrap(), ["alice", "bob"]);
}

fn commit_step_creates_a_cell_and_backlog_keeps_arrival_order(store: &Backend) {
    store.commit_step("carol", &[], &[], 0).unwrap();
    assert_eq!(
        store.load_cell("carol").unwrap(),
        Some(SavedResident::default())
    );
    let mut with_files = mail("with files");
    with_files.files = vec![colony::files::record(
        "a.txt",
        None,
        Arc::from(&b"attached"[..]),
    )];
    with_files.hop = 2;
    let mut rows = Vec::new();
    for i in 0..20 {
        rows.extend(
            store
                .push_backlog("carol", &mail(&format!("c{i}")))
                .unwrap(),
        );
        store.push_backlog("dave", &mail(&format!("d{i}"))).unwrap();
    }
    store.push_backlog("carol", &with_files).unwrap();
    let cell = store.load_cell("carol").unwrap().unwrap();
    let mut expected: Vec<Mail> = (0..20).map(|i| mail(&format!("c{i}"))).collect();
    expected.push(with_files);
    assert_eq!(cell.backlog, expected);
    assert_eq!(
        cell.backlog[20].files[0].data.as_deref(),
        Some(&b"attached"[..])
    );
    store.commit_step("carol", &[], &rows[..5], 0).unwrap();
    let cell = store.load_cell("carol").unwrap().unwrap();
    assert_eq!(cell.backlog, expected[5..]);
    assert_eq!(store.load_cell("dave").unwrap().unwrap().backlog.len(), 20);
}

/// A commit removes the backlog rows it names, wherever they are, and no other. A mail whose
/// save landed but whose answer was lost (the store went away as it committed) has a row that
/// no queue holds: the turns after it must not remove it in place of their own (a restart
/// serves it, once). A commit repeated after its answer was lost removes nothing more.
fn commit_step_removes_the_rows_it_names_and_no_other(store: &Backend) {
    let rows: Vec<i64> = ["m0", "m1", "m2", "m3"]
        .iter()
        .map(|c| store.push_backlog("alice", &mail(c)).unwrap().unwrap())
        .collect();
    assert!(
        rows.windows(2).all(|w| w[0] < w[1]),
        "rows in arrival order: {rows:?}"
    );
    let contents = |store: &dyn Store| {
        let cell = store.load_cell("alice").unwrap().unwrap();
        cell.backlog
            .iter()
            .map(|m| (m.content.clone(), m.saved))
            .collect::<Vec<_>>()
    };
    let served = [
        Message::user("[mail from bob] m1"),
        Message::assistant("ok"),
    ];
    store.commit_step("alice", &served, &rows[1..3], 0).unwrap();
    let left = vec![
        ("m0".to_string(), Some(rows[0])),
        ("m3".into(), Some(rows[3])),
    ];
    assert_eq!(
        contents(&**store),
        left,
        "the rows named, not the first two"
    );
    store.commit_step("alice", &served, &rows[1..3], 0).unwrap();
    assert_eq!(
        contents(&**store),
        left,
        "a repeated commit removes nothing more"
    );
    let next = store.push_backlog("alice", &mail("m4")).unwrap().unwrap();
    assert!(!rows.contains(&next), "row {next} was numbered before");
    store.commit_step("alice", &served, &rows[1..3], 0).unwrap();
    let mut left = left;
    left.push(("m4".into(), Some(next)));
    assert_eq!(
        contents(&*(store.reopen)()),
        left,
        "the same rows after a restart"
    );
}

/// `colony conversations drop`: the rows named go, unserved; the conversation, the journal
/// and the mail's accepted id stay.
fn drop_backlog_removes_held_mail_and_leaves_the_rest(store: &Backend) {
    let messages = [
        Message::user("[mail from bob] hi"),
        Message::assistant("hello"),
    ];
    store.commit_step("alice", &messages, &[], 0).unwrap();
    store.journal("alice", &started("c1")).unwrap();
    let mut kept = mail("kept");
    kept.id = Some("k".into());
    let mut gone = mail("too large");
    gone.id = Some("g".into());
    let gone_row = store.push_backlog("alice", &gone).unwrap().unwrap();
    let kept_row = store.push_backlog("alice", &kept).unwrap().unwrap();
    assert_eq!(store.drop_backlog("alice", &[gone_row]).unwrap(), 1);
    assert_eq!(
        store.drop_backlog("alice", &[gone_row]).unwrap(),
        0,
        "already gone"
    );
    assert_eq!(
        store.drop_backlog("nobody", &[kept_row]).unwrap(),
        0,
        "another's row"
    );
    let cell = (store.reopen)().load_cell("alice").unwrap().unwrap();
    assert_eq!(cell.messages, messages);
    assert_eq!(cell.journal, vec![started("c1")]);
    let held: Vec<_> = cell
        .backlog
        .iter()
        .map(|m| (m.content.as_str(), m.saved))
        .collect();
    assert_eq!(held, [("kept", Some(kept_row))]);
    // Dropped, not forgotten: the same mail sent again is not taken twice.
    assert_eq!(store.push_backlog("alice", &gone).unwrap(), None);
}

fn journal_records_start_then_result_in_order_and_commit_step_clears_it(store: &Backend) {
    store.journal("a", &started("c2")).unwrap();
    store.journal("a", &started("c1")).unwrap();
    let finished = JournalEntry {
        call_id: "c2".into(),
        tool: "read".into(),
        result: Some(result("c2", "contents ✓")),
        files: Vec::new(),
    };
    store.journal("a", &finished).unwrap();
    let cell = store.load_cell("a").unwrap().unwrap();
    assert_eq!(cell.journal, vec![finished, started("c1")]);
    // A restart finds the same journal.
    let again = (store.reopen)();
    assert_eq!(again.load_cell("a").unwrap().unwrap().journal, cell.journal);
    store
        .commit_step("a", &[Message::assistant("ok")], &[], 0)
        .unwrap();
    assert!(store.load_cell("a").unwrap().unwrap().journal.is_empty());
}

fn messages_with_tool_calls_round_trip(store: &Backend) {
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

fn file_bytes_are_put_back_on_load_after_a_restart(store: &Backend) {
    let file = colony::files::record("n.csv", None, Arc::from(&b"a,b\n1,2\n"[..]));
    let messages = vec![
        Message::new(
            Role::User,
            vec![Part::text("see"), Part::File(file.clone())],
        ),
        Message::new(Role::User, vec![Part::File(file.clone())]),
    ];
    store.commit_step("r", &messages, &[], 0).unwrap();
    store.commit_step("r", &messages, &[], 0).unwrap();
    let loaded = (store.reopen)().load_cell("r").unwrap().unwrap().messages;
    assert_eq!(loaded, messages);
    for m in &loaded {
        let f = m.files().next().unwrap();
        assert_eq!(f.data.as_deref(), Some(&b"a,b\n1,2\n"[..]));
    }
}

fn a_journaled_result_keeps_its_files(store: &Backend) {
    let file = colony::files::record("chart.png", None, Arc::from(&b"\x89PNG\r\n\x1a\nx"[..]));
    let entry = JournalEntry {
        call_id: "c1".into(),
        tool: "plot".into(),
        result: Some(result("c1", "the chart")),
        files: vec![file.clone()],
    };
    store.journal("r", &entry).unwrap();
    let cell = (store.reopen)().load_cell("r").unwrap().unwrap();
    assert_eq!(cell.journal, vec![entry]);
    assert_eq!(cell.journal[0].files[0].data, file.data);
}

fn a_mail_id_is_accepted_once_until_the_cell_is_cleared(store: &Backend) {
    let mut m = mail("one");
    m.id = Some("feed-1".into());
    assert!(store.push_backlog("alice", &m).unwrap().is_some());
    assert!(
        store.push_backlog("alice", &m).unwrap().is_none(),
        "a repeat is not appended"
    );
    assert!(
        (store.reopen)()
            .push_backlog("alice", &m)
            .unwrap()
            .is_none(),
        "nor after a restart"
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

fn clear_cell_removes_messages_backlog_and_journal(store: &Backend) {
    store
        .commit_step("a", &[Message::user("hi")], &[], 3)
        .unwrap();
    store.push_backlog("a", &mail("held")).unwrap();
    store.journal("a", &started("c")).unwrap();
    store.push_backlog("b", &mail("keep")).unwrap();
    assert!(store.clear_cell("a").unwrap());
    assert!(!store.clear_cell("a").unwrap());
    assert_eq!(store.load_cell("a").unwrap(), None);
    assert_eq!(store.conversations().unwrap(), ["b"]);
    store.push_backlog("a", &mail("new")).unwrap();
    let cell = store.load_cell("a").unwrap().unwrap();
    assert!(cell.messages.is_empty() && cell.journal.is_empty());
    assert_eq!(cell.dropped, 0);
    assert_eq!(cell.backlog, vec![mail("new")]);
}

fn breaker_round_trip(store: &Backend) {
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
    assert_eq!(
        (store.reopen)().breaker("ai/breaker").unwrap(),
        Some(closed)
    );
    assert_eq!(store.breaker("other").unwrap(), None);
}

fn pruning_the_audit_log_removes_the_oldest_lines_a_batch_at_a_time(store: &Backend) {
    let line = |at_ms: u64| AuditEntry {
        at_ms,
        resident: "r".into(),
        tool: "t".into(),
        args_hash: format!("{at_ms:064x}"),
        duration_ms: 1.0,
        outcome: "ok".into(),
        message: None,
    };
    let old = u64::from(colony::store::PRUNE_BATCH) + 5;
    let lines: Vec<AuditEntry> = (0..old).map(|n| line(1_000 + n)).collect();
    store.audit_all(&lines).unwrap();
    let newer = [line(1_000_000), line(1_000_001)];
    store.audit_all(&newer).unwrap();
    assert!(
        !store.prune_audit(1_000).unwrap(),
        "nothing is older than 1000"
    );
    // The first call takes a batch, the second the rest, the third finds nothing.
    assert!(store.prune_audit(500_000).unwrap());
    assert_eq!(store.audit_log(&AuditFilter::default()).unwrap().len(), 7);
    assert!(store.prune_audit(500_000).unwrap());
    assert!(!store.prune_audit(500_000).unwrap());
    assert_eq!(
        store.audit_log(&AuditFilter::default()).unwrap(),
        newer.to_vec()
    );
    assert_eq!(
        (store.reopen)().audit_log(&AuditFilter::default()).unwrap(),
        newer.to_vec()
    );
}

fn audit_log_filters_by_resident_and_tool_in_order(store: &Backend) {
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
    let filter = |resident: Option<&str>, tool: Option<&str>| AuditFilter {
        resident: resident.map(str::to_string),
        tool: tool.map(str::to_string),
    };
    assert_eq!(
        store.audit_log(&filter(Some("alice"), None)).unwrap(),
        vec![all[0].clone(), all[2].clone()]
    );
    assert_eq!(
        store.audit_log(&filter(None, Some("read"))).unwrap(),
        vec![all[0].clone(), all[1].clone(), all[3].clone()]
    );
    assert_eq!(
        store
            .audit_log(&filter(Some("alice"), Some("read")))
            .unwrap(),
        vec![all[0].clone()]
    );
    assert!(
        store
            .audit_log(&filter(Some("nobody"), None))
            .unwrap()
            .is_empty()
    );
}

fn writes_from_many_threads_each_get_their_own_outcome_and_all_are_durable(store: &Backend) {
    const THREADS: usize = 16;
    let accepted: Vec<Vec<Option<i64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
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
    let again = (store.reopen)();
    for t in 0..THREADS {
        for i in 0..20 {
            assert_eq!(again.get("", &format!("{t}/{i}")).unwrap(), Some(json!(i)));
        }
    }
    let cell = again.load_cell("inbox").unwrap().unwrap();
    assert_eq!(cell.backlog.len(), THREADS / 2 * 20);
    // Each caller was answered its own mail's row.
    for (m, row) in accepted.iter().flatten().enumerate() {
        let Some(row) = row else { continue };
        let held = cell.backlog.iter().find(|b| b.saved == Some(*row));
        assert_eq!(
            held.map(|b| b.content.as_str()),
            Some(format!("{}-{}", m / 20, m % 20).as_str())
        );
    }
}
