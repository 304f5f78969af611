//! What colony's MCP client does beyond tools, against `@modelcontextprotocol/server-everything`
//! (npm) over stdio, through `colony run`: its resources listed and read (text as text, a blob as
//! a file), its prompts listed and got with arguments, and its elicitation tool answered by an
//! `on_elicit` hook (accepted, declined, a hook that raises, no hook at all); and resources
//! offered to a turn as read-only tools (`resources = true`), against the fake provider: one
//! `read_resource{ uri }` for server-everything's many, one tool each for
//! tests/support/mcp/resources_server.py's two, binary contents as files, none without the flag.

mod support;

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::{mcp, model_calls};

fn everything() -> String {
    format!(
        r#"{{ name = "everything", command = "node", args = {{ "{}", "stdio" }} }}"#,
        mcp::everything().display()
    )
}

#[test]
fn resources_are_listed_and_read_text_and_blob() {
    let sb = Sandbox::new();
    let script = format!(
        r#"local conn = assert(mcp.connect({server}))
           local list = assert(mcp.resources(conn))
           local static, template = 0, nil
           for _, r in ipairs(list) do
             if r.uri and r.uri:find("^demo://resource/static/") then static = static + 1 end
             if r.uri_template and r.uri_template:find("blob") then template = r.uri_template end
           end
           print("static", static > 0, "template", template)
           local text = assert(mcp.read(conn, "demo://resource/dynamic/text/1"))
           print("text", text[1].uri, text[1].mime_type, text[1].text:find("Resource 1") ~= nil)
           local blob = assert(mcp.read(conn, "demo://resource/dynamic/blob/1"))
           print("blob", blob[1].text, blob[1].file ~= nil, blob[1].file and blob[1].file.size > 0)
           local none, err = mcp.read(conn, "demo://no/such/thing")
           print("missing", none, err.kind)
           local ok, e = pcall(mcp.read, conn, 42)
           print("misuse", ok, tostring(e):find("uri must be a string") ~= nil)
           mcp.close(conn)"#,
        server = everything()
    );
    let run = sb.lua(&script, &[]).ok();
    let lines = run.lines();
    assert_eq!(
        lines[0], "static\ttrue\ttemplate\tdemo://resource/dynamic/blob/{resourceId}",
        "{}\n{}",
        run.stdout, run.stderr
    );
    assert_eq!(
        lines[1],
        "text\tdemo://resource/dynamic/text/1\ttext/plain\ttrue"
    );
    assert_eq!(lines[2], "blob\tnil\ttrue\ttrue");
    assert_eq!(lines[3], "missing\tnil\trpc_error");
    assert_eq!(lines[4], "misuse\tfalse\ttrue");
}

#[test]
fn prompts_are_listed_and_got_with_arguments() {
    let sb = Sandbox::new();
    let script = format!(
        r#"local conn = assert(mcp.connect({server}))
           local list = assert(mcp.prompts(conn))
           for _, p in ipairs(list) do
             if p.name == "args-prompt" then
               for _, a in ipairs(p.arguments) do print("arg", a.name, a.required == true) end
             end
           end
           local p = assert(mcp.get_prompt(conn, "args-prompt", {{ city = "Paris", state = "TX" }}))
           print("got", #p.messages, p.messages[1].role, p.messages[1].text)
           local none, err = mcp.get_prompt(conn, "no-such-prompt", {{}})
           print("missing", none, err.kind)
           mcp.close(conn)"#,
        server = everything()
    );
    let run = sb.lua(&script, &[]).ok();
    let lines = run.lines();
    assert_eq!(
        lines[..2],
        ["arg\tcity\ttrue", "arg\tstate\tfalse"],
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    assert_eq!(lines[2], "got\t1\tuser\tWhat's weather in Paris, TX?");
    assert_eq!(lines[3], "missing\tnil\trpc_error");
}

/// The elicitation tool's answer for a hook (Lua source for `on_elicit`, or none).
fn elicit(hook: Option<&str>) -> (Vec<String>, String) {
    let sb = Sandbox::new();
    let server = everything();
    let opts = match hook {
        Some(h) => format!("{{ on_elicit = {h} }}"),
        None => "nil".into(),
    };
    let script = format!(
        r#"local conn = assert(mcp.connect({server}, {opts}))
           local listed = false
           for _, t in ipairs(assert(mcp.tools(conn))) do
             if t.name == "everything__trigger-elicitation-request" then listed = true end
           end
           print("listed", listed)
           if listed then
             local r = mcp.call{{ conn = conn, name = "trigger-elicitation-request", args = {{}} }}
             print(r and r.text or "no result")
           end
           mcp.close(conn)"#
    );
    let run = sb.lua(&script, &[]).ok();
    (
        run.lines().iter().map(|l| l.to_string()).collect(),
        run.stderr,
    )
}

#[test]
fn elicitation_is_answered_by_the_hook() {
    let (lines, stderr) = elicit(Some(
        r#"function(req)
             assert(req.server == "everything" and req.mode == "form", req.mode)
             assert(req.schema.properties.name, "the schema reaches the hook")
             return { action = "accept", content = { name = "Ada", email = "ada@example.org" } }
           end"#,
    ));
    let text = lines.join("\n");
    assert_eq!(lines[0], "listed\ttrue", "{text}\n{stderr}");
    assert!(
        text.contains("User provided the requested information"),
        "{text}\n{stderr}"
    );
    assert!(text.contains("- Name: Ada"), "{text}");
    assert!(text.contains("- Email: ada@example.org"), "{text}");
}

#[test]
fn elicitation_declined_by_the_hook_or_failed_by_a_hook_that_raises() {
    let (lines, stderr) = elicit(Some(r#"function() return "decline" end"#));
    let text = lines.join("\n");
    assert!(text.contains("User declined"), "{text}\n{stderr}");
    let (lines, stderr) = elicit(Some(r#"function() error("no one is here") end"#));
    let text = lines.join("\n");
    assert_eq!(lines[0], "listed\ttrue", "{text}\n{stderr}");
    assert!(
        text.contains("no one is here"),
        "the hook's error reaches the server's answer: {text}\n{stderr}"
    );
    let (lines, stderr) = elicit(Some(r#"function() return "maybe" end"#));
    let text = lines.join("\n");
    assert!(text.contains("\"maybe\" is not one of"), "{text}\n{stderr}");
}

#[test]
fn without_a_hook_elicitation_is_not_offered() {
    let (lines, _) = elicit(None);
    assert_eq!(lines, ["listed\tfalse"]);
}

#[test]
fn a_hook_that_is_not_a_function_is_refused() {
    let sb = Sandbox::new();
    let run = sb
        .lua(
            r#"mcp.connect("http://127.0.0.1:9/mcp", { on_elicit = "yes" })"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr
            .contains("on_elicit must be a function, not string"),
        "{}",
        run.stderr
    );
}

/// A turn against the fake provider with `server` (Lua) in its `mcp` list, the model calling
/// `calls` in its first step; the reply, and the bodies of the model calls.
fn turn_with(server: &str, calls: Vec<(&str, &str, serde_json::Value)>) -> (String, Vec<Value>) {
    let fake = FakeProvider::start();
    if !calls.is_empty() {
        fake.push(Reply::tool_calls(calls));
    }
    fake.push(Reply::text("Read."));
    let sb = support::styled(&fake, "anthropic");
    sb.write("config.toml", "[use.general]\nprovider = \"anthropic\"\n");
    let script = format!(
        r#"local r = ai.take_turn{{ prompt = "read it", mcp = {{ {server} }} }}
           print(r.reply)
           for _, e in ipairs(r.tool_events) do print("event", e.name, e.outcome) end"#
    );
    let run = sb.lua(&script, &[]).ok();
    (run.stdout, model_calls(&fake))
}

fn offered(body: &Value) -> Vec<(String, String)> {
    body["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| {
                    (
                        t["name"].as_str().unwrap().to_string(),
                        t["description"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_turn_reads_a_servers_many_resources_through_read_resource() {
    let server = format!(
        r#"{{ name = "everything", command = "node", args = {{ "{}", "stdio" }}, resources = true }}"#,
        mcp::everything().display()
    );
    let (stdout, calls) = turn_with(
        &server,
        vec![
            (
                "c1",
                "everything__read_resource",
                json!({"uri": "demo://resource/dynamic/text/1"}),
            ),
            (
                "c2",
                "everything__read_resource",
                json!({"uri": "demo://resource/dynamic/blob/2"}),
            ),
        ],
    );
    assert!(stdout.starts_with("Read.\n"), "{stdout}");
    let tools = offered(&calls[0]);
    let (_, description) = tools
        .iter()
        .find(|(n, _)| n == "everything__read_resource")
        .unwrap_or_else(|| panic!("{tools:?}"));
    assert!(
        description.contains("demo://resource/static/"),
        "the listed URIs: {description}"
    );
    assert!(
        description.contains("demo://resource/dynamic/blob/{resourceId}"),
        "the templates: {description}"
    );
    assert!(
        !tools
            .iter()
            .any(|(n, _)| n.starts_with("everything__read_") && n != "everything__read_resource"),
        "a server with many resources gets one reader: {tools:?}"
    );
    let second = calls[1].to_string();
    assert!(second.contains("Resource 1"), "the text read: {second}");
    // The blob (text/plain bytes) reaches the model as the attached file's contents.
    assert!(
        second.contains("demo://resource/dynamic/blob/2 is binary, text/plain: attached as 2"),
        "{second}"
    );
    assert!(
        second.contains("Resource 2: This is a base64 blob"),
        "{second}"
    );
}

#[test]
fn a_turn_offers_a_few_resources_as_one_tool_each_and_an_image_as_a_file() {
    let server = format!(
        r#"{{ name = "docs", command = "python3", args = {{ "{}" }}, resources = true }}"#,
        mcp::server_script()
            .with_file_name("resources_server.py")
            .display()
    );
    let (stdout, calls) = turn_with(
        &server,
        vec![
            ("c1", "docs__read_notes", json!({})),
            ("c2", "docs__read_logo", json!({})),
        ],
    );
    assert_eq!(
        stdout,
        "Read.\nevent\tdocs__read_notes\t# Notes\nShip on Friday.\nevent\tdocs__read_logo\t(file:///logo.png is binary, image/png: attached as logo.png)\n"
    );
    let tools = offered(&calls[0]);
    assert_eq!(
        tools,
        [
            (
                "docs__read_notes".to_string(),
                "The team's notes. (text/markdown, read-only)".to_string()
            ),
            (
                "docs__read_logo".to_string(),
                "Reads the resource file:///logo.png. (image/png, read-only)".to_string()
            ),
        ]
    );
    let second = &calls[1];
    assert!(second.to_string().contains("Ship on Friday."), "{second}");
    assert!(
        second.to_string().contains(r#""media_type":"image/png""#),
        "the PNG goes to the model as an image: {second}"
    );
}

#[test]
fn without_resources_true_a_turn_offers_no_resource_tools() {
    let server = format!(
        r#"{{ name = "docs", command = "python3", args = {{ "{}" }} }}"#,
        mcp::server_script()
            .with_file_name("resources_server.py")
            .display()
    );
    let (stdout, calls) = turn_with(&server, vec![]);
    assert_eq!(stdout, "Read.\n");
    assert_eq!(offered(&calls[0]), []);
}
