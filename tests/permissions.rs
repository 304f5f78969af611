//! Permissions (`--sandbox`, `--allow-*`) and `--max-memory`, through the binary: each use refused
//! with the flag that grants it and granted with that flag; no `..` or symlink escape; an `http`
//! redirect only to an allowed host; a memory bomb in a tool fails that call and the program goes
//! on; `proc.run`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::get;
use serde_json::json;
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;

/// Each line: `<name> ok` or `<name> refused: <message's first line>`.
const PROBES: &str = r#"
local function probe(name, f, ...)
  local ok, err = pcall(f, ...)
  if ok then print(name .. " ok") else print(name .. " refused: " .. err) end
end
local dir = ...
probe("fs.read", fs.read, dir .. "/data.txt")
probe("fs.write", fs.write, dir .. "/out.txt", "x")
probe("io.open", function() return assert(io.open(dir .. "/data.txt")):read("a") end)
probe("io.open.w", function() return assert(io.open(dir .. "/out2.txt", "w")):close() end)
probe("os.execute", os.execute, "true")
probe("io.popen", function() return io.popen("true"):close() end)
probe("proc.run", function() assert(proc.run{ cmd = "true" }) end)
probe("os.getenv", os.getenv, "HOME")
probe("load.binary", function() assert(load(string.dump(function() return 1 end))) end)
probe("load.text", function() assert(load("return 1")) end)
probe("mcp.connect", function() mcp.connect{ command = "/nonexistent/mcp-server" } end)
"#;

fn probes(sb: &Sandbox, flags: &[&str]) -> Vec<String> {
    sb.write("data.txt", "data");
    let file = sb.write("probes.lua", PROBES);
    let dir = sb.dir.path().display().to_string();
    let mut args = vec!["run"];
    args.extend_from_slice(flags);
    let file = file.display().to_string();
    args.push(&file);
    args.push(&dir);
    let run = sb.colony(&args);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    run.stdout.lines().map(str::to_string).collect()
}

#[test]
fn in_a_sandbox_each_use_is_refused_naming_the_flag_that_grants_it() {
    let sb = Sandbox::new();
    let dir = std::fs::canonicalize(sb.dir.path()).unwrap();
    let d = dir.display();
    let lines = probes(&sb, &["--sandbox"]);
    let expected = [
        format!("fs.read refused: fs.read: reading {d}/data.txt needs --allow-read={d}/data.txt"),
        format!("fs.write refused: fs.write: writing {d}/out.txt needs --allow-write={d}/out.txt"),
        format!("io.open refused: io.open: reading {d}/data.txt needs --allow-read={d}/data.txt"),
        format!(
            "io.open.w refused: io.open: writing {d}/out2.txt needs --allow-write={d}/out2.txt"
        ),
        "os.execute refused: os.execute: running \"true\" needs --allow-run".to_string(),
        "io.popen refused: io.popen: running \"true\" needs --allow-run".to_string(),
        "proc.run refused: proc.run: running \"true\" needs --allow-run".to_string(),
        "os.getenv refused: os.getenv: reading HOME needs --allow-env".to_string(),
        "load.binary refused: load: loading a binary chunk needs --allow-run".to_string(),
        "load.text ok".to_string(),
        "mcp.connect refused: mcp.connect: running \"/nonexistent/mcp-server\" needs --allow-run"
            .to_string(),
    ];
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    for (line, want) in lines.iter().zip(&expected) {
        // A refusal raised by one of colony's functions carries the script's line in front.
        let line = line
            .split_once(&format!(" {d}/probes.lua:"))
            .map(|(name, rest)| format!("{name} {}", rest.split_once(": ").unwrap().1))
            .unwrap_or_else(|| line.clone());
        assert_eq!(&line, want);
    }
    assert!(!sb.path("out.txt").exists() && !sb.path("out2.txt").exists());
}

#[test]
fn each_flag_grants_its_use_and_no_flag_grants_everything() {
    let sb = Sandbox::new();
    let dir = sb.dir.path().display().to_string();
    let read = format!("--allow-read={dir}");
    let write = format!("--allow-write={dir}");
    let granted = probes(&sb, &[&read, &write, "--allow-run", "--allow-env"]);
    let everything = probes(&sb, &[]);
    let all = probes(&sb, &["--sandbox", "--allow-all"]);
    // Without a list, a path flag grants every path.
    let bare = probes(
        &sb,
        &[
            "--allow-read",
            "--allow-write",
            "--allow-run",
            "--allow-env",
        ],
    );
    for lines in [&granted, &everything, &all, &bare] {
        for line in lines.iter() {
            if line.starts_with("mcp.connect") {
                // Allowed to start, the server is not there: a connection error, not a refusal.
                assert!(!line.contains("needs --allow"), "{line}");
            } else {
                assert!(line.ends_with(" ok"), "{line}\n{lines:#?}");
            }
        }
    }
    // Reading only: writing stays refused.
    let read_only = probes(&sb, &[&read]);
    assert!(read_only.iter().any(|l| l == "fs.read ok"));
    assert!(
        read_only
            .iter()
            .any(|l| l.starts_with("fs.write refused") && l.ends_with("out.txt"))
    );
}

#[test]
fn neither_dot_dot_nor_a_symlink_escapes_an_allowed_folder() {
    let sb = Sandbox::new();
    let allowed = sb.path("allowed");
    let secret = sb.path("secret");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&secret).unwrap();
    std::fs::write(secret.join("key"), "the secret").unwrap();
    std::fs::write(allowed.join("notes.txt"), "notes").unwrap();
    std::os::unix::fs::symlink(&secret, allowed.join("link")).unwrap();
    let source = r#"
for _, p in ipairs{ "allowed/notes.txt", "allowed/../secret/key", "allowed/link/key",
                    "allowed/missing/../../secret/key" } do
  local ok, got = pcall(fs.read, p)
  print(p, ok and got or tostring(got):match("needs (%-%-allow%-read=%S+)"))
end
"#;
    let flag = format!("--allow-read={}", allowed.display());
    let run = sb.lua(source, &[&flag]).ok();
    let secret = std::fs::canonicalize(&secret).unwrap();
    let s = secret.display();
    assert_eq!(
        run.lines(),
        vec![
            "allowed/notes.txt\tnotes".to_string(),
            format!("allowed/../secret/key\t--allow-read={s}/key"),
            format!("allowed/link/key\t--allow-read={s}/key"),
            format!("allowed/missing/../../secret/key\t--allow-read={s}/key"),
        ]
    );
}

#[test]
fn http_reaches_only_allowed_hosts_and_follows_no_redirect_elsewhere() {
    let elsewhere_hits = Arc::new(AtomicUsize::new(0));
    let hits = elsewhere_hits.clone();
    let elsewhere = support::serve(Router::new().route(
        "/",
        get(move || {
            hits.fetch_add(1, Ordering::SeqCst);
            async { "elsewhere" }
        }),
    ));
    let target = format!("{elsewhere}/");
    let home = support::serve(
        Router::new()
            .route("/here", get(|| async { "here" }))
            .route(
                "/away",
                get(move || {
                    let target = target.clone();
                    async move { (StatusCode::FOUND, [(header::LOCATION, target)]) }
                }),
            ),
    );
    let host = |url: &str| url.trim_start_matches("http://").to_string();
    let source = format!(
        r#"
local r = http.get("{home}/here") print("here", r.body)
local r, err = http.get("{home}/away") print("away", r and r.body, err and err.message)
print("direct", pcall(http.get, "{elsewhere}/"))
"#
    );
    let sb = Sandbox::new();
    let flag = format!("--allow-net={}", host(&home));
    let run = sb.lua(&source, &[&flag]).ok();
    let lines = run.lines();
    assert_eq!(lines[0], "here\there");
    let e = host(&elsewhere);
    assert!(
        lines[1].starts_with("away\tnil\tGET ")
            && lines[1].ends_with(&format!(
                "redirected to http://{e}/: http.get: reaching {e} needs --allow-net={e}"
            )),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with(&format!(
            "direct\tfalse\t{}:4: http.get: reaching {e} needs --allow-net={e}",
            sb.path("script.lua").display()
        )),
        "{}",
        lines[2]
    );
    assert_eq!(elsewhere_hits.load(Ordering::SeqCst), 0);
    // Both allowed: the redirect is followed.
    let both = format!("--allow-net={},{}", host(&home), host(&elsewhere));
    let run = sb.lua(&source, &[&both]).ok();
    assert_eq!(run.lines()[1], "away\telsewhere\tnil");
    assert_eq!(elsewhere_hits.load(Ordering::SeqCst), 2);
}

#[test]
fn a_memory_bomb_fails_its_tool_call_with_memory_and_the_program_goes_on() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "bomb", json!({})));
    fake.push(Reply::text("that tool failed"));
    let sb = support::styled(&fake, "openai");
    sb.write("config.toml", "[use.general]\nprovider = \"openai\"\n");
    let run = sb
        .lua(
            r#"
local bomb = ai.tool{ name = "bomb", parameters = {}, handler = function()
  local t = {}
  for i = 1, 1e9 do t[i] = string.rep("x", 4096) .. i end
end }
local r = ai.take_turn{ prompt = "go", tools = { bomb } }
print("reply", r.reply)
for _, e in ipairs(r.tool_events) do print("event", e.name, e.kind) end
collectgarbage()
print("after", #string.rep("y", 1 << 20))
"#,
            &["--max-memory", "64M"],
        )
        .ok();
    assert_eq!(run.lines()[0], "reply\tthat tool failed", "{}", run.stderr);
    assert_eq!(run.lines()[1], "event\tbomb\terror");
    assert_eq!(run.lines()[2], "after\t1048576");
    let calls = support::model_calls(&fake);
    let result = calls[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("a tool result")["content"]
        .to_string();
    assert!(
        result.contains("memory: the program's Lua memory reached its limit (--max-memory)"),
        "{result}"
    );
}

/// The main chunk past `--max-memory` says which limit it met, as a tool or a source does: it
/// said only Lua's "not enough memory".
#[test]
fn the_main_chunk_past_max_memory_names_the_limit() {
    let run = Sandbox::new()
        .lua(
            "local t = {}\nfor i = 1, 1e9 do t[i] = string.rep(\"x\", 4096) .. i end\n",
            &["--max-memory", "64M"],
        )
        .failed();
    assert!(
        run.stderr
            .contains("memory: the program's Lua memory reached its limit (--max-memory)"),
        "{}",
        run.stderr
    );
}

#[test]
fn proc_run_waits_without_holding_the_program_and_ends_what_outlives_its_timeout() {
    let sb = Sandbox::new();
    // While one coroutine waits on a command, another runs: os.execute would hold both.
    let run = sb
        .lua(
            r#"
local order = {}
ai.parallel(
  function()
    local r = assert(proc.run{ cmd = "sh", args = { "-c", "sleep 0.3; cat; echo oops >&2; exit 3" }, stdin = "fed" })
    order[#order + 1] = "proc " .. r.stdout .. " " .. r.stderr:gsub("\n", "") .. " " .. r.status .. " " .. tostring(r.ok)
  end,
  function() order[#order + 1] = "other" end)
print(table.concat(order, ", "))
local r, err = proc.run{ cmd = "sleep", args = { "30" }, timeout = 0.2 }
print(r, err.kind, err.message)
print(select(2, proc.run{ cmd = "/no/such/program" }).kind)
print(select(2, proc.run{ cmd = "yes", max_bytes = 100 }).kind)
print(pcall(proc.run, { cmd = "true", timeout = math.huge }))
"#,
            &[],
        )
        .ok();
    let lines = run.lines();
    assert_eq!(lines[0], "other, proc fed oops 3 false");
    assert_eq!(
        lines[1],
        "nil\ttimeout\tproc.run: sleep 30 timed out after 0.2 s; it was killed"
    );
    assert_eq!(lines[2], "not_found");
    assert_eq!(lines[3], "too_large");
    assert!(
        lines[4].starts_with("false\t") && lines[4].contains("proc.run: timeout:"),
        "{}",
        lines[4]
    );
}

#[test]
fn a_command_timed_out_is_killed_with_what_it_started_and_a_missing_cwd_is_named() {
    // Killing only the command left its children running, adopted by init: `sh -c` timed out
    // and its `sleep` ran on.
    let sb = Sandbox::new();
    let pid_file = sb.path("pid");
    let run = sb
        .lua(
            &format!(
                r#"
local r, err = proc.run{{ cmd = "sh", args = {{ "-c", "sleep 300 & echo $! > {}; wait" }}, timeout = 0.5 }}
print(r, err.kind)
print(select(2, proc.run{{ cmd = "pwd", cwd = "no/such/folder" }}).message)
print(select(2, pcall(proc.run, {{ cmd = "env", env = {{ ["B=C"] = "1" }} }})))
print(select(2, pcall(proc.run, {{ cmd = "env", env = {{ PORT = 8080 }} }})))
local r2, err2 = proc.run{{ cmd = "sh", args = {{ "-c", "sleep 2 & echo started" }}, timeout = 0.5 }}
print(r2, err2.kind, err2.message:match("ended %(status 0%), but what it started in the background kept its output open"))
"#,
                pid_file.display()
            ),
            &[],
        )
        .ok();
    let dir = sb.dir.path().display();
    assert_eq!(
        run.lines(),
        [
            "nil\ttimeout".to_string(),
            format!(
                "proc.run: cannot start \"pwd\": its cwd \"{dir}/no/such/folder\" is not a folder"
            ),
            format!(
                "{dir}/script.lua:5: proc.run: env: \"B=C\" is not a variable name (no '=', not \
                 empty)"
            ),
            // The value at fault is named (it said the name "PORT" was not a string).
            format!("{dir}/script.lua:6: proc.run: env.PORT must be a string, not an integer"),
            // The command had ended; what it left in the background held its output (it said
            // the command was killed).
            "nil\ttimeout\tended (status 0), but what it started in the background kept its \
             output open"
                .to_string(),
        ]
    );
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let stat = format!("/proc/{}/stat", pid.trim());
    // Gone, or dead and waiting for init to reap it.
    let dead = || {
        std::fs::read_to_string(&stat).map_or(true, |s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !dead() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sleep the command started still runs"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_read_limit_past_the_memory_limit_is_refused_before_anything_is_read() {
    // A 1 GiB max_bytes under --max-memory 64M read 2.6 GB before failing; the defaults stay
    // usable under a small limit.
    let sb = Sandbox::new();
    let run = sb
        .lua(
            r#"print(select(2, pcall(http.get, "http://127.0.0.1:1/", { max_bytes = 1024^3 })))
               print(select(2, pcall(proc.run, { cmd = "true", max_bytes = 1024^3 })))
               io.write(proc.run{ cmd = "echo", args = { "defaults" } }.stdout)
               -- The default limit under a smaller memory limit: a too_large result, as
               -- documented (it raised the memory error, having read past the limit).
               local r, err = proc.run{ cmd = "head", args = { "-c", "20000000", "/dev/zero" } }
               print(r, err.kind, err.message:match("passed %d+ bytes %(8 MiB%)"))"#,
            &["--max-memory", "16M"],
        )
        .ok();
    let at = sb.path("script.lua").display().to_string();
    let over = |who: &str, line: u32| {
        format!(
            "{at}:{line}: {who}: max_bytes 1073741824 bytes (1024 MiB) is more than the \
             program's memory limit of 16777216 bytes (16 MiB) (--max-memory): what it reads \
             could never be held"
        )
    };
    assert_eq!(
        run.lines(),
        [
            over("http.get", 1),
            over("proc.run", 2),
            "defaults".into(),
            "nil\ttoo_large\tpassed 8388608 bytes (8 MiB)".into()
        ]
    );
}

#[test]
fn a_dangling_symlink_in_an_allowed_folder_does_not_write_outside_it() {
    let sb = Sandbox::new();
    let allowed = sb.path("allowed");
    std::fs::create_dir_all(&allowed).unwrap();
    let outside = sb.path("outside.txt");
    // The target does not exist yet: writing through the link would create it.
    std::os::unix::fs::symlink(&outside, allowed.join("dangling")).unwrap();
    std::os::unix::fs::symlink("../elsewhere.txt", allowed.join("relative")).unwrap();
    // `io` resolves against the current directory, `fs` against the script's folder: both are
    // given the absolute path.
    let source = format!(
        r#"
for _, name in ipairs{{ "dangling", "relative" }} do
  local p = "{}/" .. name
  local ok, err = pcall(fs.write, p, "escaped")
  print("allowed/" .. name, ok, ok or tostring(err):match("needs (%-%-allow%-write=%S+)"))
  ok, err = pcall(function() return assert(io.open(p, "w")) end)
  print("allowed/" .. name, ok, ok or tostring(err):match("needs (%-%-allow%-write=%S+)"))
end
"#,
        allowed.display()
    );
    let flag = format!("--allow-write={}", allowed.display());
    let run = sb.lua(&source, &[&flag]).ok();
    let root = std::fs::canonicalize(sb.dir.path()).unwrap();
    let r = root.display();
    assert_eq!(
        run.lines(),
        vec![
            format!("allowed/dangling\tfalse\t--allow-write={r}/outside.txt"),
            format!("allowed/dangling\tfalse\t--allow-write={r}/outside.txt"),
            format!("allowed/relative\tfalse\t--allow-write={r}/elsewhere.txt"),
            format!("allowed/relative\tfalse\t--allow-write={r}/elsewhere.txt"),
        ]
    );
    assert!(!outside.exists() && !sb.path("elsewhere.txt").exists());
}

#[test]
fn an_allow_flag_with_an_empty_list_is_refused_not_read_as_everything() {
    let sb = Sandbox::new();
    let data = sb.write("data.txt", "data");
    let file = sb.write(
        "p.lua",
        &format!("print(fs.read({:?}) ~= nil)\n", data.display().to_string()),
    );
    let file = file.display().to_string();
    for flag in [
        "--allow-read=",
        "--allow-write=",
        "--allow-net=",
        "--allow-read=a,,b",
    ] {
        let run = sb.colony(&["run", flag, &file]);
        assert_eq!(run.code, 2, "{flag}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains("an empty item"),
            "{flag}: {}",
            run.stderr
        );
    }
    // The bare flag still allows everything.
    let run = sb.colony(&["run", "--allow-read", &file]).ok();
    assert_eq!(run.stdout.trim(), "true");
}

/// `require` looks in the script's folder before the current directory: run from elsewhere, a
/// script did not find its own module (Lua's path begins with `./?.lua`), or found the
/// current directory's file of that name instead.
#[test]
fn require_finds_a_module_beside_the_script_run_from_another_folder() {
    let sb = Sandbox::new();
    let app = sb.path("app");
    std::fs::create_dir_all(app.join("util")).unwrap();
    std::fs::write(app.join("helper.lua"), "return 'beside the script'").unwrap();
    std::fs::write(app.join("util/init.lua"), "return 'its package'").unwrap();
    std::fs::write(sb.path("helper.lua"), "return 'the current directory'").unwrap();
    std::fs::write(
        app.join("main.lua"),
        "print((require('helper')), (require('util')))",
    )
    .unwrap();
    for flags in [&[][..], &["--sandbox"][..]] {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.push("app/main.lua");
        // From the sandbox, where the other helper.lua is.
        let out = sb
            .command(&args)
            .current_dir(sb.path("."))
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{flags:?}: {stderr}");
        assert_eq!(stdout, "beside the script\tits package\n", "{flags:?}");
    }
}

#[test]
fn require_finds_the_scripts_own_modules_but_no_module_outside_what_is_allowed() {
    let sb = Sandbox::new();
    let secret = sb.path("secret");
    std::fs::create_dir_all(&secret).unwrap();
    std::fs::write(secret.join("hidden.lua"), "return 'TOP SECRET'").unwrap();
    let app = sb.path("app");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(app.join("helper.lua"), "return 'helped'").unwrap();
    std::fs::write(app.join(".env"), "KEY = \"sk-secret\"").unwrap();
    let source = format!(
        r#"package.path = "{app}/?.lua;{secret}/?.lua;" .. package.path
print((require("helper")))
local ok, err = pcall(require, "hidden")
print(ok, tostring(err):match("needs (%-%-allow%-read=%S+)"))
ok, err = pcall(package.searchpath, "hidden", "{secret}/?.lua")
print(ok, tostring(err):match("needs (%-%-allow%-read=%S+)"))
-- A path with no `?` names any file: beside the script, only Lua files are its modules.
package.path = "{app}/.env"
ok, err = pcall(require, "anything")
print(ok, tostring(err):match("needs (%-%-allow%-read=%S+)"))
"#,
        app = app.display(),
        secret = secret.display()
    );
    let script = app.join("main.lua");
    std::fs::write(&script, source).unwrap();
    let run = sb
        .colony(&["run", "--sandbox", &script.display().to_string()])
        .ok();
    let hidden = std::fs::canonicalize(secret.join("hidden.lua")).unwrap();
    let h = hidden.display();
    assert_eq!(
        run.lines(),
        vec![
            "helped".to_string(),
            format!("false\t--allow-read={h}"),
            format!("false\t--allow-read={h}"),
            format!(
                "false\t--allow-read={}",
                std::fs::canonicalize(app.join(".env")).unwrap().display()
            ),
        ]
    );
}

#[test]
fn os_remove_and_rename_are_checked_on_the_link_not_what_it_points_to() {
    let sb = Sandbox::new();
    let allowed = sb.path("allowed");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::write(sb.path("outside.txt"), "keep").unwrap();
    // A link inside the allowed folder to a file outside it: removing the link is allowed.
    std::os::unix::fs::symlink(sb.path("outside.txt"), allowed.join("in")).unwrap();
    // A link outside to the allowed folder: removing it is not.
    std::os::unix::fs::symlink(&allowed, sb.path("out")).unwrap();
    let source = r#"
print(os.remove("allowed/in"))
local ok, err = pcall(os.remove, "out")
print(ok, tostring(err):match("needs (%-%-allow%-write=%S+)"))
"#;
    // `os` resolves against the current directory: run from the sandbox.
    let file = sb.write("script.lua", source).display().to_string();
    let flag = format!("--allow-write={}", allowed.display());
    let out = sb
        .command(&["run", &flag, &file])
        .current_dir(sb.dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let root = std::fs::canonicalize(sb.dir.path()).unwrap();
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        vec![
            "true".to_string(),
            format!("false\t--allow-write={}/out", root.display()),
        ],
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!allowed.join("in").exists() && sb.path("outside.txt").exists());
    assert!(sb.path("out").symlink_metadata().is_ok());
}

#[test]
fn fs_read_of_a_file_past_the_memory_limit_fails_before_reading_it() {
    let sb = Sandbox::new();
    let big = std::fs::File::create(sb.path("big.bin")).unwrap();
    big.set_len(64 << 20).unwrap();
    let run = sb
        .lua(
            r#"local data, err = fs.read("big.bin")
print(data, err.kind, err.message)
data, err = fs.read("/dev/zero")
print(data, err.kind, err.message)
local st = fs.stat("/dev/zero")
print(st.is_dir, st.is_file, fs.stat("big.bin").is_file)"#,
            &["--max-memory", "16M"],
        )
        .ok();
    let path = std::fs::canonicalize(sb.path("big.bin")).unwrap();
    assert_eq!(
        run.lines(),
        [
            format!(
                "nil\ttoo_large\tfs.read: {}: larger than the program's memory limit of \
                 16777216 bytes (16 MiB) (--max-memory), so it could never be held",
                path.display()
            )
            .as_str(),
            // Not "raise --max-memory": a device that never ends.
            "nil\ttoo_large\tfs.read: /dev/zero: not a regular file, and it gave more than the \
             program's memory limit of 16777216 bytes (16 MiB) without ending (a device or a \
             pipe that may never end)",
            "false\tfalse\ttrue",
        ]
    );
}

#[test]
fn sandbox_refusals_name_the_function_called_and_a_missing_path() {
    let sb = Sandbox::new();
    let other = sb.write("other.lua", "return 1");
    let run = sb
        .lua(
            &format!(
                r#"print(select(2, pcall(dofile, {:?})))
print(select(2, pcall(io.open, nil)))
print(select(2, pcall(os.tmpname)))"#,
                other.display().to_string()
            ),
            &["--sandbox"],
        )
        .ok();
    let at = sb.path("script.lua").display().to_string();
    let other = std::fs::canonicalize(&other).unwrap();
    assert_eq!(
        run.lines(),
        [
            format!(
                "{at}:1: dofile: reading {h} needs --allow-read={h}",
                h = other.display()
            ),
            format!("{at}:2: bad argument #1 to 'io.open': string expected, got nil"),
            format!("{at}:3: os.tmpname: writing /tmp needs --allow-write=/tmp"),
        ]
    );
}

/// A server a script names by URL is a host it reaches, with headers and arguments of its
/// choosing: it needs `--allow-net` as `http` does (`mcp.connect`, a turn's or a resident's
/// `mcp` list, a `dynamic_mcp` prefix). Before, a sandboxed script sent anything to any host
/// this way, and the listener below heard it.
#[test]
fn an_mcp_server_a_script_names_by_url_needs_allow_net_for_its_host() {
    let hits = Arc::new(AtomicUsize::new(0));
    let heard = hits.clone();
    let listener = support::serve(Router::new().fallback(move || {
        heard.fetch_add(1, Ordering::SeqCst);
        async { StatusCode::INTERNAL_SERVER_ERROR }
    }));
    let host = listener.trim_start_matches("http://").to_string();
    let source = format!(
        r#"
print("connect", pcall(mcp.connect, "{listener}/mcp?data=secret", {{ headers = {{ ["X-Leak"] = "1" }} }}))
print("turn", pcall(ai.take_turn, {{ prompt = "hi", mcp = {{ {{ name = "u", url = "{listener}/mcp" }} }} }}))
print("spawn", pcall(ai.spawn, {{ name = "w", mcp = {{ {{ name = "u", url = "{listener}/mcp" }} }} }}))
print("dynamic", pcall(ai.take_turn, {{ prompt = "hi", dynamic_mcp = {{ "{listener}/mcp" }} }}))
"#
    );
    let sb = Sandbox::new();
    let run = sb.lua(&source, &["--sandbox"]).ok();
    let lines = run.lines();
    let needs = format!("reaching {host} needs --allow-net={host}");
    for (line, who) in lines.iter().zip([
        "mcp.connect",
        "ai.take_turn: mcp[1]",
        "ai.spawn: mcp[1]",
        "ai.take_turn: dynamic_mcp",
    ]) {
        assert!(line.contains("\tfalse\t"), "{line}");
        assert!(line.contains(&format!("{who}: {needs}")), "{line}");
    }
    assert_eq!(lines.len(), 4, "{}", run.stdout);
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the listener was reached");

    // Allowed, the connection is tried (the listener answers 500: an error, not a refusal).
    let flag = format!("--allow-net={host}");
    let run = sb
        .lua(&format!("print(mcp.connect(\"{listener}/mcp\"))"), &[&flag])
        .ok();
    assert!(
        run.stdout.starts_with("nil\tconnect_error"),
        "{}",
        run.stdout
    );
    assert!(hits.load(Ordering::SeqCst) > 0);
}

/// A `base_url` the script sets is the script reaching that host: under `--sandbox` it needs
/// `--allow-net` for it, as `http` does. It was colony's own call, always allowed: a sandboxed
/// script sent the configured key, and whatever it liked, to a host of its choosing.
#[test]
fn a_base_url_the_script_sets_needs_allow_net_for_its_host() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("heard"));
    let url = fake.base_url("openai");
    let host = fake.url().trim_start_matches("http://").to_string();
    let source = format!(
        r#"
print("ask", pcall(ai.ask, "secret", {{ base_url = "{url}" }}))
print("turn", pcall(ai.take_turn, {{ prompt = "secret", base_url = "{url}" }}))
print("models", pcall(ai.models, {{ provider = "openai", base_url = "{url}" }}))
print("spawn", pcall(ai.spawn, {{ name = "w", base_url = "{url}" }}))
"#
    );
    let sb = Sandbox::new();
    let key = ["OPENAI_API_KEY", "sk-configured"];
    let run = sb
        .command(&[
            "run",
            "--sandbox",
            &sb.write("s.lua", &source).display().to_string(),
        ])
        .env(key[0], key[1])
        .output()
        .expect("colony runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let needs = format!("reaching {host} needs --allow-net={host}");
    for (line, who) in lines
        .iter()
        .zip(["ai.ask", "ai.take_turn", "ai.models", "ai.spawn \"w\""])
    {
        assert!(line.contains("\tfalse\t"), "{line}");
        assert!(line.contains(&format!("{who}: {needs}")), "{line}");
    }
    assert_eq!(lines.len(), 4, "{stdout}");
    assert_eq!(fake.requests().len(), 0, "the host was reached");

    // Allowed, the call is made.
    let flag = format!("--allow-net={host}");
    let run = sb
        .command(&[
            "run",
            &flag,
            &sb.write(
                "a.lua",
                &format!("print(ai.ask('hi', {{ base_url = '{url}', model = 'm' }}))"),
            )
            .display()
            .to_string(),
        ])
        .env(key[0], key[1])
        .output()
        .expect("colony runs");
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "heard\n",
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(fake.requests().len(), 1);
}

/// A port past 65535 was read as no port, granting every port of the host; a URL or a broken
/// address granted nothing without a word. Each is refused as the flag is read (status 2).
#[test]
fn an_allow_net_entry_that_is_not_a_host_is_refused_naming_it() {
    let sb = Sandbox::new();
    let file = sb.write("p.lua", "print('ran')\n").display().to_string();
    for (flag, says) in [
        (
            "--allow-net=127.0.0.1:99999",
            "the port \"99999\" is not one (1 to 65535)",
        ),
        ("--allow-net=127.0.0.1:abc", "the port \"abc\""),
        ("--allow-net=http://127.0.0.1:8080", "not a URL"),
        ("--allow-net=[::1", "without its ']'"),
    ] {
        let run = sb.colony(&["run", flag, &file]);
        assert_eq!(run.code, 2, "{flag}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(says), "{flag}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{flag}: {}", run.stdout);
    }
    let run = sb
        .colony(&[
            "run",
            "--allow-net=127.0.0.1:9999,[::1]:80,example.com",
            &file,
        ])
        .ok();
    assert_eq!(run.stdout, "ran\n");
}
