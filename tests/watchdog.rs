//! Lua code that never waits cannot freeze a program: a spinning tool handler is stopped at its
//! deadline (even inside `pcall`) while other residents serve, SIGINT and SIGTERM stop a program
//! whose tool or source spins, and a spinning main chunk. Through the binary, against the fake
//! provider on loopback.

mod support;

use std::io::{BufRead, BufReader};
use std::time::Duration;

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::styled;

/// The content of every tool result the fake was sent (OpenAI style).
fn tool_results(fake: &FakeProvider) -> Vec<String> {
    support::model_calls(fake)
        .iter()
        .flat_map(|body| body["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn after_tool(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .is_some_and(|ms| ms.iter().any(|m| m["role"] == "tool"))
}

fn system_of(body: &Value) -> String {
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_spinning_tool_ends_its_turn_with_a_deadline_while_another_resident_serves() {
    let fake = FakeProvider::start();
    fake.set_responder(
        |body, _| match (system_of(body).as_str(), after_tool(body)) {
            ("spinner", false) => Reply::tool_call("c1", "spin", json!({})),
            ("spinner", true) => Reply::text("spin gave up"),
            (_, false) => Reply::tool_call("c2", "echo", json!({"text": "hello"})),
            (_, true) => Reply::text("echoed"),
        },
    );
    let sb = styled(&fake, "openai");
    let run = sb
        .lua(
            r#"
local spin = ai.tool{ name = "spin", parameters = {}, timeout = 1, handler = function()
  -- pcall cannot catch the stop
  while true do pcall(function() local x = 0 for i = 1, 100 do x = x + i end end) end
end }
local echo = ai.tool{ name = "echo", parameters = { text = "string" },
  handler = function(args) return args.text end }
local done = 0
local function deliver(reply, info)
  print(info.ai .. ": " .. reply)
  done = done + 1
  if done == 2 then ai.stop("both served") end
end
for _, name in ipairs{ "spinner", "other" } do
  ai.spawn{ name = name, system = name, provider = "openai", model = "m",
    tools = { name == "spinner" and spin or echo }, deliver_to = deliver,
    sources = { function(self) ai.mail{ to = self, source = "desk", content = "go", hop = 0 } end } }
end
print(ai.watch{})
"#,
            &["--max-time", "120"],
        )
        .ok();
    let mut lines = run.lines();
    lines.sort();
    assert_eq!(
        lines,
        ["both served", "other: echoed", "spinner: spin gave up"],
        "{}",
        run.stderr
    );
    let mut results = tool_results(&fake);
    results.sort();
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[1], "hello");
    assert_eq!(
        results[0],
        "Error: the tool did not finish within its deadline of 1 s"
    );
}

/// Runs a script whose tool `spin` (timeout 0.5 s) has `handler` as its body, in the script's
/// own turn, then `after`; returns what it printed and the tool results the model was sent.
fn own_turn_with_spinning_tool(handler: &str, after: &str) -> (Vec<String>, Vec<String>) {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "spin", json!({})));
    fake.push(Reply::text("it gave up"));
    let sb = styled(&fake, "openai");
    sb.write("config.toml", "[use.general]\nprovider = \"openai\"\n");
    let script = format!(
        r#"
local spin = ai.tool{{ name = "spin", parameters = {{}}, timeout = 0.5, handler = function()
{handler}
end }}
local r = ai.take_turn{{ prompt = "go", tools = {{ spin }} }}
print(r.reply)
for _, e in ipairs(r.tool_events) do print(e.name, e.kind) end
{after}
"#
    );
    let run = sb.lua(&script, &["--max-time", "120"]).ok();
    let lines = run.lines().iter().map(|l| l.to_string()).collect();
    (lines, tool_results(&fake))
}

const DEADLINE_RESULT: &str = "Error: the tool did not finish within its deadline of 0.5 s";

#[test]
fn a_spinning_tool_in_the_scripts_own_turn_is_stopped_at_its_timeout() {
    let (lines, results) = own_turn_with_spinning_tool(
        "while true do end",
        "-- the program goes on: its VM is free again\nprint(#string.rep(\"x\", 10))",
    );
    assert_eq!(lines, ["it gave up", "spin\tdeadline", "10"]);
    assert_eq!(results, [DEADLINE_RESULT]);
}

/// A handler held past its deadline in code the hook cannot stop (a command run by os.execute;
/// a backtracking string.find is the same) on the thread the script's own turn runs on: it ends
/// late, and its call is the deadline's. It was `ok`, its result read as on time.
#[test]
fn a_tool_held_past_its_timeout_outside_lua_is_a_deadline() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "spin", json!({})));
    fake.push(Reply::text("it gave up"));
    let sb = styled(&fake, "openai");
    sb.write("config.toml", "[use.general]\nprovider = \"openai\"\n");
    let script = r#"
local spin = ai.tool{ name = "spin", parameters = {}, timeout = 0.5, handler = function()
  os.execute("sleep 1.5")
  return "slept"
end }
local r = ai.take_turn{ prompt = "go", tools = { spin } }
print(r.reply)
for _, e in ipairs(r.tool_events) do print(e.name, e.kind) end
"#;
    let run = sb.lua(script, &["--max-time", "120", "--allow-run"]).ok();
    assert_eq!(
        run.lines(),
        ["it gave up", "spin\tdeadline"],
        "{}",
        run.stderr
    );
    assert_eq!(tool_results(&fake), [DEADLINE_RESULT]);
}

/// A tool called directly (`tool(args)`, from the script or another tool) keeps its timeout:
/// one that waits past it ends with an error the caller can catch, one that spins is stopped.
/// Both ran on (a spinning one for good, the program at 100 % CPU until it was killed).
#[test]
fn a_tool_called_directly_keeps_its_timeout() {
    let sb = Sandbox::new();
    let run = sb
        .lua(
            r#"
local waits = ai.tool{ name = "waits", parameters = {}, timeout = 0.5,
  handler = function() ai.sleep(30000) return "slept" end }
local ok, e = pcall(waits, {})
print(ok, tostring(e):match("deadline: .*$"))
local spins = ai.tool{ name = "spins", parameters = {}, timeout = 0.5,
  handler = function() while true do end end }
local ok, e = pcall(spins, {})
print(ok, tostring(e):match("spins: deadline: .*$"))
spins({})
print("not reached")
"#,
            &["--max-time", "120"],
        )
        .failed();
    // The spinning one's stop is its call's error, which `pcall` catches (it ended the whole
    // program through the `pcall`, with two tracebacks).
    assert_eq!(
        run.lines(),
        [
            "false\tdeadline: it did not finish within its timeout of 0.5 s",
            "false\tspins: deadline: it ran past its timeout of 0.5 s without finishing"
        ],
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("deadline"), "{}", run.stderr);
    assert_ne!(run.code, 124, "stopped by --max-time: {}", run.stderr);
}

#[test]
fn a_tool_spinning_inside_a_coroutine_it_made_is_stopped_and_cannot_catch_it() {
    // The watchdog hooks a coroutine the script made only while it is resumed: one that spins
    // between two yields, resumed through coroutine.wrap and pcall, is stopped all the same.
    let (lines, results) = own_turn_with_spinning_tool(
        r#"local gen = coroutine.wrap(function()
    coroutine.yield(1)
    while true do end
  end)
  gen()
  local caught = pcall(gen)
  return "caught: " .. tostring(caught)"#,
        // A coroutine made after the call runs unhooked, to its end.
        "local co = coroutine.wrap(function() local s = 0 for i = 1, 1000 do s = s + i end return s end)\nprint(co())",
    );
    assert_eq!(lines, ["it gave up", "spin\tdeadline", "500500"]);
    assert_eq!(results, [DEADLINE_RESULT]);
}

/// Starts `source` under `colony run`, waits for its first line on stdout (the spinning code has
/// started), sends `signal`, and returns the exit status and the rest of stdout.
fn signalled(sb: &Sandbox, source: &str, signal: &str) -> (std::process::ExitStatus, Vec<String>) {
    let file = sb.write("script.lua", source);
    let file = file.display().to_string();
    let mut child = sb.spawn(&["run", "--max-time", "120", &file]);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first.trim(), "spinning");
    // The spinning code is past its first instructions.
    std::thread::sleep(Duration::from_millis(200));
    let killed = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    let rest = out.lines().map(Result::unwrap).collect();
    (status, rest)
}

#[test]
fn sigint_stops_a_program_whose_tool_spins() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        if after_tool(body) {
            Reply::text("stopped")
        } else {
            Reply::tool_call("c1", "spin", json!({}))
        }
    });
    let sb = styled(&fake, "openai");
    let (status, rest) = signalled(
        &sb,
        r#"
io.stdout:setvbuf("line")
local spin = ai.tool{ name = "spin", parameters = {}, timeout = 3600, handler = function()
  print("spinning")
  while true do end
end }
ai.spawn{ name = "w", provider = "openai", model = "m", tools = { spin },
  sources = { function(self) ai.mail{ to = self, source = "desk", content = "go", hop = 0 } end } }
print(ai.watch{})
"#,
        "INT",
    );
    assert_eq!(status.code(), Some(0));
    assert_eq!(rest, ["SIGINT"]);
    // The tool stopped with the program ends the turn: no model call after it (the model read
    // the stop as an error and was called again, up to max_steps).
    assert_eq!(fake.calls(), 1);
}

/// A signal before any watch ends the program where it waits: a script whose own turn's tool
/// spins does not get its turn back. It did two runs in three: the tool, stopped, ended the
/// turn, and the script went on with the turn's empty result (`ran error`) before the end.
#[test]
fn sigint_during_the_scripts_own_turn_ends_it_before_the_script_goes_on() {
    let fake = FakeProvider::start();
    fake.set_responder(|_, _| Reply::tool_call("c1", "spin", json!({})));
    let sb = styled(&fake, "openai");
    // Three runs: the end raced the script's next line.
    for _ in 0..3 {
        let (status, rest) = signalled(
            &sb,
            r#"
io.stdout:setvbuf("line")
local spin = ai.tool{ name = "spin", parameters = {}, timeout = 3600, handler = function()
  print("spinning")
  while true do end
end }
local r = ai.run{ prompt = "weather?", tools = { spin }, provider = "openai", model = "m" }
print("ran", r.stop)
"#,
            "INT",
        );
        assert_eq!(status.code(), Some(130), "{rest:?}");
        assert_eq!(rest, Vec::<String>::new());
    }
}

#[test]
fn max_time_stops_a_program_whose_tool_spins_as_a_signal_does() {
    // --max-time only asked the program to stop: the tool spun to its own deadline, and the
    // process was ended without the watch returning.
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        if after_tool(body) {
            Reply::text("stopped")
        } else {
            Reply::tool_call("c1", "spin", json!({}))
        }
    });
    let sb = styled(&fake, "openai");
    let run = sb.lua(
        r#"
local spin = ai.tool{ name = "spin", parameters = {}, timeout = 3600, handler = function()
  while true do end
end }
ai.spawn{ name = "w", provider = "openai", model = "m", tools = { spin },
  sources = { function(self) ai.mail{ to = self, source = "desk", content = "go", hop = 0 } end } }
print(ai.watch{})
"#,
        &["--max-time", "1"],
    );
    assert_eq!(run.code, 124, "{}", run.stderr);
    assert_eq!(run.lines(), ["max-time"], "{}", run.stderr);
    assert!(!run.stderr.contains("did not end within"), "{}", run.stderr);
}

#[test]
fn sigterm_stops_a_program_whose_source_spins_even_through_pcall() {
    let sb = Sandbox::new();
    let (status, rest) = signalled(
        &sb,
        r#"
io.stdout:setvbuf("line")
ai.spawn{ name = "w", system = "x", sources = { function()
  print("spinning")
  while true do pcall(error, "caught") end
end } }
print(ai.watch{})
"#,
        "TERM",
    );
    assert_eq!(status.code(), Some(0));
    assert_eq!(rest, ["SIGTERM"]);
}

#[test]
fn sigint_stops_a_spinning_main_chunk_before_and_after_a_watch() {
    let sb = Sandbox::new();
    // Before any watch: the program is ended where it stands, with 128 + the signal's number
    // (the signal's default action ended the process, its store left as after a crash).
    let (status, _) = signalled(
        &sb,
        "io.stdout:setvbuf('line') print('spinning') while true do end",
        "INT",
    );
    assert_eq!(status.code(), Some(130), "{status:?}");
    // After a watch: the same.
    let (status, rest) = signalled(
        &sb,
        r#"io.stdout:setvbuf("line")
ai.spawn{ name = "w", system = "x" }
ai.watch{}
print("spinning")
while true do pcall(function() end) end"#,
        "INT",
    );
    assert_eq!(status.code(), Some(130), "{rest:?}");
}

/// Starts `source`, reads stdout until the line `ready`, sends `signals` one by one (a moment
/// apart), and returns the exit status and stderr.
fn signalled_while_waiting(
    sb: &Sandbox,
    source: &str,
    signals: &[&str],
) -> (std::process::ExitStatus, String) {
    let file = sb.write("script.lua", source);
    let file = file.display().to_string();
    let child = sb.spawn(&["run", "--max-time", "120", &file]);
    signal_when_ready(child, signals)
}

/// Reads `child`'s stdout until the line `ready`, sends `signals` one by one (a moment apart),
/// and returns the exit status and stderr. A child that has not ended a minute after the last
/// signal is killed and the test fails: it would hang otherwise.
fn signal_when_ready(
    child: std::process::Child,
    signals: &[&str],
) -> (std::process::ExitStatus, String) {
    let (status, _, stderr) = signal_when_ready_then_read(child, signals);
    (status, stderr)
}

/// [`signal_when_ready`], and what the child printed after `ready`.
fn signal_when_ready_then_read(
    mut child: std::process::Child,
    signals: &[&str],
) -> (std::process::ExitStatus, String, String) {
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "ready" {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "colony ended early");
    }
    for signal in signals {
        std::thread::sleep(Duration::from_millis(300));
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }
    let mut waited = 0;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if waited == 600 {
            child.kill().unwrap();
            panic!("colony did not end within a minute of {signals:?}");
        }
        waited += 1;
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    (status, rest, stderr)
}

#[test]
fn a_signal_after_the_watch_ends_a_program_that_waits() {
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    for (signal, code) in [("INT", 130), ("TERM", 143), ("HUP", 129)] {
        let (status, stderr) = signalled_while_waiting(
            &sb,
            r#"
io.stdout:setvbuf("line")
ai.spawn{ name = "a", provider = "openai", model = "m" }
ai.watch{}
print("ready")
ai.sleep(600000)
print("never")
"#,
            &[signal],
        );
        assert_eq!(status.code(), Some(code), "{signal}: {stderr}");
        assert!(
            stderr.contains(&format!("the program was ended by SIG{signal}")),
            "{stderr}"
        );
    }
}

#[test]
fn a_signal_before_the_watch_ends_the_program_where_it_waits_and_closes_its_store() {
    let sb = Sandbox::new();
    for (signal, code) in [("INT", 130), ("TERM", 143), ("HUP", 129)] {
        let state = sb.path(&format!("state-{signal}"));
        let file = sb.write(
            "script.lua",
            r#"
io.stdout:setvbuf("line")
store.set("k", "kept")
print("ready")
ai.sleep(600000)
print("never")
"#,
        );
        let child = sb.spawn(&[
            "run",
            "--state",
            &state.display().to_string(),
            &file.display().to_string(),
        ]);
        let (status, stderr) = signal_when_ready(child, &[signal]);
        assert_eq!(status.code(), Some(code), "{signal}: {stderr}");
        assert!(
            stderr.ends_with(&format!("colony: the program was ended by SIG{signal}\n")),
            "{stderr}"
        );
        // The run closed its store as any run does: its log copied in and removed, and what
        // the program set is there (a process ended by the signal left both beside it).
        let left = support::left_open(&state);
        assert!(left.is_empty(), "{signal}: left beside the store: {left:?}");
        let opened = colony::store::state_dir::StateDir::open(&state).unwrap();
        assert_eq!(
            colony::store::Store::get(&*opened.store(), "", "k").unwrap(),
            Some(json!("kept"))
        );
    }
}

#[test]
fn a_signal_ends_a_script_blocked_outside_lua_before_and_after_the_watch() {
    // `io.read()` on a pipe nobody writes blocks in C, where neither the interrupt nor the end
    // of the program's wait reaches: the process is ended a moment later, with the status the
    // signal's own action gives (after the watch, nothing ended it: it read on for ever).
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    for (watch, signal, code) in [
        ("", "TERM", 143),
        ("ai.watch{}", "INT", 130),
        ("", "HUP", 129),
    ] {
        let file = sb.write(
            "script.lua",
            &format!(
                r#"
io.stdout:setvbuf("line")
ai.spawn{{ name = "a", provider = "openai", model = "m" }}
{watch}
print("ready")
print("read", io.read())
"#
            ),
        );
        let mut stdin_kept_open = sb
            .command(&["run", &file.display().to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = stdin_kept_open.stdin.take();
        let (status, stderr) = signal_when_ready(stdin_kept_open, &[signal]);
        drop(stdin);
        assert_eq!(status.code(), Some(code), "{watch:?} {signal}: {stderr}");
        assert!(
            stderr.ends_with(&format!("colony: the program was ended by SIG{signal}\n")),
            "{stderr}"
        );
    }
}

/// `fs.read` of a FIFO nobody writes blocks a thread of colony's, not Lua: the program is
/// ended where it waits by `--max-time` (124) or a signal (143) all the same. The run never
/// ended: the Lua thread's runtime, dropped, waited for its blocking read for ever, and only
/// SIGKILL ended the process.
#[test]
fn a_read_of_a_fifo_nobody_writes_ends_at_max_time_or_a_signal() {
    let sb = Sandbox::new();
    let fifo = sb.path("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let file = sb.write(
        "script.lua",
        &format!(
            "io.stdout:setvbuf('line')\nprint('ready')\nprint(fs.read({:?}))\n",
            fifo.display().to_string()
        ),
    );
    let file = file.display().to_string();
    let child = sb.spawn(&["run", "--max-time", "1", &file]);
    let (status, stderr) = signal_when_ready(child, &[]);
    assert_eq!(status.code(), Some(124), "{stderr}");
    let child = sb.spawn(&["run", "--max-time", "120", &file]);
    let (status, stderr) = signal_when_ready(child, &["TERM"]);
    assert_eq!(status.code(), Some(143), "{stderr}");
}

#[test]
fn a_run_started_with_sigint_ignored_leaves_it_ignored_and_sigterm_ends_it() {
    // A background job of a non-interactive shell starts with SIGINT ignored, so that the
    // terminal's Ctrl-C ends only the command in front: colony keeps it so, before its watch
    // and during it. Were SIGINT heard, the run would end with it (130, `SIGINT`).
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    for (watch, code, out) in [
        ("print('ready') ai.sleep(600000)", 143, ""),
        (
            "print('ready') print(ai.watch{ until_idle = false })",
            0,
            "SIGTERM\n",
        ),
    ] {
        let file = sb.write(
            "script.lua",
            &format!(
                "io.stdout:setvbuf('line') ai.spawn{{ name = 'a', provider = 'openai', model = 'm' }} {watch}"
            ),
        );
        let mut command = sb.command(&["run", &file.display().to_string()]);
        // Safety: `signal` is async-signal-safe, as what runs between fork and exec must be.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                libc::signal(libc::SIGINT, libc::SIG_IGN);
                Ok(())
            });
        }
        let child = command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (status, rest, stderr) = signal_when_ready_then_read(child, &["INT", "TERM"]);
        assert_eq!(status.code(), Some(code), "{watch}: {stderr}");
        assert_eq!(rest, out, "{watch}: {stderr}");
        assert!(!stderr.contains("SIGINT"), "{watch}: {stderr}");
    }
}

#[test]
fn what_runs_after_a_watch_a_signal_stopped_runs_to_its_end() {
    // The signal stopped the watch, not the script: its report after the watch (a second of
    // work without waiting) runs to its end and the run exits 0. It was stopped as code that
    // spins, 0.5 s in, and the run failed.
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    let file = sb.write(
        "script.lua",
        r#"
io.stdout:setvbuf("line")
ai.spawn{ name = "a", provider = "openai", model = "m",
  sources = { function() while true do ai.sleep(50) end end } }
print("ready")
print(ai.watch{})
local t, n = os.clock(), 0
while os.clock() - t < 1.0 do n = n + 1 end
print("report written")
"#,
    );
    let child = sb.spawn(&["run", "--max-time", "120", &file.display().to_string()]);
    let (status, rest, stderr) = signal_when_ready_then_read(child, &["INT"]);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(rest, "SIGINT\nreport written\n", "{stderr}");
}

#[test]
fn a_watch_whose_hook_waits_ends_a_grace_after_one_signal() {
    // The watch's hook sleeps: one Ctrl-C, and the program is ended where it waits once the
    // watch's grace (and a second) is over, without the third signal it took before.
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    let (status, stderr) = signalled_while_waiting(
        &sb,
        r#"
io.stdout:setvbuf("line")
ai.spawn{ name = "a", provider = "openai", model = "m",
  sources = { function() error("the source fails") end },
  restart = "temporary" }
print(ai.watch{ grace_ms = 200, on_fail = function()
  print("ready")
  ai.sleep(600000)
end })
print("never")
"#,
        &["INT"],
    );
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("SIGINT: the watch did not end in time"),
        "{stderr}"
    );
}

#[test]
fn the_grace_after_a_signal_runs_from_when_the_watch_begins_its_shutdown() {
    // A hook was running (2.7 s more) when the signal came: the watch's shutdown, and the
    // grace of the turn in flight (4 s), begin when it returns. The program is not ended a
    // grace and a second after the signal (5 s), in the middle of the grace its turn was given
    // (to 6.7 s). The margins are seconds: a loaded machine does not turn one into the other.
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("late").delay(9000));
    let sb = styled(&fake, "openai");
    let (status, stderr) = signalled_while_waiting(
        &sb,
        r#"
io.stdout:setvbuf("line")
ai.spawn{ name = "a", provider = "openai", model = "m", restart = "temporary",
  sources = { function(self)
    ai.mail{ to = self, source = "desk", content = "go", hop = 0 }
    error("the source fails")
  end } }
print(ai.watch{ grace_ms = 4000, on_fail = function()
  print("ready")
  ai.sleep(3000)
end })
"#,
        &["INT"],
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    // Named (it said how many, not which).
    assert!(
        stderr.contains("1 resident(s) were still busy after the grace period and were stopped: a"),
        "{stderr}"
    );
    assert!(!stderr.contains("did not end in time"), "{stderr}");
}

#[test]
fn ctrl_c_ends_a_program_whose_interruptible_call_does_not_give_way() {
    // term.interruptible takes Ctrl-C to cancel its call, but a call that spins cannot be
    // dropped where it waits: a moment later the signal is the program's, and it ends.
    let sb = Sandbox::new();
    let (status, stderr) = signalled_while_waiting(
        &sb,
        r#"
io.stdout:setvbuf("line")
print(term.interruptible(function() print("ready") while true do end end))
print("never")
"#,
        &["INT"],
    );
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(
        stderr.ends_with("colony: the program was ended by SIGINT\n"),
        "{stderr}"
    );
}

#[test]
fn ctrl_c_reaches_colony_while_os_execute_runs_and_its_command_has_sigpipe_at_its_default() {
    // Lua's os.execute called system(3), which ignores SIGINT in colony while the command
    // runs: Ctrl-C sent to colony was lost and the script went on (exit 0), and the command
    // inherited colony's SIGPIPE ignored.
    let sb = Sandbox::new();
    let mask = sb.path("sigign");
    let (status, stderr) = signalled_while_waiting(
        &sb,
        &format!(
            r#"
io.stdout:setvbuf("line")
assert(os.execute("grep SigIgn /proc/self/status > {}"))
print("ready")
print(os.execute("sleep 5"))
print("never")
"#,
            mask.display()
        ),
        &["INT"],
    );
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(
        stderr.ends_with("colony: the program was ended by SIGINT\n"),
        "{stderr}"
    );
    let line = std::fs::read_to_string(&mask).unwrap();
    let ignored = u64::from_str_radix(line.trim().trim_start_matches("SigIgn:").trim(), 16)
        .unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0, "{line}");
}

#[test]
fn a_third_signal_ends_a_watch_whose_hook_waits() {
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    let (status, stderr) = signalled_while_waiting(
        &sb,
        r#"
io.stdout:setvbuf("line")
ai.spawn{ name = "a", provider = "openai", model = "m",
  sources = { function() error("the source fails") end },
  restart = "temporary" }
print(ai.watch{ on_fail = function()
  print("ready")
  ai.sleep(600000)
end })
print("never")
"#,
        &["INT", "INT", "TERM"],
    );
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert!(
        stderr.contains("the program was ended by SIGTERM"),
        "{stderr}"
    );
}

/// A closed terminal (SIGHUP) stops a watch as SIGTERM does: the watch returns its name and the
/// script goes on to its end. Its default action ended the process where it stood, the
/// program's turns cut off and its store left as after a crash. Started with SIGHUP ignored
/// (`nohup`), the run leaves it ignored.
#[test]
fn sighup_stops_a_watch_as_sigterm_does_unless_ignored_at_start() {
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    let file = sb.write(
        "script.lua",
        r#"
io.stdout:setvbuf("line")
ai.spawn{ name = "a", provider = "openai", model = "m",
  sources = { function() while true do ai.sleep(50) end end } }
print("ready")
print(ai.watch{})
"#,
    );
    let child = sb.spawn(&["run", "--max-time", "120", &file.display().to_string()]);
    let (status, rest, stderr) = signal_when_ready_then_read(child, &["HUP"]);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(rest, "SIGHUP\n", "{stderr}");

    let mut ignoring = sb.command(&["run", "--max-time", "3", &file.display().to_string()]);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut ignoring, || {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let child = ignoring
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (status, rest, stderr) = signal_when_ready_then_read(child, &["HUP"]);
    // Not heard: the watch ran on until --max-time ended it.
    assert_eq!(status.code(), Some(124), "{stderr}");
    assert_eq!(rest, "max-time\n", "{stderr}");
}

/// A command `os.execute` or `io.popen` waits for when a signal ends the program: the process
/// is ended a moment later (the call blocks outside Lua), and the command with it (it ran on,
/// adopted by init).
#[test]
fn a_command_the_script_waits_for_ends_with_colony() {
    let sb = Sandbox::new();
    // "ready" once the command's pid is written: said by the command itself (os.execute's
    // shares colony's stdout), or by the script once it sees the file (io.popen's does not).
    // The command's own output goes elsewhere: one left running would hold the test's pipes.
    for (source, signal, code) in [
        (
            r#"os.execute("echo $$ > PIDS; echo ready; exec sleep 600 >/dev/null 2>&1")"#,
            "TERM",
            143,
        ),
        (
            r#"local f = io.popen("echo $$ > PIDS; exec sleep 600 2>/dev/null")
               while not fs.exists("PIDS") or fs.read("PIDS") == "" do ai.sleep(10) end
               print("ready")
               f:read("a")"#,
            "HUP",
            129,
        ),
    ] {
        let pids = sb.path("pids");
        let _ = std::fs::remove_file(&pids);
        let source = source.replace("PIDS", &pids.display().to_string());
        let source = format!("io.stdout:setvbuf(\"line\")\n{source}\n");
        let (status, stderr) = signalled_while_waiting(&sb, &source, &[signal]);
        assert_eq!(status.code(), Some(code), "{source}: {stderr}");
        let pid: u32 = std::fs::read_to_string(&pids)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            !support::running(pid),
            "{source}: the command ({pid}) outlived colony"
        );
    }
}

/// A source that spins is stopped after 10 s without waiting and restarted by its policy; its
/// stops, 10 s apart, never came `max_restarts` within the window, so it was restarted for
/// ever, holding the program's Lua thread nearly all the time, and the run never ended. They
/// count within an hour: past `max_restarts` of them, it has failed. (20 s: two stops.)
#[test]
fn a_source_that_spins_again_and_again_fails_for_good() {
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    let run = sb.lua(
        r#"
ai.spawn{ name = "a", provider = "openai", model = "m",
  sources = { { function() while true do end end, max_restarts = 1 } } }
print(ai.watch{ on_fail = function(id, name, err) print("failed: " .. id .. ": " .. err) end })
"#,
        &["--max-time", "120"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.lines(),
        [
            &format!(
                "failed: a/source/1: {}:3: deadline: it ran 10 s without waiting (a callback \
                 may run at most 10 s at a time)",
                sb.path("script.lua").display()
            ),
            "idle"
        ]
    );
    assert!(
        run.stderr.contains(
            "[a/source/1] failed: not started again (stopped 2 times within an hour for \
             running without waiting; at most 1 restarts of such code)"
        ),
        "{}",
        run.stderr
    );
}
