//! MCP servers in turns, from Lua through the binary, against the fake provider: `mcp = {...}` on
//! `ai.take_turn` and `ai.run` (servers opened at once, tools namespaced, a step's calls run in
//! parallel, structured / `isError` results, failed servers reported while the run goes on), and
//! the `mcp` module (`mcp.connect`, `mcp.tools`, `mcp.call`).

mod support;

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::{mcp, model_calls};

fn sandbox(fake: &FakeProvider) -> Sandbox {
    let sb = support::styled(fake, "anthropic");
    sb.write("config.toml", "[use.general]\nprovider = \"anthropic\"\n");
    sb
}

/// The Lua table for the Python test server over stdio.
fn py_stdio(name: &str) -> String {
    format!(
        r#"{{ name = "{name}", command = "{}", args = {{ "{}", "stdio" }} }}"#,
        mcp::python().display(),
        mcp::server_script().display()
    )
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_turn_with_servers_over_both_transports_and_two_that_fail() {
    let web = mcp::python_http(mcp::free_port(), &[]);
    let fake = FakeProvider::start();
    fake.push(Reply::tool_calls(vec![
        ("c1", "py__add", json!({"a": 1, "b": 2})),
        ("c2", "web__echo", json!({"text": "hello"})),
        ("c3", "py__fail", json!({"message": "no luck"})),
        ("c4", "py__meet", json!({"n": 2})),
        ("c5", "web__meet", json!({"n": 1})),
        ("c6", "py__meet", json!({"n": 2})),
    ]));
    fake.push(Reply::text("All done."));
    let dead_port = mcp::free_port();
    let script = format!(
        r#"local r = ai.take_turn{{ prompt = "go", mcp = {{
              {py},
              {{ name = "web", url = "{url}", headers = {{ Authorization = "Bearer t" }} }},
              {{ name = "down", url = "http://127.0.0.1:{dead_port}/mcp" }},
              {{ name = "quits", command = "sh", args = {{ "-c", "exit 1" }} }},
              "not-configured",
           }} }}
           print("reply", r.reply)
           for _, s in ipairs(r.servers) do
             print("server", s.name, s.phase, s.version or "-", #s.tools, s.error and s.error.kind or "-")
           end
           for _, e in ipairs(r.tool_events) do print("event", e.name, e.kind, e.outcome) end"#,
        py = py_stdio("py"),
        url = web.url(),
    );
    let run = sandbox(&fake).lua(&script, &[]).ok();
    let lines = run.lines();
    assert_eq!(lines[0], "reply\tAll done.", "{}", run.stdout);
    assert_eq!(lines[1], "server\tpy\tready\t2025-11-25\t7\t-");
    assert_eq!(lines[2], "server\tweb\tready\t2025-11-25\t7\t-");
    assert_eq!(lines[3], "server\tdown\terror\t-\t0\tconnect_error");
    assert_eq!(lines[4], "server\tquits\terror\t-\t0\tconnect_error");
    assert_eq!(lines[5], "server\tnot-configured\terror\t-\t0\tconfig");
    let events: Vec<Vec<&str>> = lines[6..]
        .iter()
        .map(|l| l.splitn(4, '\t').collect())
        .collect();
    assert_eq!(events[0][1..], ["py__add", "ok", r#"{"sum":3.0}"#]);
    assert_eq!(events[1][1..], ["web__echo", "ok", r#"{"result":"hello"}"#]);
    assert_eq!(events[2][1..3], ["py__fail", "error"]);
    assert!(events[2][3].contains("no luck"), "{:?}", events[2]);
    // Both py__meet calls were running at once: each waited for the other.
    assert_eq!(events[3][3], r#"{"result":"met"}"#);
    assert_eq!(events[5][3], r#"{"result":"met"}"#);

    let calls = model_calls(&fake);
    let offered = tool_names(&calls[0]);
    assert!(offered.contains(&"py__add".to_string()), "{offered:?}");
    assert!(offered.contains(&"web__echo".to_string()), "{offered:?}");
    assert!(
        !offered
            .iter()
            .any(|n| n.starts_with("down__") || n.starts_with("quits__"))
    );
    assert_eq!(offered.len(), 14);
    let second = calls[1].to_string();
    assert!(second.contains("no luck"), "{second}");
}

#[test]
fn ai_run_takes_configured_servers_by_name() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "py__echo", json!({"text": "named"})));
    fake.push(Reply::text("ok"));
    let sb = sandbox(&fake);
    sb.write(
        "config.toml",
        &format!(
            "[use.general]\nprovider = \"anthropic\"\n\n[mcp.py]\ncommand = \"{}\"\nargs = [\"{}\", \"stdio\"]\n",
            mcp::python().display(),
            mcp::server_script().display()
        ),
    );
    let run = sb
        .lua(
            r#"local r = ai.run{ prompt = "go", mcp = { "py" } }
               print(r.text, r.servers[1].name, r.servers[1].phase)
               for _, e in ipairs(r.tools) do print(e.name, e.kind, e.outcome) end"#,
            &[],
        )
        .ok();
    assert_eq!(run.lines()[0], "ok\tpy\tready");
    assert_eq!(run.lines()[1], "py__echo\tok\t{\"result\":\"named\"}");
}

#[test]
fn the_mcp_module_connects_lists_and_calls() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "py__add", json!({"a": 20, "b": 22})));
    fake.push(Reply::text("42"));
    let script = format!(
        r#"local conn = assert(mcp.connect({py}))
           print("name", conn.name)
           local tools = assert(mcp.tools(conn))
           local names = {{}}
           for _, t in ipairs(tools) do names[#names + 1] = t.name end
           table.sort(names)
           print("tools", table.concat(names, ","))
           print("call", mcp.call(conn, "echo", {{ text = "hi" }}))
           local r = mcp.call{{ conn = conn, name = "add", args = {{ a = 1, b = 2 }} }}
           print("table", r.text, r.structured.sum, r.is_error)
           local none, err = mcp.call(conn, "fail", {{ message = "nope" }})
           print("fail", none, err.kind, err.message:find("nope") ~= nil)
           local turn = ai.take_turn{{ prompt = "add", tools = tools }}
           print("turn", turn.reply, turn.tool_events[1].outcome)
           mcp.close(conn)
           local bad, err2 = mcp.connect("http://127.0.0.1:{port}/mcp")
           print("bad", bad, err2.kind)
           print("misuse", pcall(mcp.call, "not a conn", "x", {{}}))"#,
        py = py_stdio("py"),
        port = mcp::free_port(),
    );
    let sb = sandbox(&fake);
    let at = sb.path("script.lua").display().to_string();
    let run = sb.lua(&script, &[]).ok();
    let lines = run.lines();
    assert_eq!(lines[0], "name\tpy");
    assert_eq!(
        lines[1],
        "tools\tpy__add,py__die,py__echo,py__fail,py__meet,py__roots,py__sleep"
    );
    assert_eq!(lines[2], "call\thi");
    assert_eq!(lines[3], "table\t{\"sum\":3.0}\t3.0\tfalse");
    assert_eq!(lines[4], "fail\tnil\ttool_error\ttrue");
    assert_eq!(lines[5], "turn\t42\t{\"sum\":42.0}");
    assert_eq!(lines[6], "bad\tnil\tconnect_error");
    assert!(
        lines[7].starts_with(&format!(
            "misuse\tfalse\t{at}:18: mcp.call: conn must be a connection"
        )),
        "{}",
        lines[7]
    );
}

#[test]
fn a_resident_spawned_with_servers_calls_their_tools() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "py__add", json!({"a": 4, "b": 5})));
    fake.push(Reply::text("nine"));
    let script = format!(
        r#"local own = ai.tool{{ name = "py__echo", parameters = {{}}, handler = function() return "mine" end }}
           local name, servers = ai.spawn{{ name = "clerk", tools = {{ own }}, mcp = {{ {py}, {{ name = "gone", command = "sh", args = {{ "-c", "exit 1" }} }} }},
             deliver_to = function(reply) print("clerk: " .. reply) ; ai.stop("done") end,
             sources = {{ function(self) assert(ai.mail{{ to = self, source = "desk", content = "add 4 and 5", hop = 0 }}) end }} }}
           for _, s in ipairs(servers) do print("server", s.name, s.phase, #s.tools, table.concat(s.dropped or {{}}, ",")) end
           print("watch ended:", ai.watch{{}})"#,
        py = py_stdio("py"),
    );
    let run = sandbox(&fake).lua(&script, &[]).ok();
    assert_eq!(
        run.lines(),
        [
            // The server's echo would clash with the resident's own tool: left out.
            "server\tpy\tready\t6\techo",
            "server\tgone\terror\t0\t",
            "clerk: nine",
            "watch ended:\tdone"
        ]
    );
    let second = model_calls(&fake)[1].to_string();
    assert!(second.contains(r#"{\"sum\":9.0}"#), "{second}");
}

/// A server a resident keeps that changes its tools, and says so
/// (`notifications/tools/list_changed`), has them offered as they now are: the resident
/// offered what the server listed at its spawn for the life of the program, a new tool never
/// and a removed one still. The server's notice and the tool's answer race (the SDK sends
/// both, colony's client handles notices on a task of their own), so the model is asked again,
/// mail by mail, until a step offers the new tool; without the re-listing none ever does.
#[test]
fn a_resident_offers_the_tools_its_server_says_it_now_has() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let asked = body.to_string();
        let tools = tool_names(body);
        // Whether the conversation holds a result for a call of `tool` (Anthropic's blocks).
        let answered = |tool: &str| {
            let blocks: Vec<&Value> = body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["content"].as_array())
                .flatten()
                .collect();
            blocks.iter().any(|call| {
                call["type"] == "tool_use"
                    && call["name"] == tool
                    && blocks
                        .iter()
                        .any(|r| r["type"] == "tool_result" && r["tool_use_id"] == call["id"])
            })
        };
        if asked.contains("GROW") && !answered("py__grow") {
            return Reply::tool_call("g1", "py__grow", json!({"name": "sprout"}));
        }
        if !tools.iter().any(|t| t == "py__sprout") {
            return Reply::text("no sprout yet");
        }
        if tools.iter().any(|t| t == "py__fail") {
            return Reply::text("fail is still offered");
        }
        if !answered("py__sprout") {
            return Reply::tool_call("s1", "py__sprout", json!({}));
        }
        Reply::text("used sprout")
    });
    let py = format!(
        r#"{{ name = "py", command = "{}", args = {{ "{}", "stdio" }}, env = {{ GROWING = "1" }} }}"#,
        mcp::python().display(),
        mcp::server_script().display()
    );
    let script = format!(
        r#"ai.spawn{{ name = "gardener", mcp = {{ {py} }},
             deliver_to = function(reply) print(reply) ; if reply ~= "no sprout yet" then ai.stop("done") end end,
             sources = {{ function(self)
               assert(ai.mail{{ to = self, source = "desk", content = "GROW", hop = 0 }})
               for i = 1, 50 do
                 ai.sleep(100)
                 assert(ai.mail{{ to = self, source = "desk", content = "use it " .. i, hop = 0 }})
               end
             end }} }}
           print("watch ended:", ai.watch{{}})"#,
    );
    let run = sandbox(&fake).lua(&script, &["--max-time", "120"]).ok();
    let lines = run.lines();
    assert_eq!(
        &lines[lines.len() - 2..],
        ["used sprout", "watch ended:\tdone"],
        "{}",
        run.stdout
    );
    let used = model_calls(&fake).last().unwrap().to_string();
    assert!(used.contains("grown sprout"), "{used}");
}

#[test]
fn dynamic_mcp_connects_allowed_servers_from_the_next_step_on() {
    let web = mcp::python_http(mcp::free_port(), &[]);
    let url = web.url();
    let fake = FakeProvider::start();
    fake.push(Reply::tool_calls(vec![
        ("c1", "mcp_connect", json!({"name": "web", "server": url})),
        (
            "c2",
            "mcp_connect",
            json!({"name": "sly", "server": format!("{url}x")}),
        ),
        (
            "c3",
            "mcp_connect",
            json!({"name": "other", "server": "elsewhere"}),
        ),
    ]));
    fake.push(Reply::tool_calls(vec![
        ("c4", "web__echo", json!({"text": "dyn"})),
        (
            "c5",
            "mcp_connect",
            json!({"name": "local", "server": "py"}),
        ),
    ]));
    fake.push(Reply::tool_calls(vec![
        ("c6", "local__add", json!({"a": 1, "b": 1})),
        ("c7", "mcp_disconnect", json!({"name": "web"})),
    ]));
    fake.push(Reply::text("done"));
    let sb = sandbox(&fake);
    sb.write(
        "config.toml",
        &format!(
            "[use.general]\nprovider = \"anthropic\"\n\n[mcp.py]\ncommand = \"{}\"\nargs = [\"{}\", \"stdio\"]\n",
            mcp::python().display(),
            mcp::server_script().display()
        ),
    );
    let script = format!(
        r#"local r = ai.take_turn{{ prompt = "go", dynamic_mcp = {{ "{url}", "py" }} }}
           print("reply", r.reply)
           for _, e in ipairs(r.tool_events) do print("event", e.name, e.kind, e.outcome) end
           for _, s in ipairs(r.dynamic_mcp) do print("live", s.name, s.server, #s.tools) end"#
    );
    let run = sb.lua(&script, &[]).ok();
    let lines = run.lines();
    assert_eq!(lines[0], "reply\tdone", "{}", run.stdout);
    let events: Vec<Vec<&str>> = lines[1..8]
        .iter()
        .map(|l| l.splitn(4, '\t').collect())
        .collect();
    assert_eq!(events[0][1..3], ["mcp_connect", "ok"]);
    assert!(events[0][3].contains("web__echo"), "{:?}", events[0]);
    assert_eq!(events[1][1..3], ["mcp_connect", "error"]);
    assert!(events[1][3].contains("is not allowed"), "{:?}", events[1]);
    assert_eq!(events[2][1..3], ["mcp_connect", "error"]);
    assert!(events[2][3].contains("is not allowed"), "{:?}", events[2]);
    assert_eq!(events[3][1..], ["web__echo", "ok", r#"{"result":"dyn"}"#]);
    assert_eq!(events[4][1..3], ["mcp_connect", "ok"]);
    assert_eq!(events[5][1..], ["local__add", "ok", r#"{"sum":2.0}"#]);
    assert_eq!(events[6][1..3], ["mcp_disconnect", "ok"]);
    assert_eq!(lines[8], "live\tlocal\tpy\t7");
    assert_eq!(lines.len(), 9);

    let offered: Vec<Vec<String>> = model_calls(&fake).iter().map(tool_names).collect();
    assert_eq!(offered[0], ["mcp_connect", "mcp_disconnect"]);
    assert_eq!(offered[1].len(), 2 + 7);
    assert!(offered[1].contains(&"web__echo".to_string()));
    assert_eq!(offered[2].len(), 2 + 7 + 7);
    assert!(offered[2].contains(&"local__add".to_string()));
    // Disconnected in step 3: web's tools are gone from step 4.
    assert!(
        !offered[3].iter().any(|n| n.starts_with("web__")),
        "{:?}",
        offered[3]
    );
    assert!(offered[3].contains(&"local__add".to_string()));
}

#[test]
fn a_childs_stderr_goes_to_the_log_under_the_servers_name() {
    let fake = FakeProvider::start();
    let script = format!(
        r#"local conn = assert(mcp.connect({py}))
           mcp.close(conn)"#,
        py = py_stdio("scribe"),
    );
    let run = sandbox(&fake)
        .env("RUST_LOG", "colony::mcp=info")
        .lua(&script, &[])
        .ok();
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains("colony-test server starting"))
        .unwrap_or_else(|| panic!("no stderr line in the log:\n{}", run.stderr));
    assert!(line.contains("server=scribe"), "{line}");
}

/// A script written against the seed API drives the model's tool calls itself: the names
/// `mcp.tools(conn)` offered are the names `mcp.call` accepts, and what `mcp.call` answers (the
/// text a person reads, not the structured JSON) goes back to the model. A server connected by
/// URL without a name offers its tools under their own names; an error value concatenates.
#[test]
fn a_script_passes_the_models_calls_to_mcp_call() {
    let web = mcp::python_http(mcp::free_port(), &[]);
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call(
        "c1",
        "py__echo",
        json!({"text": "hello there"}),
    ));
    fake.push(Reply::text("It said hello there."));
    fake.push(Reply::tool_call("c2", "echo", json!({"text": "by url"})));
    fake.push(Reply::text("done"));
    let script = format!(
        r#"local function serve(conn, prompt)
             local tools = assert(mcp.tools(conn))
             local reply, err, calls = ai.ask(prompt, {{ tools = tools }})
             assert(reply, err)
             local call = calls[1]
             local out = assert(mcp.call(conn, call.name, call.arguments))
             print("called", call.name, out)
             local history = {{
               {{ role = "user", content = prompt }},
               {{ role = "assistant", content = reply, tool_calls = calls }},
               {{ role = "tool", tool_call_id = call.id, content = out }},
             }}
             print("reply", assert(ai.ask(history, {{ tools = tools }})))
           end
           serve(assert(mcp.connect({py})), "echo hello there")
           local conn = assert(mcp.connect("{url}"))
           serve(conn, "echo by url")
           local prefixed = {{}}
           for _, t in ipairs(assert(mcp.tools(conn, {{ prefix = true }}))) do
             prefixed[#prefixed + 1] = t.name
           end
           table.sort(prefixed)
           print("prefixed", prefixed[1])
           print("prefixed call", mcp.call(conn, prefixed[3], {{ text = "again" }}))
           local none, err = mcp.call(conn, "fail", {{ message = "nope" }})
           print("error: " .. err)
           print(err .. " (concatenated)", tostring(err) == err .. "")"#,
        py = py_stdio("py"),
        url = web.url(),
    );
    let run = sandbox(&fake).lua(&script, &[]).ok();
    assert_eq!(
        run.lines(),
        [
            "called\tpy__echo\thello there",
            "reply\tIt said hello there.",
            "called\techo\tby url",
            "reply\tdone",
            "prefixed\t127_0_0_1__add",
            "prefixed call\tagain",
            "error: tool_error: Error executing tool fail: nope",
            "tool_error: Error executing tool fail: nope (concatenated)\ttrue",
        ],
        "{}",
        run.stderr
    );
    let calls = model_calls(&fake);
    assert_eq!(calls.len(), 4);
    assert!(tool_names(&calls[0]).contains(&"py__echo".to_string()));
    let offered = tool_names(&calls[2]);
    assert!(offered.contains(&"echo".to_string()), "{offered:?}");
    assert!(
        !offered.iter().any(|n| n.contains("127_0_0_1")),
        "{offered:?}"
    );
    // The tool result the model read is the text, not `{"result":...}`.
    for (i, text) in [(1, "hello there"), (3, "by url")] {
        let result = &calls[i]["messages"][2]["content"][0];
        assert_eq!(result["type"], "tool_result", "{}", calls[i]);
        assert_eq!(result["content"], text, "{}", calls[i]);
    }
}
