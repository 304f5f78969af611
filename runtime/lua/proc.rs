//! The `proc` module: `proc.run{ cmd, args, cwd, env, stdin, timeout, max_bytes }`.
//!
//! `os.execute` and `io.popen` block the VM's thread while the command runs, so one slow command
//! in a source holds every resident and tool of the program. `proc.run` waits on tokio's process
//! API instead: only the calling coroutine waits. The command is started directly (no shell:
//! `cmd` is the program, `args` its arguments), its output is read up to `max_bytes` a stream,
//! and it is killed at its `timeout`. It needs the `run` permission (`--allow-run`) in a sandbox.

use std::ffi::OsString;
use std::process::Stdio;
use std::time::Duration;

use mlua::{Lua, LuaString, MultiValue, Table, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::convert::{check_fields, error_table, misuse, seconds_option};

/// How long a command may run when the script does not say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The most read of stdout, and of stderr, when the script does not say: 32 MiB each.
pub const DEFAULT_MAX_BYTES: u64 = 32 << 20;

const FIELDS: &[&str] = &["cmd", "args", "cwd", "env", "stdin", "timeout", "max_bytes"];

/// Replaces Lua's `os.execute` with [`execute`].
pub fn replace_os_execute(lua: &Lua) -> mlua::Result<()> {
    let os: Table = lua.globals().get("os")?;
    os.set(
        "execute",
        lua.create_function(|lua, command: Option<LuaString>| execute(lua, command))?,
    )
}

/// `os.exit(code)` that ends colony's stdio MCP servers (their whole process groups) and
/// flushes stdout before the process exits: Lua's own calls exit(3) at once, and a server
/// group, in a group of its own, ran on after `colony chat` left through it (a Ctrl-C during
/// a tool call). `code` is Lua's: `true` (or none) 0, `false` 1, else the number.
pub fn replace_os_exit(lua: &Lua) -> mlua::Result<()> {
    let os: Table = lua.globals().get("os")?;
    os.set(
        "exit",
        lua.create_function(|lua, (code, _close): (Value, Value)| -> mlua::Result<()> {
            let code = match code {
                Value::Nil | Value::Boolean(true) => 0,
                Value::Boolean(false) => 1,
                Value::Integer(n) => n as i32,
                Value::Number(n) if n.is_finite() => n as i32,
                other => {
                    return Err(misuse(format!(
                        "os.exit: the status is true, false or a number, not {}",
                        other.type_name()
                    )));
                }
            };
            // Called while the watch runs (from a tool, a source, a callback), it ends the
            // process as a crash would, turns cut mid-step: said, with where (a program run from
            // someone else's file ended without a word, with the status it chose).
            // (Ended, its turns may still run out the stop's grace.)
            let watching = lua
                .app_data_ref::<crate::residents::Lifecycle>()
                .is_some_and(|l| match l.watch_state() {
                    crate::residents::Watch::Running => true,
                    crate::residents::Watch::Ended => l
                        .residents()
                        .iter()
                        .any(|r| r.state == crate::residents::resident::State::Busy),
                    crate::residents::Watch::NotYet => false,
                });
            if watching {
                let at = super::calling_line(lua).unwrap_or_else(|| "the script".into());
                tracing::warn!(
                    "os.exit({code}) at {at} while the program's residents run: the process \
                     ends now, turns in flight cut short (ai.stop(reason) lets them finish)"
                );
            }
            use std::io::Write;
            let _ = std::io::stdout().flush();
            crate::mcp::server_group::end_all();
            crate::store::state_dir::remove_scratch();
            // Ending on a signal (`colony ask`'s): the signal's status, not the script's.
            std::process::exit(crate::signals::ending_with().unwrap_or(code))
        })?,
    )
}

/// Ends what this process started before it exits while its program is stuck (a signal it
/// did not give way to): the stdio MCP servers' groups, then every process still under it (a
/// command `os.execute` or `io.popen` was waiting for ran on after colony had gone).
pub fn end_children() {
    crate::mcp::server_group::end_all();
    for pid in descendants(std::process::id()) {
        // SAFETY: kill(2) with a pid read from /proc; a process gone meanwhile is ESRCH.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
}

/// `os.execute(command)` as Lua's own (`/bin/sh -c command`, answering `true` or `nil`,
/// `"exit"` or `"signal"`, and the code; `os.execute()` whether there is a shell), but started
/// as `proc.run` starts a command. Lua's calls system(3), which ignores SIGINT in the caller
/// while the command runs, so Ctrl-C never reached colony (the command died of it, and the
/// script went on as if nothing happened), and its command inherited colony's SIGPIPE ignored
/// (`yes | head -1` said "Broken pipe"). It still holds the VM's thread while the command runs.
fn execute(lua: &Lua, command: Option<LuaString>) -> mlua::Result<MultiValue> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    const SHELL: &str = "/bin/sh";
    let Some(command) = command else {
        return Ok(MultiValue::from_iter([Value::Boolean(
            std::path::Path::new(SHELL).exists(),
        )]));
    };
    let status = std::process::Command::new(SHELL)
        .arg0("sh")
        .arg("-c")
        .arg(std::ffi::OsStr::from_bytes(&command.as_bytes()))
        .status();
    let (how, code) = match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => ("exit", code),
            (None, Some(signal)) => ("signal", signal),
            (None, None) => ("exit", -1),
        },
        Err(e) => {
            return Ok(MultiValue::from_iter([
                Value::Nil,
                Value::String(lua.create_string(format!("{SHELL}: {e}"))?),
                Value::Integer(e.raw_os_error().unwrap_or(0).into()),
            ]));
        }
    };
    let ok = if how == "exit" && code == 0 {
        Value::Boolean(true)
    } else {
        Value::Nil
    };
    Ok(MultiValue::from_iter([
        ok,
        Value::String(lua.create_string(how)?),
        Value::Integer(code.into()),
    ]))
}

pub fn register(lua: &Lua) -> mlua::Result<Table> {
    let proc = lua.create_table()?;
    proc.set(
        "run",
        lua.create_async_function(|lua, spec: Value| async move {
            let spec = read(&lua, spec)?;
            super::sandbox::check_run(&lua, "proc.run", &spec.shown())?;
            run(&lua, spec).await
        })?,
    )?;
    Ok(proc)
}

/// A command as the script described it.
struct Spec {
    cmd: OsString,
    args: Vec<OsString>,
    cwd: Option<std::path::PathBuf>,
    env: Vec<(OsString, OsString)>,
    stdin: Option<Vec<u8>>,
    timeout: Duration,
    max_bytes: u64,
}

impl Spec {
    /// The command line, for messages.
    fn shown(&self) -> String {
        std::iter::once(&self.cmd)
            .chain(&self.args)
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A Lua string as the bytes an argument, a name or a value is: one that is not UTF-8 is passed
/// as it is, not with U+FFFD in its place.
fn os(s: &LuaString) -> OsString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::OsStr::from_bytes(&s.as_bytes()).to_os_string()
}

fn read(lua: &Lua, spec: Value) -> mlua::Result<Spec> {
    let who = "proc.run";
    let Value::Table(t) = spec else {
        return Err(misuse(format!(
            "{who}: expected a table {{ cmd, args?, cwd?, env?, stdin?, timeout?, max_bytes? }}, not a {}",
            spec.type_name()
        )));
    };
    check_fields(&t, who, FIELDS)?;
    let cmd = match t.get::<Value>("cmd")? {
        Value::String(s) if !s.as_bytes().is_empty() => os(&s),
        Value::Nil => return Err(misuse(format!("{who}: cmd is required"))),
        other => {
            return Err(misuse(format!(
                "{who}: cmd must be a non-empty string, not {}",
                describe(&other)
            )));
        }
    };
    let args = match t.get::<Value>("args")? {
        Value::Nil => Vec::new(),
        Value::Table(a) => {
            // A list, 1 to n with no hole: `{ "a", nil, "c" }` ran with "a" alone, and
            // `{ x = "y" }` with no argument at all.
            let mut listed = Vec::new();
            for pair in a.pairs::<Value, Value>() {
                let (k, v) = pair?;
                match k {
                    Value::Integer(i) if i >= 1 => listed.push((i, v)),
                    other => {
                        return Err(misuse(format!(
                            "{who}: args must be a list of strings; it has the key {}",
                            describe(&other)
                        )));
                    }
                }
            }
            listed.sort_by_key(|(i, _)| *i);
            let mut args = Vec::new();
            for (at, (i, v)) in listed.into_iter().enumerate() {
                if i != at as i64 + 1 {
                    return Err(misuse(format!(
                        "{who}: args[{}] is nil: args must be a list with no holes",
                        at + 1
                    )));
                }
                match v {
                    Value::String(s) => args.push(os(&s)),
                    Value::Integer(n) => args.push(n.to_string().into()),
                    Value::Number(n) => args.push(n.to_string().into()),
                    other => {
                        return Err(misuse(format!(
                            "{who}: args[{i}] must be a string, not {}",
                            describe(&other)
                        )));
                    }
                }
            }
            args
        }
        other => {
            return Err(misuse(format!(
                "{who}: args must be a list of strings, not {}",
                describe(&other)
            )));
        }
    };
    let cwd = match t.get::<Value>("cwd")? {
        Value::Nil => None,
        Value::String(s) => Some(super::fs::resolve(lua, &s)),
        other => {
            return Err(misuse(format!(
                "{who}: cwd must be a string, not {}",
                describe(&other)
            )));
        }
    };
    let mut env = Vec::new();
    match t.get::<Value>("env")? {
        Value::Nil => {}
        Value::Table(e) => {
            for pair in e.pairs::<Value, Value>() {
                match pair? {
                    (Value::String(k), Value::String(v)) => {
                        let name = k.as_bytes();
                        // `B=C` set the variable B to `C=...`; the empty name is no variable.
                        if name.is_empty() || name.iter().any(|b| *b == b'=' || *b == 0) {
                            return Err(misuse(format!(
                                "{who}: env: {:?} is not a variable name (no '=', not empty)",
                                k.to_string_lossy()
                            )));
                        }
                        env.push((os(&k), os(&v)));
                    }
                    // The value named when it is the value at fault (`PORT = 8080`: it said
                    // the name "PORT" was not a string).
                    (Value::String(k), v) => {
                        return Err(misuse(format!(
                            "{who}: env.{} must be a string, not {}",
                            k.to_string_lossy(),
                            super::convert::a_type(v.type_name())
                        )));
                    }
                    (k, _) => {
                        return Err(misuse(format!(
                            "{who}: env maps names to strings; {} is not",
                            describe(&k)
                        )));
                    }
                }
            }
        }
        other => {
            return Err(misuse(format!(
                "{who}: env must be a table of strings, not {}",
                describe(&other)
            )));
        }
    }
    let stdin = match t.get::<Value>("stdin")? {
        Value::Nil => None,
        Value::String(s) => Some(s.as_bytes().to_vec()),
        other => {
            return Err(misuse(format!(
                "{who}: stdin must be a string, not {}",
                describe(&other)
            )));
        }
    };
    let number = |key: &str| -> mlua::Result<Option<f64>> {
        t.get::<Option<f64>>(key)
            .map_err(|_| misuse(format!("{who}: {key} must be a number")))
    };
    let timeout = match number("timeout")? {
        None => DEFAULT_TIMEOUT,
        Some(s) => seconds_option(who, "timeout", s)?,
    };
    let max_bytes = match number("max_bytes")? {
        None => super::convert::default_within_memory(lua, DEFAULT_MAX_BYTES),
        Some(n) if n.is_finite() && n >= 0.0 && n.fract() == 0.0 && n <= u64::MAX as f64 => {
            n as u64
        }
        Some(n) => {
            return Err(misuse(format!(
                "{who}: max_bytes must be a whole number of bytes, not {n}"
            )));
        }
    };
    if t.get::<Value>("max_bytes")? != Value::Nil {
        super::convert::within_memory(lua, who, max_bytes)?;
    }
    Ok(Spec {
        cmd,
        args,
        cwd,
        env,
        stdin,
        timeout,
        max_bytes,
    })
}

fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{:?}", s.to_string_lossy()),
        other => super::convert::a_type(other.type_name()),
    }
}

/// How a process ended, as a message says it: `status 0`, `signal 9`.
fn ended_as(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "an unknown way".into(),
    }
}

/// How a run ended when it did not end by itself.
enum Failed {
    Start(std::io::Error),
    Io(std::io::Error),
    TooLarge(&'static str),
    TimedOut,
}

async fn run(lua: &Lua, spec: Spec) -> mlua::Result<MultiValue> {
    let shown = spec.shown();
    let mut command = tokio::process::Command::new(&spec.cmd);
    command
        .args(&spec.args)
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A command abandoned (its timeout, its coroutine cancelled) is killed, not left running.
        .kill_on_drop(true);
    if let Some(dir) = &spec.cwd {
        command.current_dir(dir);
    }
    for (k, v) in &spec.env {
        command.env(k, v);
    }
    let max = spec.max_bytes;
    // Set once the command itself has ended: what it started in the background may still hold
    // its output open (`sh -c "daemon &"`), and its timeout then said it was killed, of a
    // process that had exited, while what held the output ran on.
    let exited = std::sync::OnceLock::new();
    let work = async {
        let mut child = command.spawn().map_err(Failed::Start)?;
        // Declared after `child`, so dropped before it: the tree is found while the child
        // still holds it together.
        let mut tree = Tree(child.id());
        let stdin = child.stdin.take();
        let input = spec.stdin.clone();
        let feed = async move {
            if let (Some(mut pipe), Some(bytes)) = (stdin, input) {
                // A command that exits without reading its input is not an error.
                let _ = pipe.write_all(&bytes).await;
            }
            Ok::<(), Failed>(())
        };
        let stdout = capped(child.stdout.take(), max, "stdout");
        let stderr = capped(child.stderr.take(), max, "stderr");
        // The first stream past its limit ends the run (the other may never close).
        let streams = async { tokio::try_join!(feed, stdout, stderr) };
        let waited = async {
            let status = child.wait().await.map_err(Failed::Io)?;
            let _ = exited.set(status);
            Ok::<_, Failed>(status)
        };
        let (((), out, err), status) = tokio::try_join!(streams, waited)?;
        // Ended by itself: what it left running in the background is its own affair, as in
        // a shell.
        tree.0 = None;
        Ok::<_, Failed>((status, out, err))
    };
    let outcome = match tokio::time::timeout(spec.timeout, work).await {
        Ok(outcome) => outcome,
        Err(_) => Err(Failed::TimedOut),
    };
    let failed = |kind: &str, message: String| -> mlua::Result<MultiValue> {
        let err = error_table(lua, kind, &format!("proc.run: {message}"))?;
        Ok(MultiValue::from_iter([Value::Nil, Value::Table(err)]))
    };
    let (status, out, err) = match outcome {
        Ok(done) => done,
        Err(Failed::Start(_)) if spec.cwd.as_ref().is_some_and(|d| !d.is_dir()) => {
            let dir = spec.cwd.as_ref().map(|d| d.display().to_string());
            return failed(
                "not_found",
                format!(
                    "cannot start {:?}: its cwd {:?} is not a folder",
                    spec.cmd.to_string_lossy(),
                    dir.unwrap_or_default()
                ),
            );
        }
        Err(Failed::Start(e)) => {
            let kind = match e.kind() {
                std::io::ErrorKind::NotFound => "not_found",
                std::io::ErrorKind::PermissionDenied => "permission_denied",
                _ => "io_error",
            };
            return failed(
                kind,
                format!("cannot start {:?}: {e}", spec.cmd.to_string_lossy()),
            );
        }
        Err(Failed::Io(e)) => return failed("io_error", format!("{shown}: {e}")),
        Err(Failed::TooLarge(stream)) => {
            return failed(
                "too_large",
                format!(
                    "{shown}: its {stream} passed {} (pass max_bytes to read more); it was killed",
                    crate::providers::body::describe_limit(max)
                ),
            );
        }
        Err(Failed::TimedOut) => {
            let message = match exited.get() {
                Some(status) => format!(
                    "{shown} ended ({}), but what it started in the background kept its output \
                     open past the timeout of {} s (give that its own output: `cmd > /dev/null \
                     &`); it was left running",
                    ended_as(status),
                    spec.timeout.as_secs_f64()
                ),
                None => format!(
                    "{shown} timed out after {} s; it was killed",
                    spec.timeout.as_secs_f64()
                ),
            };
            return failed("timeout", message);
        }
    };
    let result = lua.create_table()?;
    match status.code() {
        Some(code) => {
            result.set("status", code)?;
        }
        None => {
            use std::os::unix::process::ExitStatusExt;
            result.set("signal", status.signal())?;
        }
    }
    result.set("ok", status.success())?;
    result.set("stdout", lua.create_string(&out)?)?;
    result.set("stderr", lua.create_string(&err)?)?;
    Ok(MultiValue::from_iter([Value::Table(result)]))
}

/// A command's process and every process under it, killed when this is dropped armed (its
/// timeout, a stream past `max_bytes`, its coroutine cancelled). Killing only the command left
/// what it started running: `sh -c "sleep 77; echo x"` timed out and `sleep` ran on, adopted by
/// init. The tree is read from `/proc` (each process's parent) rather than by giving the
/// command a process group of its own, which would keep a terminal's Ctrl-C from reaching it.
struct Tree(Option<u32>);

impl Drop for Tree {
    fn drop(&mut self) {
        let Some(root) = self.0 else { return };
        // The command first, so it starts nothing more; what it started is already listed.
        for pid in [root].into_iter().chain(descendants(root)) {
            // SAFETY: kill(2) with a pid read from /proc; a process gone meanwhile is ESRCH.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
    }
}

/// The processes under `root`, parents before their children.
fn descendants(root: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut parent_of = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // `pid (comm) state ppid ...`: the name may hold spaces and parentheses, so the fields
        // are read after its last `)`.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((pid, ppid));
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// Everything `pipe` gives, up to `max` bytes: more than that is [`Failed::TooLarge`].
async fn capped(
    pipe: Option<impl AsyncRead + Unpin>,
    max: u64,
    stream: &'static str,
) -> Result<Vec<u8>, Failed> {
    let Some(pipe) = pipe else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    pipe.take(max.saturating_add(1))
        .read_to_end(&mut out)
        .await
        .map_err(Failed::Io)?;
    if out.len() as u64 > max {
        return Err(Failed::TooLarge(stream));
    }
    Ok(out)
}
