//! The store's commands as a user meets them: `colony state`, `colony conversations`,
//! `colony store` and `colony audit` on a state directory filled through the library, the lock
//! while another process (here: the test) holds the directory, and files that are refused and
//! left as they were.

mod support;

use std::path::{Path, PathBuf};

use colony::residents::Mail;
use colony::store::state_dir::{self, STORE_FILE, StateDir};
use colony::store::{AuditEntry, JournalEntry, Store};
use colony::vocab::{Message, Part, Role, ToolCall, ToolResult};
use serde_json::json;
use support::script::Sandbox;

/// A sandbox (whose XDG_STATE_HOME is its own), a script, and the script's default state
/// directory as the binary will compute it.
fn setup() -> (Sandbox, PathBuf, PathBuf) {
    let sb = Sandbox::new();
    let script = sb.write("watcher.lua", "print('hi')\n");
    let state = state_dir::default_under(&sb.state_home(), &script);
    (sb, script, state)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn conversation() -> Vec<Message> {
    vec![
        Message::user("[mail from bob] where is a.txt?"),
        Message::new(
            Role::Assistant,
            vec![
                Part::text("Let me look."),
                Part::ToolCall(ToolCall {
                    id: "call_1".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"a.txt"}"#.into(),
                    opaque: None,
                }),
            ],
        ),
        Message::new(
            Role::Tool,
            vec![Part::ToolResult(ToolResult {
                call_id: "call_1".into(),
                name: "read_file".into(),
                content: "hello\nworld".into(),
                is_error: false,
            })],
        ),
        Message::assistant("It says hello."),
    ]
}

fn fill_conversations(dir: &Path) {
    let state = StateDir::open(dir).unwrap();
    let store = state.store();
    store.commit_step("alice", &conversation(), &[], 0).unwrap();
    store
        .push_backlog("alice", &Mail::new("alice", "carol", "are you there?", 0))
        .unwrap();
    store
        .push_backlog("bob", &Mail::new("bob", "alice", "ping", 1))
        .unwrap();
    store
        .journal(
            "bob",
            &JournalEntry {
                call_id: "c9".into(),
                tool: "fetch".into(),
                result: None,
                files: Vec::new(),
            },
        )
        .unwrap();
}

#[test]
fn help_tells_the_store_commands_and_the_lock() {
    let run = Sandbox::new().colony(&["--help"]).ok();
    for c in ["state", "conversations", "store", "audit"] {
        assert!(run.stdout.contains(c), "{c}: {}", run.stdout);
    }
    for c in ["conversations", "store", "audit"] {
        let run = Sandbox::new().colony(&[c, "--help"]).ok();
        assert!(run.stdout.contains("--state <DIR>"), "{c}: {}", run.stdout);
        assert!(
            run.stdout.contains("while the program runs this refuses"),
            "{c}: {}",
            run.stdout
        );
    }
}

#[test]
fn state_prints_the_default_directory() {
    let (sb, script, state) = setup();
    let run = sb.colony(&["state", &s(&script)]).ok();
    assert_eq!(run.stdout, format!("{}\n", s(&state)));
    let name = state.file_name().unwrap().to_str().unwrap();
    assert!(name.starts_with("watcher-"), "{name}");
    assert_eq!(name.len(), "watcher-".len() + 12, "{name}");
    assert!(state.starts_with(sb.dir.path()), "{}", s(&state));
    // Only printed: nothing is created.
    assert!(!state.exists());

    let missing = sb.path("nope.lua");
    let run = sb.colony(&["state", &s(&missing)]).failed();
    assert_eq!(run.code, 2);
    assert!(
        run.stderr
            .starts_with(&format!("colony state: {}: no such file", s(&missing))),
        "{}",
        run.stderr
    );
}

#[test]
fn conversations_list_show_export_and_clear() {
    let (sb, script, state) = setup();
    fill_conversations(&state);
    let file = s(&script);

    let run = sb.colony(&["conversations", &file, "list"]).ok();
    assert_eq!(
        run.lines(),
        [
            "alice  4 messages, 1 in backlog",
            "bob    0 messages, 1 in backlog, 1 call in flight",
        ]
    );

    let run = sb.colony(&["conversations", &file, "show", "alice"]).ok();
    assert_eq!(
        run.stdout,
        "user: [mail from bob] where is a.txt?\n\
         assistant: Let me look.\n\
         assistant calls read_file (call_1): {\"path\":\"a.txt\"}\n\
         tool: read_file (call_1) returned: hello\n    world\n\
         assistant: It says hello.\n\
         held mail, not yet served:\n  1. [mail from carol] are you there?\n"
    );
    let run = sb.colony(&["conversations", &file, "show", "bob"]).ok();
    assert_eq!(
        run.stdout,
        "held mail, not yet served:\n  1. [mail from alice] ping\nstep in flight:\n  fetch (c9): started\n"
    );

    let run = sb.colony(&["conversations", &file, "export", "alice"]).ok();
    let lines = run.lines();
    assert_eq!(
        lines[0],
        r#"{"role":"user","parts":[{"type":"text","text":"[mail from bob] where is a.txt?"}]}"#
    );
    let back: Vec<Message> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(back, conversation());

    let run = sb
        .colony(&["conversations", &file, "show", "nobody"])
        .failed();
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        format!(
            "colony conversations: no conversation named \"nobody\" in {}\n",
            s(&state)
        )
    );

    // Held mail behind a step in flight is dropped, the step kept.
    let run = sb
        .colony(&["conversations", &file, "drop", "bob", "1"])
        .ok();
    assert_eq!(
        run.stdout,
        "dropped held mail 1 of bob: [mail from alice] ping\n"
    );
    let run = sb
        .colony(&["conversations", &file, "drop", "alice", "1"])
        .ok();
    assert_eq!(
        run.stdout,
        "dropped held mail 1 of alice: [mail from carol] are you there?\n"
    );
    let run = sb.colony(&["conversations", &file, "list"]).ok();
    assert_eq!(
        run.lines(),
        [
            "alice  4 messages, 0 in backlog",
            "bob    0 messages, 0 in backlog, 1 call in flight",
        ]
    );
    let run = sb.colony(&["conversations", &file, "export", "alice"]).ok();
    let back: Vec<Message> = run
        .lines()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(back, conversation());

    let run = sb.colony(&["conversations", &file, "clear", "bob"]).ok();
    assert_eq!(
        run.stdout,
        "removed conversation bob (0 messages, 0 in backlog, 1 call in flight)\n"
    );
    let run = sb.colony(&["conversations", &file, "list"]).ok();
    assert_eq!(run.lines(), ["alice  4 messages, 0 in backlog"]);
    let run = sb
        .colony(&["conversations", &file, "clear", "bob"])
        .failed();
    assert!(
        run.stderr.contains("no conversation named \"bob\""),
        "{}",
        run.stderr
    );

    // --state reads a directory given outright (after the subcommand too).
    let run = sb
        .colony(&["conversations", "any.lua", "list", "--state", &s(&state)])
        .ok();
    assert_eq!(run.lines(), ["alice  4 messages, 0 in backlog"]);
}

#[test]
fn store_get_and_list() {
    let (sb, script, state) = setup();
    {
        let dir = StateDir::open(&state).unwrap();
        let store = dir.store();
        store
            .set(
                "",
                "config",
                &json!({"extra": {}, "model": "x", "ratio": 0.5, "retries": 3, "tags": []}),
            )
            .unwrap();
        for key in ["ab", "a%b", "a_b", "notes/2", "notes/1", "é"] {
            store.set("", key, &json!(key)).unwrap();
        }
        store.set("docs", "notes/9", &json!(9)).unwrap();
    }
    let file = s(&script);

    let run = sb.colony(&["store", &file, "get", "config"]).ok();
    assert_eq!(
        run.stdout,
        "{\n  \"extra\": {},\n  \"model\": \"x\",\n  \"ratio\": 0.5,\n  \"retries\": 3,\n  \"tags\": []\n}\n"
    );
    let run = sb
        .colony(&["store", &file, "get", "notes/9", "--space", "docs"])
        .ok();
    assert_eq!(run.stdout, "9\n");

    let run = sb.colony(&["store", &file, "list"]).ok();
    assert_eq!(
        run.lines(),
        ["a%b", "a_b", "ab", "config", "notes/1", "notes/2", "é"]
    );
    let run = sb.colony(&["store", &file, "list", "a_"]).ok();
    assert_eq!(run.lines(), ["a_b"]);
    let run = sb.colony(&["store", &file, "list", "a%"]).ok();
    assert_eq!(run.lines(), ["a%b"]);
    let run = sb.colony(&["store", &file, "list", "notes/"]).ok();
    assert_eq!(run.lines(), ["notes/1", "notes/2"]);
    let run = sb.colony(&["store", &file, "list", "--space", "docs"]).ok();
    assert_eq!(run.lines(), ["notes/9"]);
    // Before the file too, where clap suggested `--state` instead.
    let run = sb.colony(&["store", "--space", "docs", &file, "list"]).ok();
    assert_eq!(run.lines(), ["notes/9"]);
    let run = sb.colony(&["store", &file, "list", "zzz"]).ok();
    assert_eq!(run.stdout, "");

    let run = sb.colony(&["store", &file, "get", "notes/9"]).failed();
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        format!(
            "colony store: no key \"notes/9\" in the global space of {}\n",
            s(&state)
        )
    );
    let run = sb
        .colony(&["store", &file, "get", "config", "--space", "docs"])
        .failed();
    assert_eq!(
        run.stderr,
        format!(
            "colony store: no key \"config\" in workspace \"docs\" of {}\n",
            s(&state)
        )
    );
}

#[test]
fn audit_prints_aligned_columns_and_filters() {
    let (sb, script, state) = setup();
    {
        let dir = StateDir::open(&state).unwrap();
        let store = dir.store();
        let entries = [
            (
                1_700_000_000_123,
                "alice",
                "read_file",
                "ab",
                12.34,
                "ok",
                None,
            ),
            (
                1_700_000_001_000,
                "script",
                "http_get",
                "01",
                1500.0,
                "error",
                Some("script.lua:4: the server answered 502\nstack traceback:"),
            ),
            (
                1_700_000_002_500,
                "alice",
                "http_get",
                "ff",
                0.31,
                "deadline",
                Some("the tool did not finish within its deadline of 0.25 s"),
            ),
        ];
        for (at_ms, resident, tool, hash, duration_ms, outcome, message) in entries {
            store
                .audit(&AuditEntry {
                    at_ms,
                    resident: resident.into(),
                    tool: tool.into(),
                    args_hash: hash.repeat(32),
                    duration_ms,
                    outcome: outcome.into(),
                    message: message.map(str::to_string),
                })
                .unwrap();
        }
    }
    let file = s(&script);

    let run = sb.colony(&["audit", &file]).ok();
    assert_eq!(
        run.lines(),
        [
            "TIME                      RESIDENT  TOOL       OUTCOME       MS  ARGS          MESSAGE",
            "2023-11-14T22:13:20.123Z  alice     read_file  ok          12.3  abababababab",
            "2023-11-14T22:13:21.000Z  script    http_get   error     1500.0  010101010101  script.lua:4: the server answered 502\\nstack traceback:",
            "2023-11-14T22:13:22.500Z  alice     http_get   deadline     0.3  ffffffffffff  the tool did not finish within its deadline of 0.25 s",
        ]
    );
    let run = sb.colony(&["audit", &file, "--resident", "alice"]).ok();
    assert_eq!(
        run.lines(),
        [
            "TIME                      RESIDENT  TOOL       OUTCOME     MS  ARGS          MESSAGE",
            "2023-11-14T22:13:20.123Z  alice     read_file  ok        12.3  abababababab",
            "2023-11-14T22:13:22.500Z  alice     http_get   deadline   0.3  ffffffffffff  the tool did not finish within its deadline of 0.25 s",
        ]
    );
    let run = sb
        .colony(&["audit", &file, "--resident", "alice", "--tool", "http_get"])
        .ok();
    assert_eq!(
        run.lines(),
        [
            "TIME                      RESIDENT  TOOL      OUTCOME    MS  ARGS          MESSAGE",
            "2023-11-14T22:13:22.500Z  alice     http_get  deadline  0.3  ffffffffffff  the tool did not finish within its deadline of 0.25 s",
        ]
    );
    let run = sb.colony(&["audit", &file, "--tool", "nothing"]).ok();
    assert_eq!(run.stdout, "");
}

#[test]
fn a_directory_in_use_is_refused_with_the_holder() {
    let (sb, script, state) = setup();
    fill_conversations(&state);
    let held = StateDir::open(&state).unwrap();
    let file = s(&script);
    for args in [
        vec!["conversations", &file, "list"],
        vec!["store", &file, "list"],
        vec!["audit", &file],
    ] {
        let run = sb.colony(&args).failed();
        assert_eq!(run.code, 1);
        let expected = format!(
            "colony {}: {} is in use by process {} (",
            args[0],
            s(&state),
            std::process::id()
        );
        assert!(run.stderr.starts_with(&expected), "{}", run.stderr);
        assert!(run.stderr.trim_end().ends_with(')'), "{}", run.stderr);
    }
    drop(held);
    sb.colony(&["conversations", &file, "list"]).ok();
}

/// One conversation whose row cannot be decoded: `list` still shows the others (and exits 1
/// naming the remedy), and `clear` removes it. Both used to fail on it, so the program that
/// could not start with it could only be mended by editing the SQLite file.
#[test]
fn a_conversation_that_cannot_be_read_is_listed_and_cleared() {
    let (sb, script, state) = setup();
    fill_conversations(&state);
    {
        let conn = rusqlite::Connection::open(state.join(STORE_FILE)).unwrap();
        let changed = conn
            .execute(
                "UPDATE cells SET messages = '{broken' WHERE name = 'alice'",
                [],
            )
            .unwrap();
        assert_eq!(changed, 1);
    }
    let file = s(&script);
    let run = sb.colony(&["conversations", &file, "list"]).failed();
    assert_eq!(run.code, 1);
    let lines = run.lines();
    assert_eq!(lines.len(), 2, "{}", run.stdout);
    assert!(
        lines[0].starts_with("alice  cannot be read: ")
            && lines[0].contains("the conversation of \"alice\" is not what colony wrote"),
        "{}",
        run.stdout
    );
    assert_eq!(
        lines[1],
        "bob    0 messages, 1 in backlog, 1 call in flight"
    );
    assert!(
        run.stderr.contains(
            "colony conversations: 1 conversation cannot be read; `colony conversations ... \
             clear NAME` removes one"
        ),
        "{}",
        run.stderr
    );

    let run = sb.colony(&["conversations", &file, "clear", "alice"]).ok();
    assert!(
        run.stdout
            .starts_with("removed conversation alice (it could not be read: ")
            && run.stdout.contains("is not what colony wrote"),
        "{}",
        run.stdout
    );
    let run = sb.colony(&["conversations", &file, "list"]).ok();
    assert_eq!(
        run.lines(),
        ["bob  0 messages, 1 in backlog, 1 call in flight"]
    );
}

#[test]
fn a_store_from_a_newer_colony_is_refused_and_untouched() {
    let (sb, script, state) = setup();
    fill_conversations(&state);
    let db = state.join(STORE_FILE);
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.pragma_update(None, "user_version", 999).unwrap();
    }
    let before = std::fs::read(&db).unwrap();
    let run = sb.colony(&["conversations", &s(&script), "list"]).failed();
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.starts_with(&format!(
            "colony conversations: {} was written by a newer colony (store schema version 999;",
            s(&db)
        )),
        "{}",
        run.stderr
    );
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[test]
fn a_damaged_store_is_refused_and_untouched() {
    let (sb, script, state) = setup();
    std::fs::create_dir_all(&state).unwrap();
    let db = state.join(STORE_FILE);
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 31 + 7) as u8).collect();
    std::fs::write(&db, &garbage).unwrap();
    let run = sb.colony(&["store", &s(&script), "list"]).failed();
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        format!(
            "colony store: {} is not a colony store (not an SQLite database); it was left as it is\n",
            s(&db)
        )
    );
    assert_eq!(std::fs::read(&db).unwrap(), garbage);
}

/// `colony run` opens the store on a thread of its own while it builds the VM; nothing of the
/// script may run before the store is open, or at all when it cannot be opened.
#[test]
fn a_run_whose_store_cannot_be_opened_runs_nothing_of_the_script() {
    let sb = Sandbox::new();
    let script = sb.write(
        "marks.lua",
        "fs.write('ran.txt', 'yes')\nstore.set('k', 1)\nprint('ran')\n",
    );
    let ran = script.with_file_name("ran.txt");
    let state = state_dir::default_under(&sb.state_home(), &script);
    std::fs::create_dir_all(&state).unwrap();

    // Held by another process.
    let held = StateDir::open(&state).unwrap();
    let run = sb.colony(&["run", &s(&script)]).failed();
    assert_eq!(run.code, 1);
    let expected = format!(
        "colony: {} is in use by process {} (",
        s(&state),
        std::process::id()
    );
    assert!(run.stderr.starts_with(&expected), "{}", run.stderr);
    assert_eq!(run.stdout, "");
    assert!(!ran.exists(), "the script ran while its store was held");
    drop(held);

    // Damaged.
    let db = state.join(STORE_FILE);
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 31 + 7) as u8).collect();
    std::fs::write(&db, &garbage).unwrap();
    let run = sb.colony(&["run", &s(&script)]).failed();
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        format!(
            "colony: {} is not a colony store (not an SQLite database); it was left as it is\n",
            s(&db)
        )
    );
    assert_eq!(run.stdout, "");
    assert!(!ran.exists(), "the script ran on a damaged store");
    assert_eq!(std::fs::read(&db).unwrap(), garbage);

    // Once the store can be opened, the script runs and its first line reaches the store.
    std::fs::remove_file(&db).unwrap();
    let run = sb.colony(&["run", &s(&script)]).ok();
    assert_eq!(run.stdout, "ran\n");
    assert!(ran.exists());
    let state = StateDir::open(&state).unwrap();
    assert_eq!(state.store().get("", "k").unwrap(), Some(json!(1)));
}

/// `colony run` starts opening its store before it builds its runtime, but only once what it
/// reads first is good: a config file it cannot read, a cassette that is not there or a program
/// that is not there is reported with no state directory made and no store touched.
#[test]
fn a_run_that_cannot_start_makes_no_store() {
    let sb = Sandbox::new();
    let script = sb.write("p.lua", "print('ran')\n");
    let state = state_dir::default_under(&sb.state_home(), &script);

    let config = sb.write("config.toml", "[providers.openai\n");
    let run = sb.colony(&["run", &s(&script)]).failed();
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains(&s(&config)), "{}", run.stderr);
    assert_eq!(run.stdout, "");
    std::fs::remove_file(&config).unwrap();

    let cassette = sb.path("missing.cassette.jsonl");
    let run = sb
        .colony(&[
            "run",
            "--replay",
            &s(&cassette),
            "--state",
            &s(&state),
            &s(&script),
        ])
        .failed();
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains(&s(&cassette)), "{}", run.stderr);

    let run = sb.colony(&["run", &s(&sb.path("absent.lua"))]).failed();
    assert_eq!(run.code, 2, "{}", run.stderr);

    assert!(
        !state.exists(),
        "a state directory was made for a run that could not start"
    );
    assert!(
        !sb.state_home().exists(),
        "a state directory was made for a run that could not start"
    );

    // With all three good, the same run makes its store.
    let run = sb.colony(&["run", &s(&script)]).ok();
    assert_eq!(run.stdout, "ran\n");
    assert!(state.join(STORE_FILE).exists());
}

#[test]
fn an_empty_store_file_is_refused_and_untouched() {
    let (sb, script, state) = setup();
    std::fs::create_dir_all(&state).unwrap();
    let db = state.join(STORE_FILE);
    std::fs::write(&db, b"").unwrap();
    let run = sb.colony(&["store", &s(&script), "list"]).failed();
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        format!(
            "colony store: {} is empty (0 bytes): a colony store is never empty once opened, so \
             its contents were lost or it is not a store; it was left as it is (remove it to \
             start afresh)\n",
            s(&db)
        )
    );
    assert_eq!(std::fs::read(&db).unwrap(), b"");
}

#[test]
fn no_state_yet_is_an_error_that_creates_nothing() {
    let (sb, script, state) = setup();
    let run = sb.colony(&["audit", &s(&script)]).failed();
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        format!(
            "colony audit: no state in {} ({} has stored nothing yet)\n",
            s(&state),
            s(&script)
        )
    );
    assert!(!state.exists());

    let elsewhere = sb.path("empty-state");
    let run = sb
        .colony(&["store", "x.lua", "--state", &s(&elsewhere), "list"])
        .failed();
    assert_eq!(
        run.stderr,
        format!(
            "colony store: no state in {} (no {STORE_FILE} there)\n",
            s(&elsewhere)
        )
    );
    assert!(!elsewhere.exists());
    // A file given for the folder is named so (it said "no store.sqlite3 there").
    let file = sb.write("a-file", "");
    let run = sb
        .colony(&["store", "x.lua", "--state", &s(&file), "list"])
        .failed();
    assert_eq!(
        run.stderr,
        format!(
            "colony store: no state in {} (it is a file, not a state directory)\n",
            s(&file)
        )
    );
    // Bad input, status 2, as on `colony run` (it was 1).
    assert_eq!(run.code, 2);
}

#[test]
fn a_config_value_the_store_does_not_use_is_noted_and_the_store_still_read() {
    let (sb, script, state) = setup();
    {
        let dir = StateDir::open(&state).unwrap();
        dir.store().set("", "notes/1", &json!("kept")).unwrap();
    }
    sb.write("config.toml", "[use.general]\nprovider = \"nope\"\n");
    let run = sb.colony(&["store", &s(&script), "get", "notes/1"]).ok();
    assert_eq!(run.stdout, "\"kept\"\n");
    assert!(
        run.stderr.starts_with("colony store: note: ")
            && run
                .stderr
                .contains("[use.general] provider = \"nope\" is not a known provider")
            && run.stderr.ends_with("(only [store] is read here)\n"),
        "{}",
        run.stderr
    );

    // A file that is not the config's TOML at all is still refused.
    sb.write("config.toml", "[use.general\n");
    let run = sb.colony(&["audit", &s(&script)]).failed();
    assert!(run.stderr.starts_with("colony audit: "), "{}", run.stderr);
}

/// `[store] keep_audit = "1d"`: a program removes the audit lines older than a day from its
/// store (the log grew with every tool call for as long as a service ran) and keeps the newer
/// ones, one with a watch or without; without the setting every line stays.
#[test]
fn a_program_removes_audit_lines_past_keep_audit() {
    let (sb, _, _) = setup();
    let script = sb.write(
        "watcher.lua",
        "ai.spawn{ name = 'w', provider = 'openai', model = 'm', sources = {\n\
           function() ai.stop() end } }\n\
         ai.watch{}\n",
    );
    let state = state_dir::default_under(&sb.state_home(), &script);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let day = 24 * 3600 * 1000;
    let line = |at_ms: u64, tool: &str| AuditEntry {
        at_ms,
        resident: "w".into(),
        tool: tool.into(),
        args_hash: "0".repeat(64),
        duration_ms: 1.0,
        outcome: "ok".into(),
        message: None,
    };
    {
        let store = StateDir::open(&state).unwrap().dyn_store();
        store
            .audit_all(&[
                line(now - 40 * day, "ancient"),
                line(now - 2 * day, "old"),
                line(now - 3_600_000, "recent"),
            ])
            .unwrap();
    }
    let tools = |sb: &Sandbox| -> Vec<String> {
        let run = sb.colony(&["audit", &s(&script)]).ok();
        run.lines()
            .iter()
            .skip(1)
            .map(|l| l.split_whitespace().nth(2).unwrap_or("").to_string())
            .collect()
    };
    // Without the setting, nothing goes.
    sb.colony(&["run", "--max-time", "60", &s(&script)]).ok();
    assert_eq!(tools(&sb), ["ancient", "old", "recent"]);
    sb.write("config.toml", "[store]\nkeep_audit = \"1d\"\n");
    sb.colony(&["run", "--max-time", "60", &s(&script)]).ok();
    assert_eq!(tools(&sb), ["recent"]);
    // A script without a watch (a report run from cron) prunes too.
    {
        let store = StateDir::open(&state).unwrap().dyn_store();
        store.audit_all(&[line(now - 3 * day, "stale")]).unwrap();
    }
    assert_eq!(tools(&sb), ["recent", "stale"]);
    sb.write("watcher.lua", "print('report')\n");
    sb.colony(&["run", "--max-time", "60", &s(&script)]).ok();
    assert_eq!(tools(&sb), ["recent"]);
    // A keep that does not read is named when the config is read.
    sb.write("config.toml", "[store]\nkeep_audit = \"a month\"\n");
    let run = sb.colony(&["run", &s(&script)]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("[store] keep_audit"), "{}", run.stderr);
}

/// A store this user may not write (left owned by root by an earlier `sudo colony run`) is
/// refused at open, naming the file and its owner: SQLite opened it read-only without a word,
/// and the program ran on refusing every mail as `not_saved` (a service showed it ready).
#[test]
fn a_store_this_user_may_not_write_is_refused_at_open() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let sb = Sandbox::new();
    let script = sb.write("w.lua", "store.set('a', 1)\nprint('saved')\n");
    let state = sb.path("st");
    let first = sb.colony(&["run", "--state", &s(&state), &s(&script)]).ok();
    assert_eq!(first.stdout.trim(), "saved");
    let store = state.join(STORE_FILE);
    let root = unsafe { libc::geteuid() } == 0;
    let mut again = sb.command(&["run", "--state", &s(&state), &s(&script)]);
    if root {
        // Root writes anything: the run is another user's, to whom the folder and its lock
        // belong, the store not. That user runs a copy of the binary from the sandbox (the
        // checkout's folders may be closed to it), in the sandbox.
        const NOBODY: u32 = 65534;
        let open = |p: &Path| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
        open(&sb.path("")).unwrap();
        for p in [&state, &state.join("lock")] {
            std::os::unix::fs::chown(p, Some(NOBODY), None).unwrap();
        }
        let copy = sb.path("colony");
        std::fs::copy(env!("CARGO_BIN_EXE_colony"), &copy).unwrap();
        open(&copy).unwrap();
        again = std::process::Command::new(&copy);
        again
            .args(["run", "--state", &s(&state), &s(&script)])
            .current_dir(sb.path(""))
            .env_clear()
            .env("COLONY_CONFIG", sb.path("config.toml"))
            .env("HOME", sb.path(""))
            .uid(NOBODY)
            .gid(NOBODY);
    } else {
        std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o444)).unwrap();
    }
    let out = again.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("{} cannot be written by this user", s(&store))),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("saved"));
}

/// A store that cannot be opened because the disk is full says so: SQLite's "disk I/O error"
/// (it cannot make its -shm and -wal) sent people looking for failing hardware. On a small
/// tmpfs in a mount namespace of the test's own (`unshare -rm`: no root needed where user
/// namespaces are allowed).
#[test]
fn a_store_on_a_full_disk_says_the_disk_is_full() {
    let sb = Sandbox::new();
    let script = sb.write("w.lua", "store.set('a', 1)\nprint('saved')\n");
    let small = sb.path("small");
    std::fs::create_dir(&small).unwrap();
    let shell = format!(
        r#"set -e
mount -t tmpfs -o size=512k tmpfs "{small}"
"$COLONY" run --state "{small}/st" "{script}"
dd if=/dev/zero of="{small}/fill" bs=4k 2>/dev/null || true
"$COLONY" run --state "{small}/st" "{script}" && echo "ran on a full disk"
exit 0"#,
        small = s(&small),
        script = s(&script),
    );
    let out = std::process::Command::new("unshare")
        .args(["-rm", "sh", "-c", &shell])
        .env("COLONY", env!("CARGO_BIN_EXE_colony"))
        .env("COLONY_CONFIG", sb.path("config.toml"))
        .output()
        .expect("unshare runs (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "`unshare -rm` needs user namespaces: {stderr}"
    );
    assert_eq!(stdout.trim(), "saved", "{stderr}");
    assert!(stderr.contains("no space left on the disk"), "{stderr}");
}

/// `--state DIR` is the store, whatever the config's `[store] url`: the URL took its place
/// without a word (a reading command then failed on a database it was never asked about, and a
/// run would have read and written a shared one). `--store` given too is the store.
#[test]
fn a_state_directory_given_outright_wins_over_the_configs_store_url() {
    let sb = Sandbox::new();
    sb.write(
        "config.toml",
        "[store]\nurl = \"postgres://nobody@127.0.0.1:1/none\"\n",
    );
    let script = sb.write("notes.lua", "store.set('n/1', 'kept')\nprint('saved')\n");
    let dir = sb.path("chosen");
    let run = sb.colony(&["run", "--state", &s(&dir), &s(&script)]).ok();
    assert_eq!(run.stdout, "saved\n", "{}", run.stderr);
    let run = sb
        .colony(&["store", &s(&script), "--state", &s(&dir), "get", "n/1"])
        .ok();
    assert_eq!(run.stdout, "\"kept\"\n", "{}", run.stderr);
    // A file given as the state directory is bad input, status 2 (it was 1).
    let run = sb.colony(&["run", "--state", &s(&script), &s(&script)]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("the state directory is a file, not a folder"),
        "{}",
        run.stderr
    );
    // Given with --store too, the URL's store is the one (as the crash test runs it): here
    // one that cannot be reached, named.
    let run = sb.colony(&[
        "audit",
        "--state",
        &s(&dir),
        "--store",
        "postgres://nobody@127.0.0.1:1/none",
        &s(&script),
    ]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("postgres://nobody@127.0.0.1:1/none"),
        "{}",
        run.stderr
    );
}

/// An audit log with nothing to show says so on stderr, stdout left empty for a pipe: nothing
/// at all read as a command that had not worked.
#[test]
fn an_empty_audit_log_is_said() {
    let (sb, script, state) = setup();
    sb.colony(&["run", &s(&script)]).ok();
    let run = sb.colony(&["audit", &s(&script)]).ok();
    assert_eq!(run.stdout, "");
    assert_eq!(
        run.stderr,
        format!("colony audit: no tool calls logged in {}\n", s(&state))
    );
    let run = sb
        .colony(&["audit", &s(&script), "--resident", "a", "--tool", "t"])
        .ok();
    assert_eq!(
        run.stderr,
        format!(
            "colony audit: no tool calls logged matching --resident a --tool t in {}\n",
            s(&state)
        )
    );
}
