//! `colony ask`, the helper: its request is grounded in this machine's facts (colony's commands,
//! the scripts and examples shipped, the providers and keys, the configured use-types), checked
//! on the request body the fake provider received, and replayed from a cassette.

mod support;

use std::path::PathBuf;

use serde_json::Value;
use support::fake::{FakeProvider, Reply};
use support::model_calls;
use support::script::{Sandbox, project_root};

const QUESTION: &str = "which examples use tools?";
const ANSWER: &str = "Six of them: quickstart.lua (weather.current), tools.lua (weather.forecast, \
    picnic.packing_list), newsroom.lua (tell, file_story), watcher.lua (notify), review.lua \
    (flag) and embed.lua (units.dozens).";

fn cassette() -> PathBuf {
    project_root().join("tests/data/ask/which_examples.jsonl")
}

/// The example programs in the repository's `examples/` folder, as the binary should know them.
fn examples_on_disk() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(project_root().join("examples"))
        .expect("examples/")
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.ends_with(".lua").then_some(name)
        })
        .collect();
    names.sort();
    names
}

/// The grounding lines naming the shipped examples, in order.
fn example_lines(system: &str) -> Vec<String> {
    system
        .lines()
        .skip_while(|l| !l.starts_with("Example programs shipped"))
        .skip(1)
        .take_while(|l| l.starts_with("- "))
        .map(str::to_string)
        .collect()
}

fn check_grounding(system: &str) {
    let lines = example_lines(system);
    let named: Vec<String> = lines
        .iter()
        .map(|l| l[2..].split(':').next().unwrap().to_string())
        .collect();
    assert_eq!(
        named,
        examples_on_disk(),
        "every shipped example, and only those:\n{system}"
    );
    let tools = lines.iter().find(|l| l.starts_with("- tools.lua")).unwrap();
    assert!(
        tools.contains("Tools it defines: weather.forecast, picnic.packing_list."),
        "{tools}"
    );
    for command in [
        "colony chat:",
        "colony ask:",
        "colony scripts:",
        "colony run:",
    ] {
        assert!(system.contains(command), "{command} missing:\n{system}");
    }
    assert!(
        system.contains("- chat: a multi-turn chat client"),
        "{system}"
    );
    assert!(system.contains("ANTHROPIC_API_KEY is set"), "{system}");
    assert!(system.contains("OPENAI_API_KEY is not set"), "{system}");
    assert!(system.contains("Cached MCP tools: none."), "{system}");
}

#[test]
fn the_request_is_grounded_with_the_shipped_examples() {
    let fake = FakeProvider::start();
    fake.push(Reply::text(ANSWER));
    let sb = support::styled(&fake, "anthropic");
    sb.colony(&["config", "set", "code", "provider", "openai"])
        .ok();
    sb.colony(&["config", "set", "code", "key", "sk-stored-0123456789"])
        .ok();
    let run = sb.colony(&["ask", QUESTION]).ok();
    assert_eq!(run.stdout.trim(), ANSWER);
    let body = &model_calls(&fake)[0];
    let system = body["system"].as_str().expect("a system prompt");
    check_grounding(system);
    assert!(
        system.contains("- code: provider openai, model (default), key stored in the config"),
        "{system}"
    );
    assert!(
        !body.to_string().contains("sk-stored"),
        "the key itself is never sent"
    );
    assert_eq!(body["messages"][0]["content"][0]["text"], QUESTION);
}

#[test]
fn answers_from_its_cassette() {
    let sb = Sandbox::new().env("ANTHROPIC_API_KEY", "test-key-anthropic-0123456789");
    let path = cassette().display().to_string();
    // A cassette miss here means the grounding changed (a new command, script or example):
    // regenerate the cassette (below) and look at what changed in it.
    let run = sb.colony(&["ask", "--replay", &path, QUESTION]).ok();
    assert_eq!(run.stdout.trim(), ANSWER);
    // The replayed request is the grounded one: replay answers only a request it holds.
    let line = std::fs::read_to_string(cassette()).unwrap();
    let recorded: Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    check_grounding(recorded["request"]["system"].as_str().unwrap());
}

/// Rewrites the cassette against the fake provider (after a change to the grounding, the
/// commands or the examples): `cargo test --test ask_helper -- --ignored regenerate`.
#[test]
#[ignore]
fn regenerate() {
    let fake = FakeProvider::start();
    fake.push(Reply::text(ANSWER));
    let sb: Sandbox = support::styled(&fake, "anthropic");
    let _ = std::fs::remove_file(cassette());
    let path = cassette().display().to_string();
    sb.colony(&["ask", "--record", &path, QUESTION]).ok();
}

#[test]
fn an_empty_question_or_model_is_refused_before_anything_runs() {
    // `colony ask ""` ended in the script's assert, a Lua traceback; `--model ""` was sent.
    let sb = Sandbox::new();
    let run = sb.colony(&["ask", ""]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert_eq!(
        run.stderr.trim(),
        "colony ask: the question is empty (colony ask QUESTION...)"
    );
    let run = sb.colony(&["ask", "--model", "", "hi"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("invalid value '' for '--model <MODEL>': must not be empty"),
        "{}",
        run.stderr
    );
    // `colony chat` takes the same flags the same way (it sent `"model": ""`).
    for (flag, shown) in [("--model", "--model <MODEL>"), ("--use", "--use <USE>")] {
        let run = sb.colony(&["chat", "--new", flag, " ", "hi"]);
        assert_eq!(run.code, 2, "{}", run.stderr);
        assert!(
            run.stderr.contains(&format!(
                "invalid value ' ' for '{shown}': must not be empty"
            )),
            "{}",
            run.stderr
        );
    }
}

#[test]
fn a_failure_that_passes_is_tried_again_and_one_that_does_not_is_not() {
    let fake = FakeProvider::start();
    let sb = support::styled(&fake, "anthropic");
    // Rate limited, then overloaded, then an answer.
    fake.push(Reply::status(429).header("retry-after", "0"));
    fake.push(Reply::status(529).header("retry-after", "0"));
    fake.push(Reply::text(ANSWER));
    let run = sb.colony(&["ask", QUESTION]).ok();
    assert_eq!(run.stdout.trim(), ANSWER);
    assert_eq!(fake.calls(), 3);
    let retries: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.ends_with("; trying again in 0 s"))
        .collect();
    assert_eq!(retries.len(), 2, "{}", run.stderr);
    assert!(retries[0].contains("429"), "{}", run.stderr);

    // Three times rate limited: the third error is the answer.
    for _ in 0..3 {
        fake.push(Reply::status(429).header("retry-after", "0"));
    }
    let run = sb.colony(&["ask", QUESTION]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(fake.calls(), 6);
    assert_eq!(
        run.stderr.matches("trying again").count(),
        2,
        "{}",
        run.stderr
    );

    // A refused key is not tried again.
    fake.push(Reply::status(401));
    let run = sb.colony(&["ask", QUESTION]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(fake.calls(), 7);
    assert!(!run.stderr.contains("trying again"), "{}", run.stderr);
    assert!(run.stderr.contains("auth_error"), "{}", run.stderr);

    // A call that timed out is not tried again: each try waits the whole timeout (600 s by
    // default), so a stalled gateway held `colony ask` three times that before it said why.
    sb.write(
        "config.toml",
        "[use.helper]\nprovider = \"anthropic\"\nmodel = \"m\"\ntimeout = 1\n",
    );
    fake.push(Reply::text(ANSWER).delay(2500));
    let run = sb.colony(&["ask", QUESTION]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(fake.calls(), 8);
    assert!(!run.stderr.contains("trying again"), "{}", run.stderr);
    assert!(run.stderr.contains("timed out after 1 s"), "{}", run.stderr);
}

/// Ctrl-C while the answer is awaited ends `colony ask` with 130 and a word, its MCP servers
/// ended first (it was killed by the signal outright, and a stdio server's processes, in a
/// group of their own, ran on).
#[test]
fn ctrl_c_while_the_answer_is_awaited_ends_with_130() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("too late").delay(60_000));
    let sb = support::styled(&fake, "openai");
    let child = sb.spawn(&["ask", QUESTION]);
    support::serve::eventually("ask never called the model", || !fake.requests().is_empty());
    support::signal(child.id(), "INT");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("colony ask: interrupted (SIGINT)"),
        "{stderr}"
    );
}

/// An MCP server for [`ctrl_c_during_a_tool_call_sends_no_more_model_calls`]: one tool, `wait`,
/// whose call is never answered; the call's start is marked in the file its argument names.
/// At SIGTERM it closes its stdout (the call fails at once) and lingers until it is killed,
/// two seconds later: the time a turn had to send its next model call before the exit.
const NEVER_ANSWERS: &str = r#"
import json, os, signal, sys, time
mark = sys.argv[1]
def linger(*_):
    os.close(1)
    time.sleep(60)
signal.signal(signal.SIGTERM, linger)
for line in sys.stdin:
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "hang", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "wait", "description": "Waits",
                             "inputSchema": {"type": "object", "properties": {}}}]}
    elif method == "tools/call":
        open(mark, "w").close()
        continue
    elif mid is not None:
        result = {}
    else:
        continue
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}) + "\n")
    sys.stdout.flush()
"#;

/// Ctrl-C while a cached MCP tool's call is awaited ends `colony ask` without another model
/// call: ending the servers failed the call at once, and the turn sent its next (paid) model
/// call, and printed its answer, in the moment before the exit.
#[test]
fn ctrl_c_during_a_tool_call_sends_no_more_model_calls() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "hang__wait", serde_json::json!({})));
    fake.set_default(Reply::text("a late answer"));
    let sb = support::styled(&fake, "openai");
    let server = sb.write("hang.py", NEVER_ANSWERS);
    let mark = sb.path("called");
    sb.colony(&[
        "mcp",
        "add",
        "hang",
        "--",
        "python3",
        &server.display().to_string(),
        &mark.display().to_string(),
    ])
    .ok();
    sb.colony(&["tools", "refresh"]).ok();
    let child = sb.spawn(&["ask", QUESTION]);
    support::serve::eventually("the tool was never called", || mark.exists());
    support::signal(child.id(), "INT");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert_eq!(fake.calls(), 1, "{stderr}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("a late answer"),
        "{stderr}"
    );
}
