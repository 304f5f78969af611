//! `colony mcp ...` and `colony tools ...` through the binary, with `mcp-server-time` (PyPI) and
//! the Python test server as the configured servers; `mcp-server-time` driven from Lua with
//! `mcp.connect`; `mcp.cached_tools()` offering the cached tools, connecting on first call; and
//! `colony mcp test` against `colony mcp serve FILE.lua` configured as a stdio server.

mod support;

use serde_json::json;
use support::fake::{FakeProvider, Reply};
use support::mcp;
use support::model_calls;
use support::script::Sandbox;

fn time_server() -> String {
    mcp::time_server().display().to_string()
}

/// `colony mcp add time -- mcp-server-time --local-timezone UTC`.
fn add_time_server(sb: &Sandbox) {
    sb.colony(&[
        "mcp",
        "add",
        "time",
        "--",
        &time_server(),
        "--local-timezone",
        "UTC",
    ])
    .ok();
}

#[test]
fn add_list_test_del_and_import() {
    let sb = Sandbox::new();
    let time = time_server();
    let run = sb
        .colony(&[
            "mcp",
            "add",
            "time",
            "--env",
            "TZ=UTC",
            "--",
            &time,
            "--local-timezone",
            "UTC",
        ])
        .ok();
    assert_eq!(
        run.stdout.trim(),
        format!("time: {time} --local-timezone UTC")
    );
    sb.colony(&[
        "mcp",
        "add",
        "docs",
        "https://example.org/mcp",
        "--header",
        "Authorization: Bearer s3cret-token-value",
        "--resources",
        "--sampling",
        "helper",
    ])
    .ok();
    // Adding a name again replaces the server, and says what it was.
    sb.colony(&["mcp", "add", "spare", "http://127.0.0.1:9/old"])
        .ok();
    let again = sb
        .colony(&["mcp", "add", "spare", "http://127.0.0.1:9/new"])
        .ok();
    assert_eq!(
        again.stdout.trim(),
        "spare: http://127.0.0.1:9/new (replaces http://127.0.0.1:9/old)"
    );
    sb.colony(&["mcp", "del", "spare"]).ok();
    let list = sb.colony(&["mcp", "list"]).ok();
    assert_eq!(
        list.lines(),
        [
            "docs\thttp\thttps://example.org/mcp".to_string(),
            format!("time\tstdio\t{time} --local-timezone UTC")
        ]
    );
    let config = std::fs::read_to_string(sb.path("config.toml")).unwrap();
    assert!(config.contains("[mcp.time.env]\nTZ = \"UTC\""), "{config}");
    assert!(
        config.contains("resources = true\nsampling = \"helper\""),
        "{config}"
    );

    let test = sb.colony(&["mcp", "test", "time"]).ok();
    let lines = test.lines();
    assert!(
        lines[0].starts_with("time: MCP 2025-11-25 (mcp-time "),
        "{}",
        test.stdout
    );
    assert!(lines[0].ends_with(", 2 tools"), "{}", test.stdout);
    assert!(
        lines[1].starts_with("  get_current_time\t"),
        "{}",
        test.stdout
    );
    assert!(lines[2].starts_with("  convert_time\t"), "{}", test.stdout);

    // The same servers from Lua.
    let lua = sb
        .lua(
            r#"for _, s in ipairs(mcp.servers()) do print(s.name, s.url or s.command, s.args and #s.args or "-") end
               local conn = assert(mcp.connect_named("time"))
               print("tools", #assert(mcp.tools(conn)))
               mcp.close(conn)
               local none, err = mcp.connect_named("nope")
               print("nope", none, err.kind)
               print(pcall(mcp.connect, "time"))"#,
            &[],
        )
        .ok();
    // A configured name given to mcp.connect points at mcp.connect_named (it said "server
    // mcp: time is not a URL: relative URL without a base").
    let script = sb.path("script.lua").display().to_string();
    assert_eq!(
        lua.lines(),
        [
            "docs\thttps://example.org/mcp\t-".to_string(),
            format!("time\t{time}\t2"),
            "tools\t2".to_string(),
            "nope\tnil\tconfig".to_string(),
            format!(
                "false\t{script}:7: mcp.connect: \"time\" is a configured server's name, not a \
                 URL: mcp.connect_named(\"time\") connects to it"
            ),
        ]
    );

    sb.colony(&["mcp", "del", "docs"]).ok();
    let failed = sb.colony(&["mcp", "test", "docs"]).failed();
    assert!(
        failed.stderr.contains("no server named \"docs\""),
        "{}",
        failed.stderr
    );

    // A failing server: reported with what it said as it ended (it was "Broken pipe"),
    // exit status 1.
    sb.colony(&[
        "mcp",
        "add",
        "quits",
        "--",
        "sh",
        "-c",
        "echo 'fatal: missing API token' >&2; exit 1",
    ])
    .ok();
    let failed = sb.colony(&["mcp", "test", "quits"]).failed();
    assert!(
        failed.stderr.contains(
            "quits: cannot connect: it ended before it answered; its stderr: fatal: missing API token"
        ),
        "{}",
        failed.stderr
    );
    // One that closes its stdout first and then says why: it is given the moment to say it (it
    // was killed as its connection dropped, and the error said "saying nothing").
    sb.colony(&[
        "mcp",
        "add",
        "closes",
        "--",
        "sh",
        "-c",
        "read line; exec 1>&-; sleep 0.05; echo 'fatal: config missing' >&2; exit 1",
    ])
    .ok();
    let failed = sb.colony(&["mcp", "test", "closes"]).failed();
    assert!(
        failed.stderr.contains("its stderr: fatal: config missing"),
        "{}",
        failed.stderr
    );
    // A cwd that is not there is named, not the command.
    sb.colony(&[
        "mcp",
        "add",
        "lost",
        "--cwd",
        "/nonexistent-folder",
        "--",
        "sh",
    ])
    .ok();
    let failed = sb.colony(&["mcp", "test", "lost"]).failed();
    assert!(
        failed
            .stderr
            .contains("cannot start sh: its cwd /nonexistent-folder is not a folder"),
        "{}",
        failed.stderr
    );

    let file = sb.write(
        "claude_desktop_config.json",
        r#"{"mcpServers": {
             "fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
             "remote": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"X-Team": "a"}},
             "My files__v2": {"command": "npx", "args": ["files"]},
             "***": {"command": "npx", "args": ["stars"]}}}"#,
    );
    let import = sb
        .colony(&["mcp", "import", &file.display().to_string()])
        .ok();
    // A name its tools could not carry (as `mcp add` refuses it) is made one, or skipped.
    assert_eq!(
        import.lines(),
        [
            "skipped \"***\": no letter or digit to name it by",
            "imported \"My files__v2\" as My_files_v2 (its tools: My_files_v2__TOOL)",
            "imported fs",
            "imported remote"
        ]
    );
    let list = sb.colony(&["mcp", "list"]).ok();
    assert!(
        list.stdout
            .contains("fs\tstdio\tnpx -y @modelcontextprotocol/server-filesystem /tmp"),
        "{}",
        list.stdout
    );
    assert!(
        list.stdout.contains("remote\thttp\thttp://127.0.0.1:9/mcp"),
        "{}",
        list.stdout
    );
    // Names its tools could not carry apart, an empty command, a header with a line break.
    for (args, says) in [
        (
            &["", "http://127.0.0.1:9/mcp"][..],
            "\"\" is not a server name",
        ),
        (
            &["a b", "http://127.0.0.1:9/mcp"],
            "\"a b\" is not a server name",
        ),
        (
            &["x__y", "http://127.0.0.1:9/mcp"],
            "\"x__y\" is not a server name",
        ),
        (
            &["evil\nname", "http://127.0.0.1:9/mcp"],
            "is not a server name",
        ),
        // `a_` with a tool `echo` and `a` with `_echo` both offered `a___echo`.
        (
            &["a_", "http://127.0.0.1:9/mcp"],
            "\"a_\" is not a server name: it ends in '_'",
        ),
        (&["n2", "--", ""], "give a URL or -- COMMAND ARGS"),
        (
            &["h", "http://127.0.0.1:9/mcp", "--header", "A: b\r\nX: y"],
            "holds a control character",
        ),
    ] {
        let mut all = vec!["mcp", "add"];
        all.extend_from_slice(args);
        let run = sb.colony(&all);
        assert_eq!(run.code, 2, "{args:?}\n{}", run.stderr);
        assert!(run.stderr.contains(says), "{args:?}\n{}", run.stderr);
    }
    // A key in a URL's query is not printed (it was, whole, by add and list).
    let added = sb
        .colony(&[
            "mcp",
            "add",
            "keyed",
            "http://127.0.0.1:9/mcp?api_key=s3cret-q-key",
        ])
        .ok();
    let listed = sb.colony(&["mcp", "list"]).ok();
    for out in [&added.stdout, &listed.stdout] {
        assert!(out.contains("api_key=[redacted]"), "{out}");
        assert!(!out.contains("s3cret-q-key"), "{out}");
    }
    sb.colony(&["mcp", "del", "keyed"]).ok();
    // Imported again: a server of that name is said to be replaced, with what it was, and
    // `${VAR}` placeholders are said to be passed on as written.
    let again = sb.write(
        "mcp.json",
        r#"{"mcpServers": {"fs": {"command": "srv", "env": {"T": "${MY_TOKEN}"}}}}"#,
    );
    let import = sb
        .colony(&["mcp", "import", &again.display().to_string()])
        .ok();
    assert_eq!(
        import.lines(),
        [
            "imported fs (replaces npx -y @modelcontextprotocol/server-filesystem /tmp); it \
             holds ${MY_TOKEN}, which colony passes on as written, not filled in from the \
             environment: put the values in with `colony mcp add`"
        ]
    );
    let bad = sb.write("bad.json", r#"{"servers": {}}"#);
    let failed = sb
        .colony(&["mcp", "import", &bad.display().to_string()])
        .failed();
    assert!(
        failed.stderr.contains("no \"mcpServers\""),
        "{}",
        failed.stderr
    );
}

/// A config whose `[mcp.NAME]` table has a field it does not have is mended with `colony mcp
/// del`, which reads it without judging it; `colony mcp add` does not write it while the
/// problem stays (writing would drop the misspelt field), and says so.
#[test]
fn a_bad_mcp_table_is_named_and_can_be_deleted() {
    let sb = Sandbox::new();
    sb.write(
        "config.toml",
        "[mcp.x]\ncomand = \"srv\"\n[mcp.ok]\ncommand = \"srv\"\n",
    );
    let listed = sb.colony(&["mcp", "list"]).failed();
    assert!(
        listed.stderr.contains("[mcp.x] comand: unknown field"),
        "{}",
        listed.stderr
    );
    let added = sb.colony(&["mcp", "add", "y", "--", "srv2"]);
    assert_eq!(added.code, 2, "{}", added.stderr);
    assert!(
        added
            .stderr
            .contains("is not written, as it would still hold: [mcp.x] comand"),
        "{}",
        added.stderr
    );
    sb.colony(&["mcp", "del", "x"]).ok();
    let listed = sb.colony(&["mcp", "list"]).ok();
    assert_eq!(listed.lines(), ["ok\tstdio\tsrv"]);
}

#[test]
fn the_time_server_from_lua() {
    let sb = Sandbox::new();
    let script = format!(
        r#"local conn, err = mcp.connect{{ command = "{time}", args = {{ "--local-timezone", "UTC" }} }}
           assert(conn, err and err.message)
           print("name", conn.name)
           local tools = assert(mcp.tools(conn))
           for _, t in ipairs(tools) do print("tool", t.name) end
           local text, err = mcp.call(conn, "convert_time", {{ source_timezone = "UTC", time = "12:00", target_timezone = "Asia/Tokyo" }})
           assert(text, err and err.message)
           local r = json.decode(text)
           print("tokyo", r.target.timezone, r.target.datetime:match("T(%d%d:%d%d)"))
           local bad, err = mcp.call(conn, "get_current_time", {{ timezone = "Not/AZone" }})
           print("bad", bad, err.kind)
           mcp.close(conn)"#,
        time = time_server()
    );
    let run = sb.lua(&script, &[]).ok();
    assert_eq!(
        run.lines(),
        [
            "name\tmcp-server-time",
            // A connection the script did not name offers the tools under their own names.
            "tool\tget_current_time",
            "tool\tconvert_time",
            "tokyo\tAsia/Tokyo\t21:00",
            "bad\tnil\ttool_error"
        ]
    );
}

#[test]
fn the_tool_cache_is_refreshed_listed_offered_and_cleared() {
    let fake = FakeProvider::start();
    let sb = support::styled(&fake, "anthropic");
    sb.write("config.toml", "[use.general]\nprovider = \"anthropic\"\n");
    let lua_without = sb.lua("print(#mcp.cached_tools())", &[]).ok();
    assert_eq!(lua_without.stdout.trim(), "0", "no cache: no tools");
    let list = sb.colony(&["tools", "list"]).ok();
    assert_eq!(list.stdout.trim(), "no tool cache (colony tools refresh)");

    add_time_server(&sb);
    sb.colony(&[
        "mcp",
        "add",
        "down",
        "http://127.0.0.1:9/mcp",
        "--header",
        "Authorization: Bearer s3cret-token",
    ])
    .ok();
    let refresh = sb.colony(&["tools", "refresh"]).ok();
    let lines = refresh.lines();
    assert!(
        lines[0].starts_with("down: error: down: cannot connect"),
        "{}",
        refresh.stdout
    );
    // Why, not only that a request could not be sent (rmcp's error drops reqwest's causes).
    assert!(
        lines[0].contains("tcp connect error: Connection refused"),
        "{}",
        refresh.stdout
    );
    assert_eq!(lines[1], "time: 2 tools");
    let list = sb.colony(&["tools", "list"]).ok();
    assert!(
        list.lines()[0].starts_with("down: error:"),
        "{}",
        list.stdout
    );
    assert!(
        list.lines()[1].starts_with("time__get_current_time\t"),
        "{}",
        list.stdout
    );
    assert!(
        list.lines()[2].starts_with("time__convert_time\t"),
        "{}",
        list.stdout
    );

    // The cached tools go straight into a turn; the server starts on the first call.
    fake.push(Reply::tool_call(
        "c1",
        "time__convert_time",
        json!({"source_timezone": "UTC", "time": "08:30", "target_timezone": "UTC"}),
    ));
    fake.push(Reply::text("08:30 it is."));
    let run = sb
        .lua(
            r#"local tools = mcp.cached_tools()
               local r = ai.take_turn{ prompt = "time?", tools = tools }
               print(#tools, r.reply, r.tool_events[1].kind)"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout.trim(), "2\t08:30 it is.\tok");
    let first = &model_calls(&fake)[0];
    let offered: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["time__get_current_time", "time__convert_time"]);
    let second = model_calls(&fake)[1].to_string();
    assert!(second.contains("08:30:00"), "{second}");

    // `colony ask` offers the cached tools by itself.
    fake.push(Reply::tool_call(
        "c2",
        "time__get_current_time",
        json!({"timezone": "UTC"}),
    ));
    fake.push(Reply::text("It is morning in UTC."));
    let ask = sb.colony(&["ask", "what time is it in UTC?"]).ok();
    assert_eq!(ask.stdout.trim(), "It is morning in UTC.", "{}", ask.stderr);
    assert!(
        ask.stderr.contains("[tool] time__get_current_time ok"),
        "{}",
        ask.stderr
    );
    let calls = model_calls(&fake);
    let asked = &calls[2];
    let offered: Vec<&str> = asked["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["time__get_current_time", "time__convert_time"]);
    assert!(
        calls[3].to_string().contains("\"timezone\""),
        "the call's result went back"
    );
    // ...unless its use-type's model takes no tools (`tools = "none"`): then none are sent.
    sb.colony(&["config", "set", "helper", "tools", "none"])
        .ok();
    fake.push(Reply::text("No tools needed."));
    let ask = sb.colony(&["ask", "what time is it in UTC?"]).ok();
    assert_eq!(ask.stdout.trim(), "No tools needed.", "{}", ask.stderr);
    let calls = model_calls(&fake);
    assert_eq!(calls.len(), 5);
    assert!(calls[4].get("tools").is_none(), "{}", calls[4]);
    sb.colony(&["config", "unset", "helper"]).ok();

    // The cache holds no part of a server's config (a header may be a token), and only its
    // owner may read it.
    let cache = sb.path("tools-cache.json");
    let text = std::fs::read_to_string(&cache).unwrap();
    assert!(!text.contains("s3cret-token"), "{text}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&cache).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    // A server deleted since the refresh offers nothing (`remove` is `del`, as people guess).
    sb.colony(&["mcp", "remove", "time"]).ok();
    assert_eq!(
        sb.lua("print(#mcp.cached_tools())", &[]).ok().stdout.trim(),
        "0"
    );
    let list = sb.colony(&["tools", "list"]).ok();
    assert!(
        list.stdout
            .contains("time: deleted or changed since the cache was made (colony tools refresh)"),
        "{}",
        list.stdout
    );

    assert_eq!(
        sb.colony(&["tools", "clear"]).ok().stdout.trim(),
        "tool cache cleared"
    );
    assert_eq!(
        sb.lua("print(#mcp.cached_tools())", &[]).ok().stdout.trim(),
        "0"
    );
}

#[test]
fn a_local_server_does_not_inherit_the_providers_keys() {
    let fake = FakeProvider::start();
    let sb = support::styled(&fake, "openai");
    let seen = sb.path("env.txt");
    let script = format!(
        r#"local conn, err = mcp.connect{{ command = "sh", args = {{ "-c", "env > {}" }}, env = {{ MINE = "kept" }} }}
           print(conn == nil)"#,
        seen.display()
    );
    let run = sb.lua(&script, &[]).ok();
    assert_eq!(
        run.stdout.trim(),
        "true",
        "the command speaks no MCP: {}",
        run.stderr
    );
    let env = std::fs::read_to_string(&seen).unwrap();
    assert!(env.contains("MINE=kept"), "{env}");
    assert!(env.lines().any(|l| l.starts_with("PATH=")), "{env}");
    assert!(!env.contains("OPENAI_API_KEY"), "{env}");
    assert!(!env.contains("test-key-openai"), "{env}");
}

#[test]
fn servers_a_program_keeps_open_are_shut_down_in_order_when_it_ends() {
    let fake = FakeProvider::start();
    let sb = support::styled(&fake, "openai");
    let log = sb.path("eof.txt");
    let raw = mcp::server_script().with_file_name("raw_server.py");
    // The script never calls mcp.close: the end of the program closes the server's stdin (the
    // hand-written server notes that it saw it) instead of killing it.
    let script = format!(
        r#"local conn = assert(mcp.connect{{ command = "python3", args = {{ "{}" }},
             env = {{ ANSWER_VERSION = "2025-11-25", EOF_LOG = "{}" }} }})
           print(#mcp.tools(conn))"#,
        raw.display(),
        log.display()
    );
    let run = sb.lua(&script, &[]).ok();
    assert_eq!(run.stdout.trim(), "1", "{}", run.stderr);
    let seen = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(seen, "stdin closed\n", "the server was killed, not closed");
}

/// colony's own client against colony's own server: `colony mcp install` prints the entry that
/// runs `colony mcp serve FILE.lua`, `colony mcp import` configures it, and `colony mcp test`
/// connects over stdio and lists the program's exportable tools (and only those); a turn then
/// calls one through the configured name, against the fake provider.
#[test]
fn mcp_test_lists_what_colony_mcp_serve_exports() {
    let sb = Sandbox::new();
    let program = sb.write(
        "desk.lua",
        r#"ai.tool{ name = "greet", description = "Says hello to someone",
             parameters = { type = "object", properties = { who = { type = "string" } }, required = { "who" } },
             exportable = true,
             handler = function(args) return "Hello, " .. args.who .. "!" end }
           ai.tool{ name = "secret", description = "Not exported",
             parameters = { type = "object" }, handler = function() return "no" end }"#,
    );
    let entry = sb.path("entry.json");
    sb.colony(&[
        "mcp",
        "install",
        &program.display().to_string(),
        "--name",
        "desk",
        "--write",
        &entry.display().to_string(),
    ])
    .ok();
    let imported = sb
        .colony(&["mcp", "import", &entry.display().to_string()])
        .ok();
    assert_eq!(imported.stdout, "imported desk\n");
    let test = sb.colony(&["mcp", "test", "desk"]).ok();
    let lines = test.lines();
    assert!(
        lines[0].starts_with("desk: MCP 2025-11-25 (colony ") && lines[0].ends_with(", 1 tools"),
        "{}\n{}",
        test.stdout,
        test.stderr
    );
    assert_eq!(lines[1..], ["  greet\tSays hello to someone"]);

    let fake = FakeProvider::start();
    fake.push(Reply::tool_call(
        "t1",
        "desk__greet",
        json!({ "who": "Ada" }),
    ));
    fake.push(Reply::text("Greeted."));
    let config = std::fs::read_to_string(sb.path("config.toml")).unwrap();
    let sb = support::styled(&fake, "anthropic");
    sb.write(
        "config.toml",
        &format!("{config}\n[use.general]\nprovider = \"anthropic\"\n"),
    );
    let run = sb
        .lua(
            r#"local r = ai.take_turn{ prompt = "greet Ada", mcp = { "desk" } }
               print(r.reply, r.tool_events[1].outcome)"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "Greeted.\tHello, Ada!\n", "{}", run.stderr);
}

// A stdio server's processes end with colony, however colony ends. The server is started by a
// `sh` wrapper, as `npx` and `uvx` start theirs, which writes its own pid and starts a
// process of its own (`sleep`) that outlives the Python server, as a browser a server drives can.

use support::running;

/// The pids the wrapper wrote to `file`, once it has written `n` of them.
fn pids(file: &std::path::Path, n: usize) -> Vec<u32> {
    for _ in 0..500 {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.len() >= n {
            return pids;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!(
        "the server's wrapper did not write {n} pids to {}",
        file.display()
    );
}

/// The `sh -c` text `wrapper` with `PIDS` (the pid file it writes, returned too) and `PY` (the
/// Python server's command) filled in.
fn wrapper_command(sb: &Sandbox, wrapper: &str) -> (String, std::path::PathBuf) {
    let pids = sb.path("pids");
    let server = format!(
        "{} {} stdio",
        mcp::python().display(),
        mcp::server_script().display()
    );
    let command = wrapper
        .replace("PIDS", &pids.display().to_string())
        .replace("PY", &server);
    (command, pids)
}

/// A script that connects to the Python server through `wrapper` ([`wrapper_command`]) and
/// then runs `then`.
fn wrapped_server_script(sb: &Sandbox, wrapper: &str, then: &str) -> (String, std::path::PathBuf) {
    let (wrapper, pids) = wrapper_command(sb, wrapper);
    let source = format!(
        r#"io.stdout:setvbuf("line")
local conn = assert(mcp.connect{{ command = "sh", args = {{ "-c", {wrapper:?} }} }})
print(mcp.call(conn, "echo", {{ text = "connected" }}))
{then}
"#
    );
    (sb.write("script.lua", &source).display().to_string(), pids)
}

/// `colony run FILE`, once it has printed the line `wanted` (it must not end before). Its
/// stdout stays open: colony ends a program whose stdout is closed.
fn run_until(sb: &Sandbox, file: &str, wanted: &str) -> std::process::Child {
    use std::io::BufRead;
    let mut child = sb.spawn(&["run", file]);
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != wanted {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "colony ended early");
    }
    child.stdout = Some(out.into_inner());
    child
}

/// The wrapper's second process, started in the background, outlives the server.
const LEAVES_A_PROCESS: &str = "sleep 600 & echo $! > PIDS; exec PY";

#[test]
fn a_stdio_servers_processes_end_when_the_program_does() {
    let sb = Sandbox::new();
    let (file, pid_file) = wrapped_server_script(&sb, LEAVES_A_PROCESS, "");
    let run = sb.colony(&["run", &file]).ok();
    assert_eq!(run.lines(), ["connected"]);
    let left = pids(&pid_file, 1)[0];
    assert!(
        !running(left),
        "the server's second process ({left}) outlived colony"
    );
}

/// A script that leaves through `os.exit` (as `colony chat` does after a Ctrl-C) ends its
/// servers' processes too: Lua's own exit(3) left the server's group running.
#[test]
fn a_stdio_servers_processes_end_when_the_script_calls_os_exit() {
    let sb = Sandbox::new();
    let (file, pid_file) = wrapped_server_script(&sb, LEAVES_A_PROCESS, "os.exit(3)");
    let run = sb.colony(&["run", &file]);
    assert_eq!(run.code, 3, "{run:?}");
    assert_eq!(run.lines(), ["connected"]);
    let left = pids(&pid_file, 1)[0];
    assert!(
        !running(left),
        "the server's second process ({left}) outlived colony"
    );
}

#[test]
fn a_stdio_servers_processes_end_when_max_time_ends_the_run() {
    let sb = Sandbox::new();
    let (file, pid_file) = wrapped_server_script(
        &sb,
        LEAVES_A_PROCESS,
        r#"mcp.call(conn, "sleep", { seconds = 600 })"#,
    );
    let run = sb.colony(&["run", "--max-time", "2", &file]);
    assert_eq!(run.code, 124, "{run:?}");
    let left = pids(&pid_file, 1)[0];
    assert!(
        !running(left),
        "the server's second process ({left}) outlived colony"
    );
}

#[test]
fn a_stdio_server_that_ignores_a_closed_stdin_ends_when_a_signal_kills_colony() {
    let sb = Sandbox::new();
    // The wrapper itself is the server's first process: it writes its pid and, when the Python
    // server has gone (its stdin closed), would go on for ten minutes. SIGINT arrives before the
    // program's watch, so it ends colony at once, with nothing of colony's own run.
    let (file, pid_file) = wrapped_server_script(
        &sb,
        "echo $$ > PIDS; PY; sleep 600",
        r#"print("waiting"); mcp.call(conn, "sleep", { seconds = 600 })"#,
    );
    let mut child = run_until(&sb, &file, "waiting");
    let wrapper = pids(&pid_file, 1)[0];
    assert!(running(wrapper));
    // SAFETY: kill takes plain integers.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    child.wait().unwrap();
    ends_soon(wrapper, "the server's first process");
}

/// A resident's server (connected by `ai.spawn`) ends with colony even when colony is killed:
/// SIGKILL runs nothing of colony's, so a server that ignores its closed stdin is ended by the
/// kernel only (`PR_SET_PDEATHSIG`, see `mcp/server_group.rs`).
#[test]
fn a_residents_stdio_server_that_ignores_a_closed_stdin_ends_when_colony_is_killed() {
    let sb = Sandbox::new();
    let (wrapper, pid_file) = wrapper_command(&sb, "echo $$ > PIDS; PY; sleep 600");
    let file = sb.write(
        "resident.lua",
        &format!(
            r#"io.stdout:setvbuf("line")
local name, servers = ai.spawn{{ name = "clerk", mcp = {{ {{ name = "py", command = "sh", args = {{ "-c", {wrapper:?} }} }} }} }}
print(servers[1].phase)
ai.watch()
"#
        ),
    );
    let mut child = run_until(&sb, &file.display().to_string(), "ready");
    let wrapper = pids(&pid_file, 1)[0];
    assert!(running(wrapper));
    child.kill().unwrap();
    child.wait().unwrap();
    ends_soon(wrapper, "the resident's server");
}

/// Waits for process `pid` (`what`) to end after colony has: the signal that ends it is
/// asynchronous, so it is given a moment (10 s), with no deadline on colony itself.
fn ends_soon(pid: u32, what: &str) {
    for _ in 0..500 {
        if !running(pid) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("{what} ({pid}) outlived colony by 10 s");
}

#[test]
fn ctrl_c_ends_colony_mcp_test_and_the_server_it_started() {
    let sb = Sandbox::new();
    let pid_file = sb.path("pids");
    // A server that never answers `initialize`, in two processes.
    let wrapper = format!(
        "sleep 600 & echo $! > {0}; echo $$ >> {0}; wait",
        pid_file.display()
    );
    sb.write(
        "config.toml",
        &format!("[mcp.mute]\ncommand = \"sh\"\nargs = [\"-c\", {wrapper:?}]\n"),
    );
    let mut child = sb.spawn(&["mcp", "test", "mute"]);
    let started = pids(&pid_file, 2);
    // SAFETY: kill takes plain integers.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted (SIGINT)"), "{stderr}");
    for pid in started {
        assert!(!running(pid), "the server's process {pid} outlived colony");
    }
}

#[test]
fn a_refresh_that_cannot_list_a_server_keeps_what_was_listed_before() {
    let sb = Sandbox::new();
    // Two servers started through scripts that can be broken without touching the config (its
    // fingerprint in the cache stays the same).
    let working = format!("exec {} --local-timezone UTC\n", time_server());
    let time = sb.write("time.sh", &working);
    let clock = sb.write("clock.sh", &working);
    sb.write(
        "config.toml",
        &format!(
            "[mcp.clock]\ncommand = \"sh\"\nargs = [{:?}]\n\n[mcp.time]\ncommand = \"sh\"\nargs = [{:?}]\n",
            clock.display().to_string(),
            time.display().to_string()
        ),
    );
    let refresh = sb.colony(&["tools", "refresh"]).ok();
    assert_eq!(refresh.lines()[..2], ["clock: 2 tools", "time: 2 tools"]);

    // One server down: its tools stay offered, with the error said.
    sb.write("clock.sh", "echo 'clock is down' >&2; exit 3\n");
    let refresh = sb.colony(&["tools", "refresh"]).ok();
    let lines = refresh.lines();
    assert!(
        lines[0].starts_with("clock: error: clock: cannot connect")
            && lines[0].ends_with("(its 2 tools listed before are kept)"),
        "{}",
        refresh.stdout
    );
    assert_eq!(lines[1], "time: 2 tools");
    let list = sb.colony(&["tools", "list"]).ok();
    let lines = list.lines();
    assert!(
        lines[0].starts_with("clock: error at the last refresh: clock: cannot connect")
            && lines[0].ends_with("(offering the tools listed before)"),
        "{}",
        list.stdout
    );
    let tools: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(
        tools,
        [
            "clock__get_current_time",
            "clock__convert_time",
            "time__get_current_time",
            "time__convert_time"
        ]
    );

    // Every server down: nothing is written over the cache.
    let cache = sb.path("tools-cache.json");
    let before = std::fs::read(&cache).unwrap();
    sb.write("time.sh", "exit 3\n");
    let refresh = sb.colony(&["tools", "refresh"]);
    assert_eq!(refresh.code, 1, "{refresh:?}");
    assert!(
        refresh
            .stderr
            .contains("no server could be listed; the cache is unchanged"),
        "{}",
        refresh.stderr
    );
    assert!(!refresh.stdout.contains("cached in"), "{}", refresh.stdout);
    assert_eq!(std::fs::read(&cache).unwrap(), before);
}

/// `colony tools refresh | head -1`: the command ends at its first line (a closed stdout ends a
/// command quietly), and the cache is saved all the same. It used to be saved after the lines
/// were printed, so it never was.
#[test]
fn a_refresh_whose_stdout_is_closed_still_saves_the_cache() {
    let sb = Sandbox::new();
    add_time_server(&sb);
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = sb
        .command(&["tools", "refresh"])
        .stdin(std::process::Stdio::null())
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("colony runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = sb.colony(&["tools", "list"]).ok();
    assert!(
        list.stdout.contains("time__get_current_time"),
        "the cache was saved: {}",
        list.stdout
    );
}

/// A script names its servers by the rule `colony mcp add` keeps: `a__b` and `a_` would name
/// their tools like another server's.
#[test]
fn a_script_cannot_name_a_server_whose_tools_run_into_anothers() {
    let sb = Sandbox::new();
    let run = sb
        .lua(
            r#"
print(pcall(mcp.connect, { name = "a__b", command = "true" }))
print(pcall(mcp.connect, { name = "a_", command = "true" }))
"#,
            &[],
        )
        .ok();
    let lines = run.lines();
    assert!(
        lines[0].contains("mcp.connect: server name \"a__b\": it holds \"__\""),
        "{}",
        run.stdout
    );
    assert!(
        lines[1].contains("mcp.connect: server name \"a_\": it ends in '_'"),
        "{}",
        run.stdout
    );
}

/// A stdio server's message past the 16 MiB limit ends the connection, and the call waiting
/// for it ends at once, saying why: the MCP SDK dropped the message, said so only in its own
/// log, and the call waited for its timeout (two minutes by default) to say "no answer". The
/// server is started again on next use.
#[test]
fn a_message_past_the_line_limit_ends_its_call_at_once() {
    let sb = Sandbox::new();
    let server = mcp::scripted_server(
        &sb,
        r#"[{"name": "huge", "inputSchema": {"type": "object"}}]"#,
        r#"{"content": [{"type": "text", "text": "x" * 17000000}]}"#,
    );
    let run = sb
        .lua(
            &format!(
                r#"local c = assert(mcp.connect{{ command = "python3", args = {{ {:?} }} }})
local r, err = mcp.call{{ conn = c, name = "huge", timeout = 600 }}
print(r, err and err.kind, err and err.message)
print(#assert(mcp.tools(c)))"#,
                server.display().to_string()
            ),
            &["--max-time", "300"],
        )
        .ok();
    let lines = run.lines();
    assert!(
        lines[0].contains(
            "closed\tpython3: the connection closed: the server sent a message of more than 16 \
             MiB, more than colony reads"
        ),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("timeout"), "{}", run.stdout);
    assert_eq!(lines[1], "1", "started again on next use: {}", run.stdout);
    assert!(
        run.stderr.contains("sent a message of more than 16 MiB"),
        "{}",
        run.stderr
    );
}

/// A stdio server that stops in the middle of a message (here its answer to the first call)
/// is started again once that call has timed out: its next message was read as the rest of the
/// half one, a line that is not JSON, dropped, and every later call waited for its timeout.
#[test]
fn a_server_stopped_mid_message_is_started_again_after_the_timeout() {
    let sb = Sandbox::new();
    let server = mcp::scripted_server(
        &sb,
        r#"[{"name": "half", "inputSchema": {"type": "object"}},
           {"name": "whole", "inputSchema": {"type": "object"}}]"#,
        r#"{"content": [{"type": "text", "text": "called " + m["params"]["name"]}]}
        if m.get("method") == "tools/call" and m["params"]["name"] == "half":
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r})[:20])
            sys.stdout.flush()
            continue"#,
    );
    let run = sb
        .lua(
            &format!(
                r#"local c = assert(mcp.connect{{ command = "python3", args = {{ {:?} }} }})
local r, err = mcp.call{{ conn = c, name = "half", timeout = 2 }}
print(r, err and err.kind)
r, err = mcp.call{{ conn = c, name = "whole", timeout = 20 }}
print(r and r.text, err and err.kind, err and err.message)"#,
                server.display().to_string()
            ),
            &["--max-time", "120"],
        )
        .ok();
    assert_eq!(
        run.lines(),
        ["nil\ttimeout", "called whole\tnil\tnil"],
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("a request timed out with the server's message half read"),
        "{}",
        run.stderr
    );
}

/// One tool in `tools/list` without its `inputSchema` took the server's other tools with it
/// ("tools/list got an answer of another kind"): each is read on its own now, that one offered
/// as taking an object (said), one whose schema is not an object left out (said).
#[test]
fn a_tool_listed_without_its_schema_does_not_take_the_others_with_it() {
    let sb = Sandbox::new();
    let server = mcp::scripted_server(
        &sb,
        r#"[
    {"name": "good", "inputSchema": {"type": "object"}},
    {"name": "noschema"},
    {"name": "badschema", "inputSchema": "object"},
]"#,
        mcp::CALLED,
    );
    let run = sb
        .lua(
            &format!(
                r#"local c = assert(mcp.connect{{ name = "l", command = "python3", args = {{ {:?} }} }})
local names = {{}}
for _, t in ipairs(assert(mcp.tools(c))) do names[#names + 1] = t.name end
table.sort(names)
print(table.concat(names, " "))
print(mcp.call{{ conn = c, name = "noschema" }}.text)"#,
                server.display().to_string()
            ),
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        ["l__good l__noschema", "called noschema"],
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("the tool has no inputSchema"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("the tool is left out: its inputSchema is not an object"),
        "{}",
        run.stderr
    );
}

/// A stdio server that exits while a process it started still holds its stdout (a wrapper's
/// helper, a browser it launched): the call waiting on it ends at once, and the next call is
/// served by the server started again. colony saw only the stdout, which stayed open: the call
/// waited for its timeout, and every call after it too.
#[test]
fn a_server_that_exits_with_a_child_holding_its_stdout_is_noticed() {
    let sb = Sandbox::new();
    let server = mcp::scripted_server(
        &sb,
        r#"[{"name": "pid", "inputSchema": {"type": "object"}},
            {"name": "die", "inputSchema": {"type": "object"}}]"#,
        r#"(__import__("subprocess").Popen(["sleep", "600"]), print("FATAL: the database is locked", file=sys.stderr, flush=True), __import__("os")._exit(1)) if m["params"]["name"] == "die" else {"content": [{"type": "text", "text": str(__import__("os").getpid())}]}"#,
    );
    let run = sb
        .lua(
            &format!(
                r#"local c = assert(mcp.connect{{ command = "python3", args = {{ {:?} }} }})
local before = mcp.call{{ conn = c, name = "pid" }}
local r, err = mcp.call{{ conn = c, name = "die", timeout = 100 }}
print(r, err and err.kind)
print(err and err.message)
local after = assert(mcp.call{{ conn = c, name = "pid" }})
print(before ~= after)"#,
                server.display().to_string()
            ),
            &["--max-time", "200"],
        )
        .ok();
    let lines = run.lines();
    assert_eq!(lines[0], "nil\tclosed", "{}", run.stderr);
    assert_eq!(lines[2], "true", "{}", run.stderr);
    // Which call it failed, and what the server said last: it was "the connection closed:
    // Transport closed", its stderr in the log alone.
    assert!(
        lines[1].contains("while calling die")
            && lines[1].contains("FATAL: the database is locked"),
        "{}",
        lines[1]
    );
}

/// Calls that a server's death fails together reset the connection once, and say so once: each
/// reset the connection (and logged its death), so one that failed late could close the session
/// a newer call had just opened.
#[test]
fn calls_a_server_death_fails_together_reset_it_once() {
    let sb = Sandbox::new();
    let server = mcp::scripted_server(
        &sb,
        r#"[{"name": "pid", "inputSchema": {"type": "object"}},
            {"name": "die", "inputSchema": {"type": "object"}}]"#,
        r#"(__import__("time").sleep(0.3), __import__("os")._exit(1)) if m["params"]["name"] == "die" else {"content": [{"type": "text", "text": str(__import__("os").getpid())}]}"#,
    );
    let run = sb
        .lua(
            &format!(
                r#"local c = assert(mcp.connect{{ command = "python3", args = {{ {:?} }} }})
local before = assert(mcp.call{{ conn = c, name = "pid" }})
local function die() return {{ mcp.call{{ conn = c, name = "die", timeout = 100 }} }} end
local results = {{ ai.parallel(die, die, die, die, die) }}
local failed = 0
for _, r in ipairs(results) do if r[1] == nil then failed = failed + 1 end end
print(failed)
print(assert(mcp.call{{ conn = c, name = "pid" }}) ~= before)"#,
                server.display().to_string()
            ),
            &["--max-time", "200"],
        )
        .ok();
    assert_eq!(run.lines(), ["5", "true"], "{}", run.stderr);
    let said = run
        .stderr
        .lines()
        .filter(|l| l.contains("the connection closed:"))
        .count();
    assert_eq!(said, 1, "{}", run.stderr);
}
