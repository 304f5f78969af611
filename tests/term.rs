//! The `term` and `colony` Lua modules from a script: rendering without a terminal, misuse named,
//! `term.interruptible` cancelling a wait on SIGINT, and what `colony.*` tells a script.

mod support;

use support::script::Sandbox;

#[test]
fn render_lays_out_markdown_even_when_piped() {
    let run = Sandbox::new()
        .lua(
            r#"
local out = term.render("| k | v |\n|---|---|\n| alpha | 1 |\n| b | 22 |\n", { width = 40 })
print(term.is_tty(), term.styled(), term.width())
io.write(out)
"#,
            &[],
        )
        .ok();
    let mut lines = run.stdout.lines();
    assert_eq!(lines.next(), Some("false\tfalse\t80"));
    let rows: Vec<String> = lines
        .map(support::pty::visible)
        .filter(|l| l.contains('│'))
        .collect();
    assert_eq!(rows.len(), 3, "{}", run.stdout);
    let at = |l: &str| l.char_indices().filter(|(_, c)| *c == '│').count();
    assert!(rows.iter().all(|r| at(r) == at(&rows[0])));
    let second_bar = |l: &str| l.chars().skip(1).position(|c| c == '│');
    assert!(rows.iter().all(|r| second_bar(r) == second_bar(&rows[0])));
}

#[test]
fn misuse_names_the_function_and_the_argument() {
    let sb = Sandbox::new();
    for (call, says) in [
        (
            "term.render(5)",
            "term.render: the Markdown must be a string",
        ),
        (
            "term.render('x', { width = 'wide' })",
            "term.render: width must be a number of columns",
        ),
        // An option it does not know is named (a misspelt width was dropped unsaid), as
        // json.encode's and mcp.cached_tools' are (their modules have no test file of their
        // own that runs a script).
        (
            "term.render('x', { widht = 40 })",
            "term.render: unknown field \"widht\" (fields: width)",
        ),
        (
            "json.encode({}, { prety = true })",
            "json.encode: unknown field \"prety\" (fields: pretty)",
        ),
        (
            "mcp.cached_tools{ on_elict = print }",
            "mcp.cached_tools: unknown field \"on_elict\" (fields: on_elicit)",
        ),
        (
            "term.is_tty('stdwhat')",
            "term.is_tty: \"stdwhat\" is not stdin, stdout or stderr",
        ),
        (
            "term.interruptible(42)",
            "term.interruptible: the first argument must be a function",
        ),
    ] {
        let run = sb.lua(call, &[]).failed();
        assert!(run.stderr.contains(says), "{call}: {}", run.stderr);
        assert!(
            run.stderr.contains("script.lua:1"),
            "{call}: {}",
            run.stderr
        );
    }
}

#[test]
fn interruptible_passes_results_through_and_sigint_cancels_the_wait() {
    let sb = Sandbox::new();
    let run = sb
        .lua(
            "print(term.interruptible(function(a, b) return a + b, 'x' end, 2, 3))",
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "true\t5\tx\n");

    // The signal listener runs on another thread and may hear the SIGINT only after the call it
    // cancelled has ended: the script goes on a while (`ai.sleep`) so that a listener taking
    // the late signal for the program's would end it (130) before it prints "after". Then a
    // second Ctrl-C, outside any such call, is the program's.
    let started = sb.path("started");
    let resumed = sb.path("resumed");
    let script = sb.write(
        "wait.lua",
        &format!(
            r#"
local ok, why = term.interruptible(function()
  fs.write({started:?}, "yes")
  ai.sleep(600000)
  return "slept"
end)
print(ok, why)
ai.sleep(100)
print("after")
io.stdout:flush()
fs.write({resumed:?}, "yes")
ai.sleep(60000)
print("not reached")
"#,
            started = started.display().to_string(),
            resumed = resumed.display().to_string()
        ),
    );
    let child = sb.spawn(&["run", &script.display().to_string()]);
    let interrupt = |child: &std::process::Child| support::signal(child.id(), "INT");
    while !started.exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    interrupt(&child);
    let mut child = child;
    while !resumed.exists() {
        if child.try_wait().expect("colony runs").is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if resumed.exists() {
        interrupt(&child);
    }
    let out = child.wait_with_output().expect("colony ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "false\tinterrupted\nafter\n",
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("the program was ended by SIGINT"),
        "{stderr}"
    );
}

#[test]
fn colony_tells_a_script_its_commands_scripts_examples_and_config() {
    let sb = Sandbox::new();
    sb.colony(&["config", "set", "code", "provider", "openai"])
        .ok();
    sb.colony(&["config", "set", "code", "key", "sk-secret-0123456789"])
        .ok();
    let run = sb
        .lua(
            r#"
local names = {}
for _, c in ipairs(colony.commands()) do names[#names + 1] = c.name end
print(table.concat(names, " "))
local scripts = {}
for _, s in ipairs(colony.scripts()) do scripts[#scripts + 1] = s.file end
print(table.concat(scripts, " "))
print(#colony.examples() > 0, colony.examples()[1].source:sub(1, 2))
local u = colony.config()[1]
print(u.use, u.provider, u.key_stored, u.key, u.model)
print(fs.absolute("x.txt"):sub(1, 1))
"#,
            &[],
        )
        .ok();
    let lines = run.lines();
    assert!(
        lines[0].starts_with("run ask chat scripts "),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains(" config "));
    assert_eq!(lines[1], "ask.lua chat.lua");
    assert_eq!(lines[2], "true\t--");
    assert_eq!(lines[3], "code\topenai\ttrue\tnil\tnil");
    assert_eq!(lines[4], "/");
    assert!(!run.stdout.contains("sk-secret"));
}
