//! Every subcommand with its stdout closed before it starts (`colony config list | head -0`):
//! it ends quietly with status 0, nothing on stderr, never a panic. One test per subcommand that
//! `colony --help` lists; the first test checks that the list here is that list.

mod support;

use std::process::Stdio;

use colony::residents::Mail;
use colony::store::state_dir::{self, StateDir};
use colony::store::{AuditEntry, Store};
use colony::vocab::Message;
use serde_json::json;
use support::fake::{FakeProvider, Reply};
use support::script::{Run, Sandbox};

/// The subcommands these tests cover, as `colony --help` lists them.
const COVERED: &[&str] = &[
    "run",
    "ask",
    "chat",
    "scripts",
    "providers",
    "models",
    "config",
    "state",
    "conversations",
    "store",
    "audit",
    "usage",
    "mcp",
    "tools",
    "serve",
    "help",
];

/// Runs `colony ARGS...` with a stdout whose reading end is closed before the process starts.
fn closed(sb: &Sandbox, args: &[&str]) -> Run {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = sb
        .command(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("the colony binary runs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::new(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Ends quietly: status 0, nothing on stderr.
#[track_caller]
fn quiet(sb: &Sandbox, args: &[&str]) {
    let run = closed(sb, args);
    assert_eq!(
        (run.code, run.stderr.as_str()),
        (0, ""),
        "colony {}",
        args.join(" ")
    );
}

/// A script with a state directory that holds a conversation, a backlog, a key and an audit line.
fn filled() -> (Sandbox, String) {
    let sb = Sandbox::new();
    let script = sb.write("watcher.lua", "print('hi')\n");
    let dir = state_dir::default_under(&sb.state_home(), &script);
    let state = StateDir::open(&dir).unwrap();
    let store = state.store();
    let messages: Vec<Message> = (0..200)
        .map(|i| Message::user(format!("message {i}")))
        .collect();
    store.commit_step("alice", &messages, &[], 0).unwrap();
    store
        .push_backlog("alice", &Mail::new("alice", "carol", "are you there?", 0))
        .unwrap();
    for i in 0..200 {
        store.set("", &format!("key/{i}"), &json!(i)).unwrap();
        store
            .audit(&AuditEntry {
                at_ms: 1_700_000_000_000 + i,
                resident: "alice".into(),
                tool: "read_file".into(),
                args_hash: "ab".repeat(32),
                duration_ms: 1.0,
                outcome: "error".into(),
                message: Some("no such file".into()),
            })
            .unwrap();
        let at = chrono::DateTime::from_timestamp(1_700_000_000 + i as i64 * 3600, 0).unwrap();
        let usage = colony::vocab::Usage {
            input: 10,
            output: 5,
            ..Default::default()
        };
        let spent = colony::residents::budget::Spent::of(&usage, Some(0.01));
        colony::residents::budget::record(&*store, "alice", at, &spent).unwrap();
    }
    (sb, script.display().to_string())
}

#[test]
fn the_list_covers_every_subcommand() {
    let help = Sandbox::new().colony(&["--help"]).ok();
    let listed: Vec<&str> = help
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(listed, COVERED);
}

#[test]
fn run() {
    let sb = Sandbox::new();
    let file = sb.write(
        "loud.lua",
        "for i = 1, 10000 do print(i) end io.write('end\\n') print(io.stdout:write('x'))\n",
    );
    quiet(&sb, &["run", &file.display().to_string()]);
}

/// A script's own error is said, with its status, though nobody reads stdout (`colony run
/// bad.lua | true`): it exited 0 with the error unsaid whenever the reader went first (4 runs
/// of 5), and then 130 ("ended by stdout closed") when the end came as the script raised. The
/// script raises as soon as a write finds the reader gone, as the end of the run begins.
#[test]
fn run_that_fails_says_so() {
    use std::io::Read;
    let sb = Sandbox::new();
    let file = sb.write(
        "bad.lua",
        "print('ready') io.stdout:flush()\n\
         while io.stdout:write(string.rep('x', 4096)) and io.stdout:flush() do end\n\
         error('boom')\n",
    );
    for _ in 0..3 {
        let mut child = sb
            .command(&["run", &file.display().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the colony binary runs");
        let mut out = child.stdout.take().unwrap();
        let mut ready = [0u8; 6];
        out.read_exact(&mut ready).unwrap();
        assert_eq!(&ready, b"ready\n");
        drop(out);
        let mut err = child.stderr.take().unwrap();
        let said = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let status = support::exits_within_a_minute(&mut child, "the run whose reader went");
        let stderr = said.join().unwrap();
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("bad.lua:3: boom"), "{stderr}");
    }
}

#[test]
fn run_without_end() {
    let sb = Sandbox::new();
    let looping = sb.write("loop.lua", "while true do print('tick') ai.sleep(20) end\n");
    quiet(
        &sb,
        &["run", "--max-time", "60", &looping.display().to_string()],
    );
    let watching = sb.write(
        "watch.lua",
        "ai.spawn{ name = 'w', sources = { function() while true do ai.sleep(50) end end } }\n\
         print(ai.watch{})\n",
    );
    quiet(
        &sb,
        &["run", "--max-time", "60", &watching.display().to_string()],
    );
}

/// A run whose stdout is a pipe closes its store when it ends, whether the pipe's reader stays
/// or goes: its log copied into the file and removed, what it wrote there. The thread watching
/// stdout held the program, and the store open, to the process's end: every run piped into
/// another program (`colony run p.lua | tee log`) left `store.sqlite3-wal` and `-shm` beside
/// the store, with what was written without a sync never synced.
#[test]
fn run_closes_its_store_whether_stdout_is_read_or_not() {
    let sb = Sandbox::new();
    let once = sb.write("once.lua", "store.set('k', 'once') print('done')\n");
    let looping = sb.write(
        "loop.lua",
        "store.set('k', 'looped') while true do print('tick') ai.sleep(20) end\n",
    );
    let read = sb.path("read");
    let gone = sb.path("gone");
    let run = sb
        .colony(&[
            "run",
            "--state",
            &read.display().to_string(),
            &once.display().to_string(),
        ])
        .ok();
    assert_eq!(run.lines(), ["done"]);
    // `| head -1`: the reader takes the first line, written after the key, and goes. (A stdout
    // closed before the start may stop the program before its first line runs, by design:
    // the key was then never set, and this test failed about once in a dozen runs.)
    {
        use std::io::BufRead;
        let mut child = sb
            .command(&[
                "run",
                "--max-time",
                "60",
                "--state",
                &gone.display().to_string(),
                &looping.display().to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the colony binary runs");
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert_eq!(first, "tick\n");
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).as_ref()
            ),
            (Some(0), "")
        );
    }
    for (dir, value) in [(&read, "once"), (&gone, "looped")] {
        let left = support::left_open(dir);
        assert!(left.is_empty(), "left beside {}: {left:?}", dir.display());
        let state = StateDir::open(dir).unwrap();
        assert_eq!(state.store().get("", "k").unwrap(), Some(json!(value)));
    }
}

#[test]
fn ask() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text(
        "A circuit breaker stops calls to a failing service.",
    ));
    quiet(
        &support::styled(&fake, "anthropic"),
        &["ask", "What is a circuit breaker?"],
    );
}

/// An answer that would stream for hours (a word every 100 ms): `colony ask | head -c1` (and
/// `colony chat`) ends at the first word that finds the reader gone, quietly, with 0. It used
/// to read the whole answer (or up to the use-type's timeout) and print nothing. A minute
/// without its end fails the test instead of hanging it.
/// The chat keeps the question and what had arrived, marked, as Ctrl-C does: it exited at
/// once and kept nothing (`colony chat "..." | head -1` lost the exchange the user paid for).
#[test]
fn ask_ends_when_its_reader_goes_mid_stream() {
    let fake = FakeProvider::start();
    ends_when_its_reader_goes_mid_stream(&fake, &["ask", "Tell me everything."]);
    let sb = ends_when_its_reader_goes_mid_stream(&fake, &["chat", "--new", "Tell me everything."]);
    let history = sb.colony(&["chat", "--history"]).ok();
    assert!(
        history.stdout.contains("> Tell me everything.")
            && history.stdout.contains("word")
            && history.stdout.contains("[interrupted: stdout closed]"),
        "{}",
        history.stdout
    );
}

fn ends_when_its_reader_goes_mid_stream(fake: &FakeProvider, args: &[&str]) -> Sandbox {
    fake.set_default(Reply::text("word ".repeat(100_000)).stream_delay(100));
    let sb = support::styled(fake, "anthropic");
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let mut child = sb
        .command(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("the colony binary runs");
    let status = support::exits_within_a_minute(
        &mut child,
        &format!("colony {} still reads an answer nobody will see", args[0]),
    );
    let mut stderr = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!((status.code(), stderr.as_str()), (Some(0), ""));
    sb
}

#[test]
fn chat() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("Paris is the capital of France."));
    let sb = support::styled(&fake, "anthropic");
    quiet(&sb, &["chat", "What is the capital of France?"]);
    quiet(&sb, &["chat", "--history"]);
}

#[test]
fn scripts() {
    let sb = Sandbox::new();
    quiet(&sb, &["scripts"]);
    quiet(&sb, &["scripts", "cat", "chat"]);
}

#[test]
fn providers() {
    quiet(&Sandbox::new(), &["providers"]);
}

#[test]
fn models() {
    let fake = FakeProvider::start();
    quiet(&support::styled(&fake, "openai"), &["models", "openai"]);
}

#[test]
fn config() {
    let sb = Sandbox::new();
    sb.colony(&["config", "set", "general", "provider", "anthropic"])
        .ok();
    quiet(&sb, &["config", "list"]);
    quiet(&sb, &["config", "set", "code", "model", "gpt-4.1"]);
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("pong"));
    quiet(
        &support::styled(&fake, "anthropic"),
        &["config", "test", "general"],
    );
}

#[test]
fn state() {
    let (sb, script) = filled();
    quiet(&sb, &["state", &script]);
}

#[test]
fn conversations() {
    let (sb, script) = filled();
    quiet(&sb, &["conversations", &script, "list"]);
    quiet(&sb, &["conversations", &script, "show", "alice"]);
    quiet(&sb, &["conversations", &script, "export", "alice"]);
}

#[test]
fn store() {
    let (sb, script) = filled();
    quiet(&sb, &["store", &script, "list"]);
    quiet(&sb, &["store", &script, "get", "key/7"]);
}

#[test]
fn audit() {
    let (sb, script) = filled();
    quiet(&sb, &["audit", &script]);
}

#[test]
fn usage() {
    let (sb, script) = filled();
    quiet(&sb, &["usage", &script]);
}

#[test]
fn mcp() {
    let sb = Sandbox::new();
    for i in 0..50 {
        sb.colony(&[
            "mcp",
            "add",
            &format!("server{i}"),
            "http://127.0.0.1:9/mcp",
        ])
        .ok();
    }
    quiet(&sb, &["mcp", "list"]);
}

#[test]
fn tools() {
    let sb = Sandbox::new();
    quiet(&sb, &["tools", "list"]);
    quiet(&sb, &["tools", "clear"]);
}

#[test]
fn help() {
    let sb = Sandbox::new();
    quiet(&sb, &["help"]);
    quiet(&sb, &["--help"]);
    quiet(&sb, &["help", "run"]);
    quiet(&sb, &["--version"]);
}

/// A service whose stdout is closed keeps serving: the address line is lost, not the service. It
/// is read from the log on stderr instead; SIGTERM then ends it with status 0.
#[test]
fn serve() {
    use std::io::{BufRead, BufReader};
    let sb = Sandbox::new().env("RUST_LOG", "colony=info");
    let state = sb.path("state").display().to_string();
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let mut child = sb
        .command(&[
            "serve",
            "examples/service/desk.lua",
            "--listen",
            "127.0.0.1:0",
        ])
        .env("XDG_STATE_HOME", &state)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("colony serve starts");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut seen = String::new();
    for line in (&mut err).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("listening") {
            addr = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("local="))
                .map(str::to_string);
            break;
        }
    }
    let addr = addr.unwrap_or_else(|| panic!("no listening line on stderr:\n{seen}"));
    let mut stream = std::net::TcpStream::connect(&addr).expect("the service answers");
    use std::io::{Read, Write};
    write!(
        stream,
        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // Drain stderr so the process never blocks on it, then wait.
    std::thread::spawn(move || for _ in err.lines() {});
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// stderr closed too (`2>&1 | head -1`): a message colony had to print there panicked (exit
/// 101). Nothing panics, and a command that failed keeps its status (it exited 0, a failure
/// reported as success): the script's error 1, a bad invocation 2, a missing file 2. The
/// wizard (`colony config`) meets the closed stdout first, and ends as a command whose reader
/// is gone does, 0.
#[test]
fn stderr_closed_too() {
    let sb = Sandbox::new();
    let file = sb.write("fails.lua", "print('a line') error('boom')\n");
    let file = file.display().to_string();
    for (args, code) in [
        (&["run", file.as_str()][..], 1),
        (&["config"], 0),
        (&["config", "get"], 2),
        (&["run", "no-such.lua"], 2),
        (&["--help"], 0),
    ] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let status = sb
            .command(args)
            .stdin(Stdio::null())
            .stdout(writer.try_clone().unwrap())
            .stderr(writer)
            .status()
            .expect("the colony binary runs");
        assert_eq!(status.code(), Some(code), "colony {}", args.join(" "));
    }
}

/// A run ended by `--max-time` while its script waits outside Lua (an `io.read`) keeps its
/// status 124 with stderr closed: the last resort said why with `eprintln!`, whose panic on
/// the closed stderr is the quiet exit 0.
#[test]
fn a_run_ended_where_it_waits_keeps_its_status_with_stderr_closed() {
    let sb = Sandbox::new();
    let file = sb.write("block.lua", "io.read('l')\n");
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let mut child = sb
        .command(&["run", "--max-time", "1", &file.display().to_string()])
        .stdin(Stdio::piped())
        // stdout to a file (`2>&1 >out.txt | true`): a closed stdout pipe would end the run
        // itself, quietly, as its reader going away does.
        .stdout(Stdio::null())
        .stderr(writer)
        .spawn()
        .expect("the colony binary runs");
    // Held open: the read waits for it (`wait` would close it, and the read would end).
    let _stdin = child.stdin.take();
    let status = support::exits_within_a_minute(&mut child, "the run ended by --max-time");
    assert_eq!(status.code(), Some(124));
}

/// A stdout that cannot be written for another reason (a full disk: `/dev/full`) is a failure
/// said in one line, status 1: the output is incomplete. It was a panic with a backtrace,
/// status 101, and for a help text (clap writes it) a success with nothing written.
#[test]
fn a_stdout_that_fails_otherwise_is_a_failure_said_in_one_line() {
    let (sb, script) = filled();
    let help = [
        vec!["--help"],
        vec!["help", "run"],
        vec!["run", "--help"],
        vec!["--version"],
    ];
    for args in [vec!["audit", script.as_str()], vec!["scripts"]]
        .into_iter()
        .chain(help)
    {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let out = sb
            .command(&args)
            .stdin(Stdio::null())
            .stdout(full)
            .stderr(Stdio::piped())
            .output()
            .expect("the colony binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim(),
            "colony: cannot write to stdout: No space left on device (os error 28)",
            "{args:?}"
        );
    }
}
