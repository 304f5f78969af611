//! Peak memory against hostile answers: `colony run` (the binary) asking a hostile model provider
//! (whole and streamed) and calling a hostile MCP server's tool, each answer invalid UTF-8, JSON
//! nested 100,000 deep, a stream that never ends or an SSE line that never ends
//! (tests/support/hostile.rs), beside the same program against a well-behaved fake. The figure
//! is the process's peak resident set (`wait4`'s `ru_maxrss`); the limits that bound it are the
//! default `max_response_bytes` (64 MiB) for a provider and rmcp's 16 MiB an event or a body for
//! an MCP server, with a 5 s call timeout for what never ends. Printed, not asserted.
//!
//! Run: `cargo bench --bench hostile`

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Instant;

use support::fake::{FakeProvider, Reply};
use support::hostile::{self, Hostility};
use support::script::Sandbox;

const ASK: &str = r#"
for _, stream in ipairs{ false, true } do
  local opts = { provider = "openai" }
  if stream then opts.stream = function() end end
  local reply, err = ai.ask("hi", opts)
  print(reply or err.kind)
end
"#;

fn mcp_script(url: &str) -> String {
    format!(
        r#"
local conn = assert(mcp.connect("{url}"))
local result, err = mcp.call{{ conn = conn, name = "echo", args = {{}}, timeout = 5 }}
print(result and result.text or err.kind)
"#
    )
}

/// Runs `colony run` of `source` in `sb`; its peak RSS in MiB, the wall time and what it printed.
// The child is reaped by `wait4` (which gives its rusage), not by `Child::wait`.
#[allow(clippy::zombie_processes)]
fn peak(sb: &Sandbox, source: &str) -> (f64, f64, String) {
    let file = sb.write("script.lua", source).display().to_string();
    let started = Instant::now();
    let child = sb
        .command(&["run", "--max-time", "90", &file])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("colony runs");
    let pid = child.id() as libc::pid_t;
    let mut stdout = child.stdout.expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
        out
    });
    let mut status = 0;
    // SAFETY: wait4 fills the zeroed rusage for the child this process started.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid, "wait4");
    let printed = reader.join().unwrap_or_default();
    (
        usage.ru_maxrss as f64 / 1024.0,
        started.elapsed().as_secs_f64(),
        printed.split_whitespace().collect::<Vec<_>>().join(" "),
    )
}

fn provider_sandbox(url: &str) -> Sandbox {
    let sb = Sandbox::new()
        .env("OPENAI_API_KEY", "bench-key-hostile-0123456789")
        .env("OPENAI_BASE_URL", url);
    sb.write(
        "config.toml",
        "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\ntimeout = 5\n",
    );
    sb
}

fn row(what: &str, (mib, secs, printed): (f64, f64, String)) {
    println!("{what:<44} {mib:>8.1} MiB  {secs:>6.2} s   {printed}");
}

fn main() {
    println!("peak RSS of `colony run` against hostile answers (ru_maxrss), one run each");
    println!("{:<44} {:>12}  {:>8}   answered", "", "peak RSS", "wall");
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("fine"));
    row(
        "provider, a normal answer (the baseline)",
        peak(&provider_sandbox(&fake.base_url("openai")), ASK),
    );
    for how in Hostility::ALL {
        row(
            &format!("provider, {how:?}, whole then streamed"),
            peak(&provider_sandbox(&hostile::provider(how)), ASK),
        );
    }
    for how in Hostility::ALL {
        row(
            &format!("MCP server, {how:?}"),
            peak(&Sandbox::new(), &mcp_script(&hostile::mcp_server(how))),
        );
    }
}
