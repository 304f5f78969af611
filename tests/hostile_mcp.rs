//! A hostile MCP server, through the binary: a Streamable HTTP server on loopback that
//! initialises and lists its tool as a server should, then answers every `tools/call` with
//! invalid UTF-8, JSON nested 100,000 deep, a stream of notifications that never ends, or an SSE
//! line that never ends. Each call must end as `nil, err` with a typed error, within the call's
//! timeout and rmcp's response limits (16 MiB an event or a body), never a hang or a crash; a
//! connection whose server sent what cannot be read is `closed` (rmcp ends the transport) and
//! can still be closed from Lua. The run carries `--max-time` only as a guard against
//! hanging: the tests assert it did not fire.

mod support;

use support::hostile::{self, Hostility};
use support::script::Sandbox;

/// Longer than any of these runs needs; a run still going then is a hang.
const GUARD: &str = "90";

/// `mcp.call` of the hostile server's tool; the answer's kind and message.
fn call_hostile(how: Hostility) -> String {
    let url = hostile::mcp_server(how);
    let sb = Sandbox::new();
    let run = sb.lua(
        &format!(
            r#"
local conn, err = mcp.connect("{url}")
assert(conn, err and err.message)
local tools = mcp.tools(conn)
assert(#tools == 1, "the server lists its tool")
local result, err = mcp.call{{ conn = conn, name = "echo", args = {{}}, timeout = 5 }}
print(("result=%s kind=%s: %s"):format(tostring(result), err and err.kind or "-",
  err and tostring(err.message):sub(1, 200) or "-"))
mcp.close(conn)
print("closed")
"#
        ),
        &["--max-time", GUARD],
    );
    assert_eq!(
        run.code, 0,
        "{how:?}: stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    let lines = run.lines();
    assert_eq!(lines.last().copied(), Some("closed"), "{lines:?}");
    lines[0].to_string()
}

/// The call answered `nil` with an error of `kind` whose message holds `says`.
#[track_caller]
fn assert_typed(line: &str, kind: &str, says: &str) {
    assert!(line.starts_with("result=nil "), "{line}");
    assert!(
        line.contains(&format!(" kind={kind}: ")),
        "not {kind}: {line}"
    );
    assert!(line.contains(says), "{line}");
}

#[test]
fn invalid_utf8_from_an_mcp_server_is_a_typed_error() {
    assert_typed(
        &call_hostile(Hostility::InvalidUtf8),
        "closed",
        "invalid unicode code point",
    );
}

#[test]
fn json_nested_100000_deep_from_an_mcp_server_is_a_typed_error() {
    assert_typed(
        &call_hostile(Hostility::Deep),
        "closed",
        "recursion limit exceeded",
    );
}

#[test]
fn an_mcp_stream_that_never_ends_is_cut_at_the_timeout() {
    assert_typed(
        &call_hostile(Hostility::EndlessStream),
        "timeout",
        "no answer within 5 s",
    );
}

#[test]
fn an_mcp_sse_line_that_never_ends_is_cut_at_the_limit() {
    // rmcp drops the transport once an event passes its 16 MiB limit, saying only that.
    assert_typed(
        &call_hostile(Hostility::EndlessLine),
        "closed",
        "the connection closed",
    );
}

/// A stdio server whose tools' names are not words (a space, a `!`, nothing at all, two that
/// read the same once sanitised, one of them a word already, which keeps its name):
/// `mcp.tools` offers each under a sanitised name, leaves out those it cannot name, and a call
/// by the offered name reaches the server's own tool. It was a
/// panic of colony's Lua thread ("a tool name must be a word"), which `pcall` could not catch.
#[test]
fn tools_whose_names_are_not_words_are_renamed_or_left_out_not_a_panic() {
    let sb = Sandbox::new();
    let server = support::mcp::scripted_server(
        &sb,
        r#"[{"name": n, "inputSchema": {"type": "object"}}
         for n in ["a b", "a_b", "bad name!", "bad.name!", "", "ok"]]"#,
        support::mcp::CALLED,
    );
    let run = sb.lua(
        &format!(
            r#"
local conn = assert(mcp.connect{{ command = "python3", args = {{ "{}" }} }})
local names = {{}}
local by = {{}}
for _, t in ipairs(assert(mcp.tools(conn))) do names[#names + 1] = t.name; by[t.name] = t end
print(table.concat(names, ","))
print(assert(mcp.call(conn, "bad name!", {{}})))
-- The tool as a turn would call it: by its offered name, reaching the server's own.
print(by.bad_name_({{}}))
print(by.a_b({{}}))
mcp.close(conn)
"#,
            server.display()
        ),
        &["--max-time", GUARD],
    );
    assert_eq!(
        run.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert_eq!(
        run.lines(),
        [
            "a_b,bad_name_,ok",
            "called bad name!",
            "called bad name!",
            "called a_b"
        ],
        "{}",
        run.stderr
    );
}
