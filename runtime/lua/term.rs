//! The `term` module: what a front end needs from the terminal. `term.is_tty`, `term.styled`,
//! `term.width`, `term.readline` (a line editor with history), `term.render` (Markdown for the
//! terminal), `term.erase` (take back text just streamed), `term.spinner` and
//! `term.interruptible` (Ctrl-C cancels a call in flight instead of the program).
//!
//! The line editor is rustyline and the Markdown renderer termimad: both are well kept, and
//! neither a line editor nor a table layout is something to write again by hand.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlua::{Function, Lua, MultiValue, Table, UserData, UserDataMethods, Value};
use rustyline::error::ReadlineError;

use super::convert::{arg, misuse};

/// The program's line editor, made on first use and kept, so its history spans every prompt.
#[derive(Clone)]
struct Editor(Arc<Mutex<rustyline::DefaultEditor>>);

pub fn register(lua: &Lua) -> mlua::Result<Table> {
    let term = lua.create_table()?;
    term.set(
        "is_tty",
        lua.create_function(|lua, which: Value| {
            let which: Option<String> = arg(lua, "term.is_tty", 1, which)?;
            Ok(match which.as_deref().unwrap_or("stdout") {
                "stdout" => std::io::stdout().is_terminal(),
                "stdin" => std::io::stdin().is_terminal(),
                "stderr" => std::io::stderr().is_terminal(),
                other => {
                    return Err(misuse(format!(
                        "term.is_tty: {other:?} is not stdin, stdout or stderr"
                    )));
                }
            })
        })?,
    )?;
    term.set("styled", lua.create_function(|_, ()| Ok(styled()))?)?;
    term.set("width", lua.create_function(|_, ()| Ok(size().0))?)?;
    term.set(
        "render",
        lua.create_function(|lua, (text, opts): (Value, Value)| {
            let opts: Option<Table> = arg(lua, "term.render", 2, opts)?;
            if let Some(o) = &opts {
                super::convert::check_fields(o, "term.render", &["width"])?;
            }
            let Value::String(text) = text else {
                return Err(misuse("term.render: the Markdown must be a string"));
            };
            let width = match &opts {
                Some(o) => o
                    .get::<Option<usize>>("width")
                    .map_err(|_| misuse("term.render: width must be a number of columns"))?,
                None => None,
            };
            Ok(render(
                &text.to_string_lossy(),
                width.unwrap_or_else(|| size().0),
            ))
        })?,
    )?;
    term.set(
        "erase",
        lua.create_function(|lua, text: Value| {
            let text: mlua::LuaString = arg(lua, "term.erase", 1, text)?;
            Ok(erase(&text.to_string_lossy()))
        })?,
    )?;
    term.set(
        "readline",
        lua.create_async_function(|lua, prompt: Value| async move {
            let prompt: Option<String> = arg(&lua, "term.readline", 1, prompt)?;
            readline(&lua, prompt.unwrap_or_default()).await
        })?,
    )?;
    term.set(
        "spinner",
        lua.create_function(|lua, label: Value| {
            let label: Option<String> = arg(lua, "term.spinner", 1, label)?;
            Ok(Spinner::start(label))
        })?,
    )?;
    term.set(
        "interruptible",
        lua.create_async_function(|lua, (f, args): (Value, MultiValue)| async move {
            let Value::Function(f) = f else {
                return Err(misuse(
                    "term.interruptible: the first argument must be a function",
                ));
            };
            interruptible(&lua, f, args).await
        })?,
    )?;
    Ok(term)
}

/// Whether output may carry colour and layout: stdout is a terminal, `NO_COLOR` is not set
/// (<https://no-color.org>: any non-empty value), and `TERM` is not `dumb` (Emacs' shell, some
/// CI consoles: they showed the escapes, cursor moves included, as text).
pub fn styled() -> bool {
    std::io::stdout().is_terminal() && !plain_asked()
}

/// Whether the user asked for plain text whatever the stream: `NO_COLOR` set, or `TERM=dumb`.
/// (The log's lines on stderr follow it too.)
pub fn plain_asked() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()) || dumb()
}

/// Whether the terminal says it moves no cursor (`TERM=dumb`).
fn dumb() -> bool {
    std::env::var_os("TERM").is_some_and(|t| t == "dumb")
}

/// Columns and rows of the terminal stdout writes to (80 x 24 when it writes elsewhere: a
/// process with a controlling terminal but piped output is laid out for no screen in particular).
fn size() -> (usize, usize) {
    if !std::io::stdout().is_terminal() {
        return (80, 24);
    }
    termimad::crossterm::terminal::size()
        .ok()
        .filter(|(w, h)| *w > 0 && *h > 0)
        .map(|(w, h)| (w as usize, h as usize))
        .unwrap_or((80, 24))
}

/// `text` laid out for a terminal `width` columns wide: headings, lists, code blocks and tables
/// (whose columns are aligned), with ANSI styles.
pub fn render(text: &str, width: usize) -> String {
    let skin = termimad::MadSkin::default();
    let text = without_controls(text);
    termimad::FmtText::from(&skin, &text, Some(width.max(20))).to_string()
}

/// `text` without control characters but tabs and newlines: the rendering is for a terminal,
/// and an escape sequence in a model's reply set the clipboard (OSC 52) or the window's title,
/// or cleared the screen.
fn without_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let unwanted = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.contains(unwanted) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(text.chars().filter(|&c| !unwanted(c)).collect())
}

/// Moves the cursor back to where `text` began (it was written from the start of a line, at
/// the terminal's current width) and clears from there down. False, and nothing done, when
/// stdout is not a terminal, or `text` is taller than the screen (the top of it has scrolled
/// away and cannot be reached).
fn erase(text: &str) -> bool {
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        return false;
    }
    let (cols, rows) = size();
    let used: usize = text
        .split('\n')
        .map(|line| {
            let w = unicode_width::UnicodeWidthStr::width(line);
            w.div_ceil(cols).max(1)
        })
        .sum();
    if used > rows {
        return false;
    }
    let mut out = std::io::stdout().lock();
    let up = used - 1;
    let _ = if up > 0 {
        write!(out, "\r\x1b[{up}A\x1b[J")
    } else {
        write!(out, "\r\x1b[J")
    };
    let _ = out.flush();
    true
}

/// `line = term.readline(prompt)`: `nil, "interrupted"` on Ctrl-C, `nil, "eof"` on Ctrl-D or the
/// end of input. The editor runs on a blocking thread so the VM's other coroutines go on.
async fn readline(lua: &Lua, prompt: String) -> mlua::Result<MultiValue> {
    let editor = match lua.app_data_ref::<Editor>() {
        Some(e) => e.clone(),
        None => {
            let made = rustyline::DefaultEditor::new()
                .map_err(|e| mlua::Error::runtime(format!("term.readline: {e}")))?;
            let e = Editor(Arc::new(Mutex::new(made)));
            lua.set_app_data(e.clone());
            e
        }
    };
    let read = tokio::task::spawn_blocking(move || {
        let mut ed = editor.0.lock().unwrap_or_else(|p| p.into_inner());
        let line = ed.readline(&prompt);
        if let Ok(l) = &line
            && !l.trim().is_empty()
        {
            let _ = ed.add_history_entry(l.as_str());
        }
        line
    })
    .await
    .map_err(|e| mlua::Error::runtime(format!("term.readline: {e}")))?;
    let answer = |v: Value| Ok(MultiValue::from_iter([v]));
    match read {
        Ok(line) => answer(Value::String(lua.create_string(line)?)),
        Err(ReadlineError::Interrupted) => Ok(MultiValue::from_iter([
            Value::Nil,
            Value::String(lua.create_string("interrupted")?),
        ])),
        Err(ReadlineError::Eof) => Ok(MultiValue::from_iter([
            Value::Nil,
            Value::String(lua.create_string("eof")?),
        ])),
        Err(e) => Ok(MultiValue::from_iter([
            Value::Nil,
            Value::String(lua.create_string(format!("io_error: {e}"))?),
        ])),
    }
}

/// `ok, ... = term.interruptible(f, ...)`: runs `f(...)`; Ctrl-C while it runs cancels it (its
/// coroutine is dropped, with the model call or tool it was waiting on) and answers
/// `false, "interrupted", "SIGINT"`. A host that ends the program on its own terms
/// ([`Interrupt::end_interruptible`]: `colony chat` at SIGTERM or SIGHUP) cancels it the same
/// way, naming its signal. Otherwise `true` and what `f` returned. Outside such a call Ctrl-C
/// ends the program as usual (under `colony run`, where it waits).
///
/// [`Interrupt::end_interruptible`]: super::watchdog::Interrupt::end_interruptible
async fn interruptible(lua: &Lua, f: Function, args: MultiValue) -> mlua::Result<MultiValue> {
    // Listening before `f` starts: a Ctrl-C the moment it begins is not lost.
    #[cfg(unix)]
    let interrupted = {
        let mut sigint = crate::signals::sigint()
            .map_err(|e| mlua::Error::runtime(format!("term.interruptible: {e}")))?;
        async move { sigint.recv().await }
    };
    #[cfg(not(unix))]
    let interrupted = tokio::signal::ctrl_c();
    let interrupt = lua
        .app_data_ref::<super::watchdog::Interrupt>()
        .map(|interrupt| interrupt.clone());
    // Ctrl-C while `f` runs is this call's, not a reason to end the program.
    let taken = interrupt.as_ref().map(|interrupt| interrupt.take_sigint());
    let ended = async {
        match &interrupt {
            Some(interrupt) => interrupt.interruptible_ended().await,
            None => std::future::pending().await,
        }
    };
    let cancelled = |signal: &str| {
        Ok(MultiValue::from_iter([
            Value::Boolean(false),
            Value::String(lua.create_string("interrupted")?),
            Value::String(lua.create_string(signal)?),
        ]))
    };
    tokio::select! {
        result = f.call_async::<MultiValue>(args) => {
            let mut out = result?;
            out.push_front(Value::Boolean(true));
            Ok(out)
        }
        _ = interrupted => {
            if let Some(taken) = &taken {
                taken.gave_way();
            }
            cancelled("SIGINT")
        }
        why = ended => cancelled(&why),
    }
}

/// A spinner with the time elapsed, on stderr while it is a terminal that is not `dumb`
/// (nothing otherwise: it redraws its line).
/// `s:stop()` clears it; so does dropping it.
struct Spinner {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Spinner {
    fn start(label: Option<String>) -> Spinner {
        if !std::io::stderr().is_terminal() || dumb() {
            return Spinner { task: None };
        }
        let label = label.unwrap_or_else(|| "waiting".into());
        let task = tokio::task::spawn_local(async move {
            const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
            let started = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for frame in FRAMES.iter().cycle() {
                tick.tick().await;
                let secs = started.elapsed().as_secs_f64();
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K{frame} {label} {secs:.1}s");
                let _ = err.flush();
            }
        });
        Spinner { task: Some(task) }
    }

    fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop();
    }
}

impl UserData for Spinner {
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_method_mut("stop", |_, this, ()| {
            this.stop();
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Strips ANSI escape sequences (CSI ... letter), leaving the text a terminal shows.
    fn visible(s: &str) -> String {
        let mut out = String::new();
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\x1b' && chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    #[test]
    fn a_table_renders_with_its_columns_aligned() {
        let md = "| name | size |\n|---|---|\n| a | 1 |\n| longer name | 12345 |\n";
        let text = visible(&render(md, 60));
        let rows: Vec<&str> = text.lines().filter(|l| l.contains('│')).collect();
        assert!(rows.len() >= 3, "{text}");
        let bars = |l: &str| -> Vec<usize> {
            l.chars()
                .enumerate()
                .filter(|(_, c)| *c == '│')
                .map(|(i, _)| i)
                .collect()
        };
        for r in &rows {
            assert_eq!(bars(r), bars(rows[0]), "{text}");
        }
    }
}
