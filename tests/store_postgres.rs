//! A program's state in PostgreSQL, as a user meets it: `colony run --store URL` (or
//! `[store] url` in the config) keeps it there, `colony store|conversations|audit` read it
//! back, and a URL that cannot be reached, a URL of another kind, a database a newer colony
//! wrote and a name PostgreSQL cannot hold are refused with messages that name them and never
//! show the password. The server is real (tests/support/postgres.rs).

mod support;

use colony::residents::Mail;
use colony::store::postgres::PostgresStore;
use colony::store::{AuditEntry, Store};
use colony::vocab::Message;
use serde_json::json;
use support::script::Sandbox;

const PASSWORD: &str = "sekrit-pw";

#[test]
fn a_program_keeps_its_state_in_postgres_and_the_commands_read_it() {
    let url = support::postgres::database();
    let sb = Sandbox::new();
    let script = sb.write(
        "keeper.lua",
        r#"
local runs = (store.get("runs") or 0) + 1
assert(store.set("runs", runs))
assert(store.set("doc/a", { n = 1, f = 1.5, tags = { "x", "y" } }))
assert(store.set("doc/b", "two"))
print("run " .. runs)
"#,
    );
    let script = script.display().to_string();
    let run = sb.colony(&["run", "--store", &url, &script]).ok();
    assert_eq!(run.stdout, "run 1\n");
    // A second process finds what the first kept (and the state directory holds no SQLite).
    let run = sb.colony(&["run", "--store", &url, &script]).ok();
    assert_eq!(run.stdout, "run 2\n");
    assert!(
        !sb.state_home().join("colony").exists(),
        "nothing in the state directory"
    );

    let run = sb
        .colony(&["store", &script, "get", "doc/a", "--store", &url])
        .ok();
    let value: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(value, json!({"n": 1, "f": 1.5, "tags": ["x", "y"]}));
    let run = sb
        .colony(&["store", &script, "list", "doc/", "--store", &url])
        .ok();
    assert_eq!(run.lines(), ["doc/a", "doc/b"]);

    // The same through the config file's [store] table.
    std::fs::write(
        sb.path("config.toml"),
        format!("[store]\nurl = \"{url}\"\n"),
    )
    .unwrap();
    let run = sb.colony(&["run", &script]).ok();
    assert_eq!(run.stdout, "run 3\n");
    let run = sb.colony(&["store", &script, "get", "runs"]).ok();
    assert_eq!(run.stdout.trim(), "3");

    // Conversations and the audit log, written as residents write them (in the program's
    // schema, named after its file).
    let store = PostgresStore::open_in(&url, Some("colony_keeper")).unwrap();
    store
        .commit_step(
            "alice",
            &[
                Message::user("[mail from bob] hi"),
                Message::assistant("hello"),
            ],
            &[],
            0,
        )
        .unwrap();
    store
        .push_backlog("alice", &Mail::new("alice", "bob", "still there?", 0))
        .unwrap();
    store
        .audit(&AuditEntry {
            at_ms: 1_700_000_000_123,
            resident: "alice".into(),
            tool: "read_file".into(),
            args_hash: "ab".repeat(32),
            duration_ms: 12.5,
            outcome: "ok".into(),
            message: None,
        })
        .unwrap();
    let run = sb.colony(&["conversations", &script, "list"]).ok();
    assert_eq!(run.lines().len(), 1, "{}", run.stdout);
    assert!(
        run.stdout.starts_with("alice  2 messages"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("1 in backlog"), "{}", run.stdout);
    let run = sb.colony(&["conversations", &script, "show", "alice"]).ok();
    assert!(run.stdout.contains("hello"), "{}", run.stdout);
    assert!(run.stdout.contains("still there?"), "{}", run.stdout);
    let run = sb.colony(&["audit", &script]).ok();
    assert!(run.stdout.contains("read_file"), "{}", run.stdout);
    assert!(
        run.stdout.contains("2023-11-14T22:13:20.123Z"),
        "{}",
        run.stdout
    );

    // A missing conversation is named with the database, without the password.
    let run = sb
        .colony(&["conversations", &script, "show", "nobody"])
        .failed();
    let shown = url.replace(&format!(":{PASSWORD}"), "");
    assert!(run.stderr.contains("\"nobody\""), "{}", run.stderr);
    assert!(run.stderr.contains(&shown), "{}", run.stderr);
    assert!(!run.stderr.contains(PASSWORD), "{}", run.stderr);

    // A program that never ran with this store (a mistyped name) is said, and nothing is
    // created for it: each reading command answered nothing, status 0, and left an empty
    // schema behind (which the next command then found).
    // An empty schema (as older colonies' reading commands left) is no program with state.
    PostgresStore::open_in(&url, Some("colony_left_empty")).unwrap();
    let typo = sb.write("keepr.lua", "print('never run')\n");
    let typo = typo.display().to_string();
    for args in [
        vec!["conversations", &typo, "list"],
        vec!["store", &typo, "list"],
        vec!["audit", &typo],
    ] {
        let run = sb.colony(&args).failed();
        assert!(
            run.stderr
                .contains("holds no state of this program (no schema colony_keepr")
                && run
                    .stderr
                    .contains("the programs with state there: keeper)"),
            "{args:?}: {}",
            run.stderr
        );
        assert!(!run.stderr.contains(PASSWORD), "{}", run.stderr);
    }
    // (Each command after the first would have found the schema the first made.)
    let run = sb.colony(&["conversations", &script, "list"]).ok();
    assert!(run.stdout.starts_with("alice"), "{}", run.stdout);
}

#[test]
fn a_store_that_cannot_be_reached_is_named_without_its_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Nothing listens there once the listener above is gone.
    let url = format!("postgres://colony:{PASSWORD}@127.0.0.1:{port}/nowhere");
    let shown = format!("postgres://colony@127.0.0.1:{port}/nowhere");
    let sb = Sandbox::new();
    let script = sb.write("p.lua", "print('never')\n").display().to_string();
    for args in [
        vec!["run", "--store", &url, &script],
        vec!["conversations", &script, "list", "--store", &url],
        vec!["store", &script, "list", "--store", &url],
        vec!["audit", &script, "--store", &url],
    ] {
        let run = sb.colony(&args).failed();
        assert_eq!(run.code, 1, "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
        assert!(
            run.stderr
                .contains(&format!("cannot reach the PostgreSQL store {shown}")),
            "{args:?}: {}",
            run.stderr
        );
        assert!(run.stderr.contains("refused"), "{args:?}: {}", run.stderr);
        assert!(!run.stderr.contains(PASSWORD), "{args:?}: {}", run.stderr);
    }
    // A wrong password on a live server: the server's refusal, not the password.
    let live = support::postgres::database();
    let wrong_db = live.rsplit_once('/').unwrap().0.to_string() + "/no_such_database";
    let run = sb.colony(&["run", "--store", &wrong_db, &script]).failed();
    assert!(run.stderr.contains("no_such_database"), "{}", run.stderr);
    assert!(run.stderr.contains("does not exist"), "{}", run.stderr);
    assert!(!run.stderr.contains(PASSWORD), "{}", run.stderr);
}

#[test]
fn a_url_of_another_kind_is_refused_where_it_was_written() {
    let sb = Sandbox::new();
    let script = sb.write("p.lua", "print('never')\n").display().to_string();
    let run = sb
        .colony(&[
            "run",
            "--store",
            "mysql://root:hunter2hunter2@db/x",
            &script,
        ])
        .failed();
    // Bad input, status 2 as the README's table gives (it was 1, found as the store opened).
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("--store mysql://root@db/x is not a PostgreSQL URL"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("hunter2"), "{}", run.stderr);
    let config = sb.write("config.toml", "[store]\nurl = \"sqlite:///tmp/x\"\n");
    let run = sb.colony(&["run", &script]).failed();
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains(&config.display().to_string()),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("[store] url"), "{}", run.stderr);
    let run = sb.colony(&["store", &script, "list"]).failed();
    assert!(run.stderr.contains("[store] url"), "{}", run.stderr);
    // The commands that read a program's store refuse a bad --store as bad input too.
    std::fs::remove_file(&config).unwrap();
    for (command, then) in [
        ("audit", None),
        ("usage", None),
        ("conversations", Some("list")),
        ("store", Some("list")),
    ] {
        let mut args = vec![command, "--store", "notaurl:pw@x", &script];
        args.extend(then);
        let run = sb.colony(&args);
        assert_eq!(run.code, 2, "{command}: {}", run.stderr);
        assert!(
            run.stderr.contains(&format!(
                "colony {command}: notaurl:pw@x is not a PostgreSQL URL"
            )),
            "{command}: {}",
            run.stderr
        );
    }
}

#[test]
fn a_database_a_newer_colony_wrote_is_too_new_and_left_untouched() {
    let url = support::postgres::database();
    let store = PostgresStore::open(&url).unwrap();
    assert_eq!(
        store.schema_version().unwrap(),
        colony::store::postgres::SCHEMA_VERSION
    );
    store.set("", "k", &json!(1)).unwrap();
    drop(store);
    let server = support::postgres::server();
    let db = url.rsplit_once('/').unwrap().1;
    server.sql(db, "UPDATE colony_schema SET version = 999");
    let err = PostgresStore::open(&url).unwrap_err();
    assert_eq!(err.kind(), "too_new", "{err}");
    let msg = err.to_string();
    assert!(msg.contains("999"), "{msg}");
    assert!(
        msg.contains(&format!(
            "up to {}",
            colony::store::postgres::SCHEMA_VERSION
        )),
        "{msg}"
    );
    assert!(!msg.contains(PASSWORD), "{msg}");
    assert_eq!(server.sql(db, "SELECT version FROM colony_schema"), "999");
    assert_eq!(
        server.sql(db, "SELECT value FROM colony_kv WHERE key = 'k'"),
        "1"
    );

    // Tables of ours without the version row: not a store colony wrote.
    let other = support::postgres::database();
    let other_db = other.rsplit_once('/').unwrap().1;
    server.sql(other_db, "CREATE TABLE colony_kv (x int)");
    let err = PostgresStore::open(&other).unwrap_err();
    assert_eq!(err.kind(), "damaged", "{err}");
}

/// A reading command does not upgrade a shared store an older colony wrote: the nodes of
/// that colony may be running on it, and would then refuse it as newer. Refused, named, and
/// left as it is; a program run upgrades it (not checked here: the tables are this version's).
#[test]
fn a_reading_command_leaves_an_older_colonys_store_as_it_is() {
    let url = support::postgres::database();
    let sb = Sandbox::new();
    let script = sb.write("older.lua", "assert(store.set('k', 1))\n");
    let script = script.display().to_string();
    sb.colony(&["run", "--store", &url, &script]).ok();
    let server = support::postgres::server();
    let db = url.rsplit_once('/').unwrap().1;
    let older = colony::store::postgres::SCHEMA_VERSION - 1;
    server.sql(
        db,
        &format!("UPDATE colony_older.colony_schema SET version = {older}"),
    );
    let run = sb
        .colony(&["store", &script, "get", "k", "--store", &url])
        .failed();
    assert!(
        run.stderr.contains(&format!(
            "was written by an older colony (store schema version {older}; this colony writes \
             version {}); reading it here would upgrade it",
            colony::store::postgres::SCHEMA_VERSION
        )),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains(PASSWORD), "{}", run.stderr);
    assert_eq!(
        server.sql(db, "SELECT version FROM colony_older.colony_schema"),
        older.to_string()
    );
    // A schema made by hand, empty: no program's state, not an older colony's store.
    server.sql(db, "CREATE SCHEMA colony_handmade");
    let handmade = sb.write("handmade.lua", "print('never run')\n");
    let run = sb
        .colony(&[
            "store",
            &handmade.display().to_string(),
            "list",
            "--store",
            &url,
        ])
        .failed();
    assert!(
        run.stderr.contains(
            "holds no state of this program (its schema colony_handmade is empty: the program \
             has not run with this store)"
        ),
        "{}",
        run.stderr
    );
}

#[test]
fn names_postgres_cannot_hold_are_refused_by_name() {
    let store = PostgresStore::open(&support::postgres::database()).unwrap();
    let err = store.set("", "bad\0key", &json!(1)).unwrap_err();
    assert_eq!(err.kind(), "value_error");
    assert!(err.to_string().contains(r#""bad\0key""#), "{err}");
    assert!(err.to_string().contains("NUL"), "{err}");
    let err = store
        .update("", "bad\0key", &mut |_| Ok(Some(json!(1))))
        .unwrap_err();
    assert_eq!(err.kind(), "value_error");
    let err = store
        .push_backlog("bad\0name", &Mail::new("x", "y", "z", 0))
        .unwrap_err();
    assert_eq!(err.kind(), "value_error");
    // Reads of such a name find nothing, and the store goes on.
    assert_eq!(store.get("", "bad\0key").unwrap(), None);
    assert!(!store.delete("", "bad\0key").unwrap());
    assert_eq!(store.load_cell("bad\0name").unwrap(), None);
    assert!(store.list("", "").unwrap().is_empty());
    // A NUL inside a value is JSON-escaped and round-trips.
    store.set("", "k", &json!("a\0b")).unwrap();
    assert_eq!(store.get("", "k").unwrap(), Some(json!("a\0b")));
}

/// `colony serve --store URL`: mail accepted before a SIGKILL is in PostgreSQL, and the next
/// process given the same URL serves it, once, and keeps the conversation there.
#[test]
fn serve_keeps_accepted_mail_in_postgres_across_a_sigkill() {
    use support::fake::{FakeProvider, Reply};
    use support::serve::Served;
    let url = support::postgres::database();
    let fake = FakeProvider::start();
    let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let killed = killed.clone();
        fake.set_responder(move |body, _| {
            let text = body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .and_then(|m| m["content"].as_str().map(str::to_string))
                .unwrap_or_default();
            if killed.load(std::sync::atomic::Ordering::SeqCst) {
                Reply::text(format!("re: {text}"))
            } else {
                Reply::text("never heard").delay(60_000)
            }
        });
    }
    let sb = Sandbox::new();
    sb.write(
        "config.toml",
        &format!(
            "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nkey = \"test-key-0123456789\"\n\
             base_url = \"{}\"\n",
            fake.base_url("openai")
        ),
    );
    let desk = support::script::project_root()
        .join("examples/service/desk.lua")
        .display()
        .to_string();
    let ready = |served: &Served| {
        support::serve::eventually("ready", || served.get("/readyz").status == 200)
    };
    let mut served = Served::start(&sb, &["--store", &url, &desk]);
    ready(&served);
    let a = served.mail(
        "desk",
        json!({ "to": "desk", "content": "keep me", "id": "k-1" }),
    );
    assert_eq!(
        (a.status, a.json["durable"].as_bool()),
        (202, Some(true)),
        "{}",
        a.text
    );
    served.signal("KILL");
    assert_eq!(served.wait(), None, "killed by the signal");
    killed.store(true, std::sync::atomic::Ordering::SeqCst);
    drop(served);

    // The held mail is in the database, in the program's own schema.
    let store = PostgresStore::open_in(&url, Some("colony_desk")).unwrap();
    let held = store.load_cell("desk").unwrap().expect("desk's cell");
    assert_eq!(held.backlog.len(), 1, "{held:?}");
    assert_eq!(held.backlog[0].content, "keep me");

    let served = Served::start(&sb, &["--store", &url, &desk]);
    let events = served.events(Some(0));
    let reply = events.next_of("delivery", "desk");
    assert_eq!(reply.data["text"], "re: [mail from api] keep me");
    let again = served.mail(
        "desk",
        json!({ "to": "desk", "content": "keep me", "id": "k-1" }),
    );
    assert_eq!(again.status, 202);
    support::serve::eventually("the step committed", || {
        store
            .load_cell("desk")
            .unwrap()
            .is_some_and(|c| c.backlog.is_empty() && !c.messages.is_empty())
    });
    let cell = store.load_cell("desk").unwrap().unwrap();
    let mails = cell
        .messages
        .iter()
        .filter(|m| m.role == colony::vocab::Role::User)
        .count();
    assert_eq!(mails, 1, "{:?}", cell.messages);
    assert!(
        !sb.state_home().join("colony").exists(),
        "nothing in a state directory"
    );
}

/// The server drops every connection of the store (a restart, a failover, an idle timeout):
/// the next calls connect afresh instead of failing on a dead connection.
#[test]
fn calls_after_the_server_dropped_the_connections_connect_afresh() {
    let url = support::postgres::database();
    let db = url.rsplit_once('/').unwrap().1.to_string();
    let store = PostgresStore::open(&url).unwrap();
    // Several connections in the pool.
    std::thread::scope(|s| {
        for i in 0..4 {
            let store = &store;
            s.spawn(move || store.set("", &format!("k{i}"), &json!(i)).unwrap());
        }
    });
    let server = support::postgres::server();
    let killed = server.sql(
        "postgres",
        &format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{db}'"
        ),
    );
    assert_ne!(killed, "0", "the store's connections were cut");
    for i in 0..4 {
        assert_eq!(store.get("", &format!("k{i}")).unwrap(), Some(json!(i)));
    }
    store.set("", "after", &json!(true)).unwrap();
    assert_eq!(store.get("", "after").unwrap(), Some(json!(true)));
}

/// `colony serve` starts again by itself a program whose store could not be reached (a
/// database that boots after the machine), but not one the database refused (a database that
/// does not exist, a wrong password): that was retried every minute for ever, never a failure
/// systemd could see, the log saying "cannot reach".
#[test]
fn serve_does_not_retry_a_store_that_refused_it() {
    let server = support::postgres::server();
    let sb = Sandbox::new();
    let script = sb.write("keeper.lua", "ai.watch{}\n");
    let missing = server.url("no_such_database");
    let served =
        support::serve::Served::start(&sb, &["--store", &missing, &script.display().to_string()]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let p = served.get("/api/programs/keeper").json;
        if p["state"] == "failed" {
            assert!(
                p["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("does not exist")),
                "{p}"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never failed: {p}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let said = served.stderr();
    assert!(said.contains("cannot start"), "{said}");
    assert!(
        !said.contains("trying again"),
        "a refusal is not retried: {said}"
    );
}
