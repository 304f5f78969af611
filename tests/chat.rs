//! `colony chat` as a person uses it: through a pseudo-terminal against the fake provider (a
//! conversation continued across invocations, a tool call shown, Ctrl-C during a slow stream,
//! the Markdown rendering), and piped (plain output; a server's questions asked and answered
//! from the next lines of input, Ctrl-D declining).

mod support;

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::model_calls;
use support::pty::{Pty, visible};
use support::script::Sandbox;

fn sandbox(fake: &FakeProvider) -> Sandbox {
    support::styled(fake, "anthropic")
}

/// The texts of a request's messages, as `role: text` (tool calls and results by name).
fn transcript(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .flat_map(|m| {
            let role = m["role"].as_str().unwrap_or("?").to_string();
            m["content"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |part| match part["type"].as_str() {
                    Some("text") => format!("{role}: {}", part["text"].as_str().unwrap_or("")),
                    Some("tool_use") => format!("{role}: call {}", part["name"]),
                    Some("tool_result") => format!("{role}: result"),
                    other => format!("{role}: {other:?}"),
                })
        })
        .collect()
}

#[test]
fn a_conversation_continues_across_two_invocations() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    fake.push(Reply::text("Paris is the capital of France."));
    let mut first = Pty::start(&sb, &["chat", "What is the capital of France?"], &[]);
    first.expect("capital of France.");
    let (code, _) = first.finish();
    assert_eq!(code, 0);

    fake.push(Reply::text("About two million people."));
    let mut second = Pty::start(&sb, &["chat", "How many people live there?"], &[]);
    second.expect("two million");
    let (code, _) = second.finish();
    assert_eq!(code, 0);

    let calls = model_calls(&fake);
    assert_eq!(calls.len(), 2);
    assert_eq!(
        transcript(&calls[1]),
        [
            "user: What is the capital of France?",
            "assistant: Paris is the capital of France.",
            "user: How many people live there?",
        ]
    );
    // Streamed: the chat asked for a stream.
    assert_eq!(calls[1]["stream"], json!(true));

    let history = sb.colony(&["chat", "--history"]).ok();
    assert!(
        history.stdout.contains("> How many people live there?")
            && history.stdout.contains("About two million people."),
        "{}",
        history.stdout
    );

    // Another use-type keeps its own conversation; --new and --clear start afresh.
    fake.push(Reply::text("fn main() {}"));
    sb.colony(&["chat", "--use", "code", "Smallest Rust program?"])
        .ok();
    assert_eq!(transcript(&model_calls(&fake)[2]).len(), 1);
    let cleared = sb.colony(&["chat", "--clear"]).ok();
    assert_eq!(cleared.stdout, "conversation chat cleared\n");
    // One that was never there is not said to be cleared (a misspelt --use read as done).
    let cleared = sb.colony(&["chat", "--clear", "--use", "cdoe"]).ok();
    assert_eq!(cleared.stdout, "no conversation cdoe to clear\n");
    let history = sb.colony(&["chat", "--history"]).ok();
    assert_eq!(history.stdout.trim(), "(no conversation yet)");
    let code_history = sb.colony(&["chat", "--use", "code", "--history"]).ok();
    assert!(code_history.stdout.contains("fn main() {}"));
    fake.push(Reply::text("Fresh."));
    sb.colony(&["chat", "--use", "code", "--new", "Hello"]).ok();
    assert_eq!(transcript(&model_calls(&fake)[3]), ["user: Hello"]);
}

#[test]
fn a_tool_call_is_shown_as_it_happens() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let notes = sb.write("notes.txt", "buy bread");
    let notes = notes.display().to_string();
    let missing = sb.path("missing.txt").display().to_string();
    fake.push(Reply::tool_calls(vec![
        ("toolu_1", "read_file", json!({ "path": notes })),
        ("toolu_2", "read_file", json!({ "path": missing })),
    ]));
    fake.push(Reply::text("Your notes say: buy bread."));
    let mut pty = Pty::start(
        &sb,
        &["chat", "--tool", "read_file", "What do my notes say?"],
        &[],
    );
    pty.expect("buy bread.");
    let (code, shown) = pty.finish();
    assert_eq!(code, 0, "{shown}");
    let shown = visible(&shown);
    let mut lines: Vec<&str> = shown.lines().filter(|l| l.contains("⚙")).collect();
    assert_eq!(lines.len(), 2, "{shown}");
    // The two calls run at once and are shown as each ends, in either order.
    lines.sort_by_key(|l| l.contains("missing.txt"));
    assert!(
        lines[0].contains("read_file")
            && lines[0].contains("notes.txt")
            && lines[0].ends_with("→ ok"),
        "{shown}"
    );
    assert!(
        lines[1].contains("missing.txt") && lines[1].contains("→ error: not_found"),
        "{shown}"
    );
    // The tool was offered and its result went back.
    let calls = model_calls(&fake);
    assert_eq!(calls[0]["tools"][0]["name"], "read_file");
    assert!(calls[1].to_string().contains("buy bread"));
    // Enabled once, it stays enabled.
    fake.push(Reply::text("ok"));
    sb.colony(&["chat", "again"]).ok();
    assert_eq!(model_calls(&fake)[2]["tools"][0]["name"], "read_file");
}

#[test]
fn ctrl_c_during_a_slow_stream_keeps_the_history_and_a_second_exits() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    fake.push(Reply::text("Hello there."));
    sb.colony(&["chat", "Hi"]).ok();

    // Interactive: the slow reply is cut off by Ctrl-C, the prompt comes back, the next
    // question carries the whole history, and Ctrl-C at the prompt ends the chat.
    let words: Vec<String> = (1..=200).map(|i| format!("word{i}")).collect();
    fake.push(Reply::text(words.join(" ")).stream_delay(100));
    let mut pty = Pty::start(&sb, &["chat"], &[]);
    pty.expect("chat> ");
    pty.send_line("Tell me a long story");
    pty.expect("word3");
    pty.ctrl_c();
    pty.expect("[interrupted");
    pty.expect("chat> ");
    fake.push(Reply::text("Shorter then."));
    pty.send_line("Shorter please");
    pty.expect("Shorter then.");
    pty.expect("chat> ");
    pty.ctrl_c();
    let (code, shown) = pty.finish();
    assert_eq!(code, 0, "{shown}");
    assert!(
        !visible(&shown).contains("word200"),
        "the stream was cut off"
    );

    let calls = model_calls(&fake);
    let last = transcript(calls.last().unwrap());
    assert_eq!(last.len(), 5, "{last:?}");
    assert_eq!(last[0], "user: Hi");
    assert_eq!(last[1], "assistant: Hello there.");
    assert_eq!(last[2], "user: Tell me a long story");
    assert!(
        last[3].starts_with("assistant: word1 word2 word3")
            && last[3].ends_with("[interrupted by the user]"),
        "{last:?}"
    );
    assert_eq!(last[4], "user: Shorter please");
    let history = sb.colony(&["chat", "--history"]).ok();
    assert!(
        history.stdout.contains("Shorter then."),
        "{}",
        history.stdout
    );
}

#[test]
fn one_shot_ctrl_c_saves_the_question_and_exits_130() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let words: Vec<String> = (1..=200).map(|i| format!("w{i}")).collect();
    fake.push(Reply::text(words.join(" ")).stream_delay(100));
    let mut pty = Pty::start(&sb, &["chat", "Count slowly"], &[]);
    pty.expect("w2");
    pty.ctrl_c();
    let (code, shown) = pty.finish();
    assert_eq!(code, 130, "{shown}");
    // One question, no prompt: the note names none (it said "Ctrl-C at the prompt exits").
    assert!(
        shown.contains("[interrupted: the conversation is kept]"),
        "{shown}"
    );
    assert!(!shown.contains("at the prompt"), "{shown}");
    let history = sb.colony(&["chat", "--history"]).ok();
    assert!(
        history.stdout.contains("> Count slowly")
            && history.stdout.contains("[interrupted by the user]"),
        "{}",
        history.stdout
    );
}

/// A reply whose connection drops after part of it was shown keeps the question and that
/// part in the conversation, marked (both were lost: the person had read it), and the run
/// fails.
#[test]
fn a_reply_cut_off_by_a_dropped_connection_keeps_what_was_shown() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    fake.set_default(Reply::drop_mid_stream("the first half of it"));
    let run = sb.colony(&["chat", "Tell me everything"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    // The fake sends about half of the stream, then closes the connection.
    assert!(run.stdout.starts_with("the first"), "{}", run.stdout);
    assert!(
        run.stderr
            .contains("(the question and the part shown are kept in the conversation)"),
        "{}",
        run.stderr
    );
    let history = sb.colony(&["chat", "--history"]).ok();
    assert!(
        history.stdout.contains("> Tell me everything")
            && history.stdout.contains(run.stdout.trim())
            && history.stdout.contains("[cut short: "),
        "{}",
        history.stdout
    );
    // With stdout and stderr into one file (`2>&1`) the note starts a line of its own: it ran
    // on from the reply's last word, the newline before it still in stdout's buffer.
    let both = sb.path("both.txt");
    let file = std::fs::File::create(&both).unwrap();
    let status = sb
        .command(&["chat", "--new", "Tell me again"])
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1));
    let shown = std::fs::read_to_string(&both).unwrap();
    let at = shown.find("colony chat: ").expect("the note");
    assert!(shown[..at].ends_with('\n'), "{shown:?}");
}

const MARKDOWN: &str = "# Sizes\n\n| name | size |\n|---|---|\n| a | 1 |\n| longer name | 12345 |\n\n```rust\nfn main() {}\n```\n";

#[test]
fn plain_text_when_piped_or_no_color() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    fake.push(Reply::text(MARKDOWN));
    let run = sb.colony(&["chat", "Sizes?"]).ok();
    assert_eq!(run.stdout, MARKDOWN, "exactly the reply, no styling");

    fake.push(Reply::text(MARKDOWN));
    let mut pty = Pty::start(&sb, &["chat", "Sizes again?"], &[("NO_COLOR", "1")]);
    pty.expect("fn main() {}");
    let (code, shown) = pty.finish();
    assert_eq!(code, 0);
    assert!(shown.contains("| longer name | 12345 |"), "{shown:?}");
    assert!(!shown.contains('│'), "not rendered: {shown:?}");

    // A dumb terminal (Emacs' shell, some CI consoles) shows escapes as text: none are sent,
    // no cursor moves and no colour.
    fake.push(Reply::text(MARKDOWN));
    let mut pty = Pty::start(&sb, &["chat", "Sizes once more?"], &[("TERM", "dumb")]);
    pty.expect("fn main() {}");
    let (code, shown) = pty.finish();
    assert_eq!(code, 0);
    assert!(shown.contains("| longer name | 12345 |"), "{shown:?}");
    assert!(
        !shown.contains("\x1b["),
        "escapes on a dumb terminal: {shown:?}"
    );

    // The log's lines too (a warning: residents spawned, never watched), and under NO_COLOR.
    let script = sb.write("warns.lua", "ai.spawn{ name = \"idle\" }\n");
    let script = script.display().to_string();
    for env in [("TERM", "dumb"), ("NO_COLOR", "1")] {
        let pty = Pty::start(&sb, &["run", &script], &[env]);
        let (code, shown) = pty.finish();
        assert_eq!(code, 0, "{env:?}: {shown:?}");
        assert!(shown.contains("WARN"), "{env:?}: {shown:?}");
        assert!(
            !shown.contains("\x1b["),
            "{env:?}: escapes in the log: {shown:?}"
        );
    }
}

#[test]
fn a_reply_renders_as_markdown_with_the_table_aligned() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    fake.push(Reply::text(MARKDOWN));
    let pty = Pty::start(&sb, &["chat", "Sizes?"], &[]);
    let (code, shown) = pty.finish();
    assert_eq!(code, 0, "{shown}");
    // What streamed is erased (cursor up, clear below) and the rendering is written over it.
    let (_, rendered) = shown
        .rsplit_once("\x1b[J")
        .unwrap_or_else(|| panic!("nothing was erased: {shown:?}"));
    let text = visible(rendered).replace('\r', "");
    assert!(!text.contains("|---|"), "{text}");
    assert!(!text.contains("```"), "{text}");
    assert!(text.contains("fn main() {}"), "{text}");
    assert!(
        text.contains("Sizes") && !text.contains("# Sizes"),
        "{text}"
    );
    let rows: Vec<&str> = text.lines().filter(|l| l.contains('│')).collect();
    assert_eq!(rows.len(), 3, "header and two rows: {text}");
    let bars = |l: &str| -> Vec<usize> {
        l.chars()
            .enumerate()
            .filter(|(_, c)| *c == '│')
            .map(|(i, _)| i)
            .collect()
    };
    for r in &rows {
        assert_eq!(bars(r), bars(rows[0]), "columns aligned:\n{text}");
        assert_eq!(bars(r).len(), 3, "{text}");
    }
    assert!(rows[2].contains("longer name") && rows[2].contains("12345"));
}

#[test]
fn attachments_are_checked_and_passed_on() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let run = sb
        .colony(&["chat", "--file", "/no/such/file.png", "Look"])
        .failed();
    assert!(
        run.stderr
            .contains("--file /no/such/file.png: no such file"),
        "{}",
        run.stderr
    );
    // A folder is named as one, not as missing.
    let folder = sb.path("a-folder");
    std::fs::create_dir(&folder).unwrap();
    let run = sb
        .colony(&["chat", "--file", &folder.display().to_string(), "Look"])
        .failed();
    assert!(
        run.stderr.contains(&format!(
            "--file {}: a folder, not a file",
            folder.display()
        )),
        "{}",
        run.stderr
    );
    // A device (or a pipe, `/dev/stdin`) is refused before anything runs, as is a name that
    // is not UTF-8 (it reached the script changed, naming another file).
    let run = sb.colony(&["chat", "--file", "/dev/null", "Look"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("--file /dev/null: not a regular file (a device or a pipe)"),
        "{}",
        run.stderr
    );
    // One past what any API takes is refused in terms a person at a shell can act on (it
    // said to attach "{ name = ..., data = ... }", the Lua API's words).
    let big = sb.path("big.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(80_000_000) // sparse: no disk used
        .unwrap();
    let run = sb.colony(&["chat", "--file", &big.display().to_string(), "Look"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "80.0 MB is more than any model's API takes in one file (75.0 MB): attach a part of \
             it (`split -b 50M FILE part-` makes parts to attach)"
        ) && !run.stderr.contains("data ="),
        "{}",
        run.stderr
    );
    // `/attach` at the prompt refuses a device at once (it was "attached", then failed the
    // next message and was dropped).
    let run = sb
        .colony_with_stdin(&["chat", "--new"], "/attach /dev/zero\n")
        .ok();
    assert!(
        run.stdout
            .contains("/dev/zero: not a regular file (a device or a pipe)"),
        "{}",
        run.stdout
    );
    let latin1 = {
        use std::os::unix::ffi::OsStrExt;
        sb.path("")
            .join(std::ffi::OsStr::from_bytes(b"caf\xe9.txt"))
    };
    std::fs::write(&latin1, "hello").unwrap();
    let out = sb
        .command(&["chat", "Look"])
        .arg("--file")
        .arg(&latin1)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("the name is not UTF-8"), "{stderr}");
    assert_eq!(model_calls(&fake).len(), 0);
    let file = sb.write("n.csv", "a,b\n1,2\n");
    fake.push(Reply::text("Two columns."));
    sb.colony(&[
        "chat",
        "--file",
        &file.display().to_string(),
        "What is in it?",
    ])
    .ok();
    // The message carries the file (as `files`, by absolute path) in the saved conversation.
    let history = sb.colony(&["chat", "--history"]).ok();
    assert!(
        history
            .stdout
            .contains(&format!("[attached {}]", file.display())),
        "{}",
        history.stdout
    );
}

#[test]
fn scripts_lists_and_prints_the_front_ends() {
    let sb = Sandbox::new();
    let list = sb.colony(&["scripts"]).ok();
    let names: Vec<&str> = list
        .stdout
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(names, ["ask", "chat"]);
    let chat = sb.colony(&["scripts", "cat", "chat"]).ok();
    assert_eq!(
        chat.stdout,
        std::fs::read_to_string(support::script::project_root().join("scripts/chat.lua")).unwrap()
    );
    sb.colony(&["scripts", "cat", "nope"]).failed();
}

#[test]
fn interactive_commands() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let data = sb.write("data.csv", "a,b\n1,2\n");
    let out = sb.path("chat.md");
    fake.push(Reply::text("It has **two** columns."));
    fake.push(Reply::text("Code answer."));
    let home = sb.dir.path().display().to_string();
    let mut pty = Pty::start(&sb, &["chat"], &[("HOME", &home)]);
    pty.expect("chat> ");
    // Each line goes in once the prompt is back: the editor puts the terminal in raw mode as it
    // starts, and input typed before that may be flushed.
    let mut say = |line: &str, shows: &[&str], prompt: &str| {
        pty.send_line(line);
        for s in shows {
            pty.expect(s);
        }
        pty.expect(prompt);
    };
    say("/tools on read_file", &["read_file on"], "chat> ");
    say("/tools", &["[on]  read_file", "[off] fetch"], "chat> ");
    say(
        "/attach /no/such.csv",
        &["no such file: /no/such.csv"],
        "chat> ",
    );
    // A folder is refused where it is named, not accepted and failed at the next message.
    let folder = sb.dir.path().display().to_string();
    say(
        &format!("/attach {folder}"),
        &[&format!("{folder}: a folder, not a file")],
        "chat> ",
    );
    // No shell reads the line: `~/` is expanded as one would (it read "no such file").
    say("/attach ~/data.csv", &["attached"], "chat> ");
    say("/model claude-fake-2", &["model claude-fake-2"], "chat> ");
    say("How many columns?", &["columns."], "chat> ");
    say(&format!("/save {}", out.display()), &["saved to"], "chat> ");
    say(
        "/use code",
        &["use-type code (0 messages so far)"],
        "code> ",
    );
    say("Anything", &["Code answer."], "code> ");
    say("/bogus", &["unknown command /bogus"], "code> ");
    pty.send_line("/exit");
    let (code, shown) = pty.finish();
    assert_eq!(code, 0, "{shown}");

    let calls = model_calls(&fake);
    assert_eq!(calls[0]["model"], "claude-fake-2");
    assert_eq!(calls[0]["tools"][0]["name"], "read_file");
    assert_eq!(
        transcript(&calls[1]),
        ["user: Anything"],
        "code has its own"
    );
    let saved = std::fs::read_to_string(&out).unwrap();
    assert!(saved.starts_with("# colony chat (chat)"), "{saved}");
    assert!(saved.contains("## You\n\nHow many columns?"), "{saved}");
    assert!(
        saved.contains(&format!("*attached: {}*", data.display())),
        "{saved}"
    );
    assert!(
        saved.contains("## Assistant\n\nIt has **two** columns."),
        "{saved}"
    );
}

/// An attachment's content reaches the model (a CSV: inlined as text in every style).
#[test]
fn an_attached_file_reaches_the_request() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let file = sb.write("n.csv", "city,visitors\nLisbon,1234\n");
    fake.push(Reply::text("Lisbon."));
    sb.colony(&["chat", "--file", &file.display().to_string(), "Which city?"])
        .ok();
    let body = model_calls(&fake)[0].to_string();
    assert!(body.contains("Lisbon,1234"), "{body}");
    // The file gone, the conversation goes on: the attachment is named as no longer there.
    std::fs::remove_file(&file).unwrap();
    fake.push(Reply::text("Still Lisbon."));
    let run = sb.colony(&["chat", "And now?"]).ok();
    assert_eq!(run.stdout.trim(), "Still Lisbon.", "{}", run.stderr);
    let body = model_calls(&fake)[1].to_string();
    assert!(body.contains("no longer available"), "{body}");
    assert!(!body.contains("Lisbon,1234"), "{body}");
}

#[test]
fn piped_lines_are_a_conversation_and_a_failure_fails_the_run() {
    use std::io::Write;
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    fake.push(Reply::text("One."));
    fake.push(Reply::text("Two."));
    fake.push(Reply::status(400));
    let mut child = sb
        .command(&["chat"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"First\nSecond\nThird\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "One.\nTwo.\n");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("(the question was not added to the conversation)"),
        "{stderr}"
    );
    let calls = model_calls(&fake);
    assert_eq!(transcript(&calls[1]).len(), 3);
    assert_eq!(transcript(&calls[2]).len(), 5);
    let history = sb.colony(&["chat", "--history"]).ok();
    assert!(!history.stdout.contains("Third"), "{}", history.stdout);
    // A line that is not UTF-8 (Latin-1 here, a stray byte in a paste) is left out, said in
    // one line, and the chat goes on (it ended the session, exit 1).
    fake.push(Reply::text("Four."));
    fake.push(Reply::text("Five."));
    let mut child = sb
        .command(&["chat"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Fourth\ncaf\xe9\nFifth\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "colony chat: cannot read that line: stream did not contain valid UTF-8 (colony chat \
         reads UTF-8 text); it was left out"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Four.\nFive.\n");
    let history = sb.colony(&["chat", "--history"]).ok();
    assert!(history.stdout.contains("Five."), "{}", history.stdout);
}

#[test]
fn a_turn_that_raises_is_reported_and_the_conversation_kept() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    // A conversation the turn refuses, written into the chat's store as a program would.
    let chat_state = sb.state_home().join("colony").join("chat");
    let bad = sb.write(
        "bad.lua",
        r#"store.set("conversation/chat", { { role = "narrator", content = "Once upon a time" } })"#,
    );
    sb.colony(&[
        "run",
        "--state",
        &chat_state.display().to_string(),
        &bad.display().to_string(),
    ])
    .ok();
    let run = sb.colony(&["chat", "Go on"]).failed();
    assert!(
        run.stderr.contains("history[1].role = \"narrator\"")
            && run
                .stderr
                .contains("(the question was not added to the conversation)"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("traceback"), "{}", run.stderr);
    assert_eq!(
        run.stderr.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "one line: {}",
        run.stderr
    );
    assert_eq!(model_calls(&fake).len(), 0);
    let history = sb.colony(&["chat", "--history"]).ok();
    assert!(!history.stdout.contains("Go on"), "{}", history.stdout);
}

/// `colony chat` fed `input` on a pipe, with the elicitation fixture server configured and its
/// tools cached; the model calls its `signup` tool, then says `Welcome.`. Stdout, stderr, and
/// what the tool answered (the form's answer, as JSON) in the model's second request.
fn chat_with_a_server_that_asks(input: &str) -> (String, String, Value) {
    use std::io::Write;
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    sb.write(
        "config.toml",
        &format!(
            "[mcp.signup]\ncommand = \"python3\"\nargs = [\"{}\"]\n",
            support::mcp::server_script()
                .with_file_name("elicit_server.py")
                .display()
        ),
    );
    sb.colony(&["tools", "refresh"]).ok();
    fake.push(Reply::tool_call("toolu_1", "signup__signup", json!({})));
    fake.push(Reply::text("Welcome."));
    let mut child = sb
        .command(&["chat"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    let calls = model_calls(&fake);
    assert_eq!(calls.len(), 2, "{stdout}\n{stderr}");
    let result = calls[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|p| p["type"] == "tool_result")
        .expect("the tool's result");
    let text = result["content"]
        .as_array()
        .map(|c| c[0]["text"].as_str().unwrap_or("").to_string())
        .or_else(|| result["content"].as_str().map(str::to_string))
        .unwrap();
    (
        stdout,
        stderr,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[test]
fn a_server_that_asks_is_answered_by_the_person_at_the_terminal() {
    // Fields in the order of their names: age (typed: "forty" is asked again), name, plan
    // (one of a list: "gold" is asked again), subscribe (left to its default).
    let (stdout, stderr, answer) =
        chat_with_a_server_that_asks("Sign me up\nforty\n42\nAda\ngold\npro\n\n");
    assert_eq!(stdout, "Welcome.\n", "{stderr}");
    assert!(stderr.contains("[signup] asks: Who are you?"), "{stderr}");
    assert!(stderr.contains("Your age in years"), "{stderr}");
    assert!(stderr.contains("age is an integer"), "{stderr}");
    assert!(stderr.contains("plan is one of: basic, pro"), "{stderr}");
    assert_eq!(
        answer,
        json!({
            "action": "accept",
            "content": { "age": 42, "name": "Ada", "plan": "pro", "subscribe": false }
        }),
        "{stderr}"
    );
}

#[test]
fn ctrl_d_while_a_server_asks_declines() {
    let (stdout, stderr, answer) = chat_with_a_server_that_asks("Sign me up\n42\n");
    assert_eq!(stdout, "Welcome.\n", "{stderr}");
    assert_eq!(answer, json!({ "action": "decline" }), "{stderr}");
}

/// An attachment that fails its message is dropped with it, and the user told how to send it
/// again (it failed every message after, with no way to drop it); `/attach` alone says how it
/// is used; an earlier message's attachment that is now a folder is sent as a line saying it is
/// no longer available, as a deleted one is (every later message failed).
#[test]
fn an_attachment_that_cannot_go_does_not_stop_the_conversation() {
    use std::io::Write;
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    sb.write("notes.txt", "the notes' text");
    fake.push(Reply::status(400));
    fake.push(Reply::text("Two."));
    let mut child = sb
        .command(&["chat", "--new"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let notes = sb.path("notes.txt").display().to_string();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("/attach\n/attach {notes}\nFirst\nSecond\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stdout.starts_with("/attach PATH\n"), "{stdout}");
    assert!(stdout.ends_with("Two.\n"), "{stdout}");
    assert!(
        stderr.contains("the files attached to that message were dropped"),
        "{stderr}{stdout}"
    );
    let calls = model_calls(&fake);
    assert!(
        calls[0].to_string().contains("the notes' text"),
        "{}",
        calls[0]
    );
    assert!(
        !calls[1].to_string().contains("the notes' text"),
        "{}",
        calls[1]
    );

    sb.write("grow.txt", "small");
    fake.push(Reply::text("Read it."));
    fake.push(Reply::text("Still here."));
    let file = sb.path("grow.txt").display().to_string();
    sb.colony(&["chat", "--new", "--file", &file, "first"]).ok();
    std::fs::remove_file(sb.path("grow.txt")).unwrap();
    std::fs::create_dir(sb.path("grow.txt")).unwrap();
    let run = sb.colony(&["chat", "second"]).ok();
    assert_eq!(run.stdout.trim(), "Still here.");
    let calls = model_calls(&fake);
    assert!(
        calls[3]
            .to_string()
            .contains("[attached grow.txt: no longer available]"),
        "{}",
        calls[3]
    );
    assert!(
        !calls[3].to_string().contains(&file),
        "the path went: {}",
        calls[3]
    );

    // A file changed since it was attached is not sent as the one asked about (it was, the
    // earlier message rewritten); one that has become a pipe is a line too, and the chat goes
    // on (every later message failed: "not a regular file").
    sb.write("plan.txt", "the first plan");
    sb.write("pipe.txt", "a file for now");
    fake.push(Reply::text("Noted."));
    fake.push(Reply::text("Again."));
    let (plan, pipe) = (
        sb.path("plan.txt").display().to_string(),
        sb.path("pipe.txt").display().to_string(),
    );
    sb.colony(&["chat", "--new", "--file", &plan, "--file", &pipe, "first"])
        .ok();
    sb.write("plan.txt", "a second plan, longer than the first");
    std::fs::remove_file(&pipe).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&pipe)
        .status()
        .unwrap();
    assert!(made.success());
    let run = sb.colony(&["chat", "second"]).ok();
    assert_eq!(run.stdout.trim(), "Again.");
    let last = model_calls(&fake).last().unwrap().to_string();
    assert!(!last.contains("a second plan"), "{last}");
    assert!(
        last.contains(
            "[attached plan.txt: changed since it was attached, not sent; pipe.txt: no longer a \
             regular file]"
        ),
        "{last}"
    );
}

/// `kill PID` (SIGTERM, `timeout`'s signal) or a closed terminal (SIGHUP) while a reply
/// streams: the chat ends with the signal's status and keeps the exchange as far as it went,
/// as Ctrl-C keeps it. It was ended where it waited and the question was lost.
#[test]
fn a_signal_during_a_reply_keeps_the_exchange_and_ends_the_chat() {
    for (args, signal, code) in [
        (vec!["chat", "Count slowly"], "TERM", 143),
        (vec!["chat"], "HUP", 129),
    ] {
        let fake = FakeProvider::start();
        let sb = sandbox(&fake);
        let words: Vec<String> = (1..=200).map(|i| format!("w{i}")).collect();
        fake.push(Reply::text(words.join(" ")).stream_delay(100));
        let mut pty = Pty::start(&sb, &args, &[]);
        if args.len() == 1 {
            pty.expect("chat> ");
            pty.send_line("Count slowly");
        }
        pty.expect("w2");
        pty.signal(signal);
        let (got, shown) = pty.finish();
        assert_eq!(got, code, "{args:?} {signal}: {shown}");
        assert!(
            visible(&shown).contains(&format!("ended by SIG{signal}")),
            "{args:?}: {shown}"
        );
        let history = sb.colony(&["chat", "--history"]).ok();
        assert!(
            history.stdout.contains("> Count slowly")
                && history.stdout.contains("w1 w2")
                && history
                    .stdout
                    .contains(&format!("[interrupted by SIG{signal}]")),
            "{args:?}: {}",
            history.stdout
        );
    }
}

/// `kill PID` (SIGTERM) or a closed terminal (SIGHUP) at a prompt, in a program's
/// `term.readline`, at `colony chat`'s own or in the config walk: the terminal is given back as it was found. It
/// was left raw (no echo, no line editing) for the shell after, until `stty sane`.
#[test]
fn a_signal_at_a_prompt_gives_the_terminal_back_as_it_was() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let script = sb.write("ask.lua", "print(term.readline(\"say> \"))\n");
    let script = script.display().to_string();
    for (args, signal, code) in [
        (vec!["run", script.as_str()], "TERM", 143),
        (vec!["run", script.as_str()], "HUP", 129),
        (vec!["chat"], "TERM", 143),
        // The config walk's first question.
        (vec!["config"], "TERM", 143),
    ] {
        let mut pty = Pty::start(&sb, &args, &[]);
        // The editor holds the terminal raw while it waits.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while pty.edits_lines() {
            assert!(std::time::Instant::now() < deadline, "{args:?}: never raw");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        pty.send("half typed");
        pty.signal(signal);
        let (got, shown, edits) = pty.finish_with_modes();
        assert_eq!(got, code, "{args:?} {signal}: {shown}");
        assert!(edits, "{args:?} {signal}: the terminal was left raw");
        // Bracketed paste, which the editor turned on, is off again (left on, every paste
        // into the shell after came wrapped in `^[[200~`).
        let on = shown.rfind("\x1b[?2004h");
        let off = shown.rfind("\x1b[?2004l");
        assert!(
            on.is_none_or(|on| off.is_some_and(|off| off > on)),
            "{args:?} {signal}: bracketed paste left on: {shown:?}"
        );
    }
}

/// README: "`colony scripts cat chat > my-chat.lua` gives you one to change, and `colony run
/// my-chat.lua` runs your copy". Run with a question as `colony chat` is, the copy dropped the
/// question without a word and ended at once (status 0); an unknown option is now named.
#[test]
fn a_copy_of_the_chat_script_takes_its_question_as_colony_chat_does() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    fake.push(Reply::text("Paris."));
    let copy = sb.colony(&["scripts", "cat", "chat"]).ok();
    let mine = sb.write("my-chat.lua", &copy.stdout);
    let mine = mine.display().to_string();
    let run = sb
        .colony(&["run", &mine, "What is the capital of France?"])
        .ok();
    assert_eq!(run.stdout.trim(), "Paris.", "{}", run.stderr);
    assert!(
        transcript(&model_calls(&fake)[0])
            .iter()
            .any(|m| m.contains("What is the capital of France?")),
        "{:?}",
        model_calls(&fake)
    );
    let run = sb.colony(&["run", &mine, "--bogus"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("chat.lua: unknown option --bogus"),
        "{}",
        run.stderr
    );
}

/// An answer the model did not finish says so after it, in `colony chat` and `colony ask`: a
/// refusal printed an empty line, an answer cut at max_tokens printed as if whole.
#[test]
fn an_answer_cut_short_or_refused_is_said_to_be() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    for (command, said) in [
        ("chat", "[the model refused to answer]"),
        ("ask", "colony ask: the model refused to answer"),
    ] {
        fake.push(Reply::text("").stop("refusal"));
        let run = sb.colony(&[command, "Help?"]).ok();
        assert_eq!(run.stdout, "\n", "{command}");
        assert!(run.stderr.contains(said), "{command}: {}", run.stderr);
    }
    for command in ["chat", "ask"] {
        fake.push(Reply::text("The first half").stop("max_tokens"));
        let run = sb.colony(&[command, "Everything?"]).ok();
        assert_eq!(run.stdout, "The first half\n", "{command}");
        assert!(
            run.stderr
                .contains("the answer was cut off at the model's output limit (max_tokens)"),
            "{command}: {}",
            run.stderr
        );
    }
    fake.push(Reply::text("Whole."));
    let run = sb.colony(&["chat", "More?"]).ok();
    assert_eq!(run.stderr, "", "a finished answer says nothing more");
}

/// On a terminal the model's escape sequences do not reach it, streamed or rendered: a reply
/// (which an attached file's text can shape) set the clipboard (OSC 52), the window's title
/// and cleared the screen. Piped, the reply is written exactly as it came.
#[test]
fn a_replys_escape_sequences_do_not_reach_the_terminal() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let hostile = "Here:\n\n\x1b]52;c;cHduZWQ=\x07\x1b]0;PWNED\x07\x1b[2J **bold**\n";
    fake.push(Reply::text(hostile));
    let pty = Pty::start(&sb, &["chat", "x"], &[]);
    let (code, shown) = pty.finish();
    assert_eq!(code, 0, "{shown:?}");
    for escape in ["\x1b]52;", "\x1b]0;", "\x1b[2J"] {
        assert!(!shown.contains(escape), "{escape:?} in {shown:?}");
    }
    assert!(shown.contains("bold"), "{shown:?}");
    fake.push(Reply::text(hostile));
    let piped = sb.colony(&["chat", "--new", "x"]).ok();
    assert_eq!(piped.stdout, hostile);
}
