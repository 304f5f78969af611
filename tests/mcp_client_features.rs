//! What colony's MCP client does beyond tools, against `@modelcontextprotocol/server-everything`
//! (npm) over stdio, through `colony run`: its resources listed and read (text as text, a blob as
//! a file), its prompts listed and got with arguments, and its elicitation tool answered by an
//! `on_elicit` hook (accepted, declined, a hook that raises, no hook at all).

mod support;

use support::mcp;
use support::script::Sandbox;

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
