//! The `http` and `fs` Lua modules, driven through the `colony` binary: requests against a small
//! server on loopback, files in the sandbox's temp dir.

mod support;

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde_json::json;
use support::script::Sandbox;

/// Starts the test server on `127.0.0.1` (a free port) on its own thread; returns its root URL.
///
/// - `/echo` answers 200 with JSON describing the request (method, path, `x-test`,
///   `content-type`, body) and an `X-Reply: yes` header;
/// - `/missing` answers 404 with a plain body;
/// - `/slow` answers after 300 ms; `/fast` at once; `/text` answers a body that is not JSON.
fn start_server() -> String {
    let app = Router::new()
        .route("/echo", any(echo))
        .route(
            "/missing",
            any(|| async { (StatusCode::NOT_FOUND, "no such thing") }),
        )
        .route(
            "/slow",
            any(|| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                "slow"
            }),
        )
        .route("/fast", any(|| async { "fast" }))
        .route("/text", any(|| async { "not json {" }));
    support::serve(app)
}

async fn echo(method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let described = json!({
        "method": method.as_str(),
        "path": uri.path(),
        "x_test": header("x-test"),
        "content_type": header("content-type"),
        "user_agent": header("user-agent"),
        "body": String::from_utf8_lossy(&body),
    });
    ([("X-Reply", "yes")], axum::Json(described)).into_response()
}

/// A port nothing listens on (bound, then released).
fn refused_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}/nothing")
}

#[test]
fn get_sends_headers_and_reads_the_response() {
    let base = start_server();
    let script = format!(
        r#"local resp, err = http.get("{base}/echo", {{ headers = {{ ["X-Test"] = "hello" }} }})
           assert(resp, tostring(err))
           print(resp.status, resp.ok, resp.headers["x-reply"], resp.headers["content-type"])
           local body = resp.json()
           print(body.method, body.path, body.x_test)
           local again = resp:json()
           print(again.method, type(resp.body))
           local m = require("http")
           print(m == http)
           -- colony's user agent (some APIs refuse a request without one); the script's wins
           print(body.user_agent:match("^colony/") ~= nil)
           print(http.get("{base}/echo", {{ headers = {{ ["User-Agent"] = "mine" }} }}).json().user_agent)
           -- bytes that are not UTF-8 are refused, not changed into U+FFFD
           print(select(2, pcall(http.get, "{base}/echo", {{ headers = {{ ["X-Test"] = "caf\xe9" }} }})))
           print(select(2, pcall(http.get, "{base}/echo?q=caf\xe9")))"#
    );
    let run = Sandbox::new().lua(&script, &[]).ok();
    let lines = run.lines();
    assert_eq!(
        lines[..6],
        [
            "200\ttrue\tyes\tapplication/json",
            "GET\t/echo\thello",
            "GET\tstring",
            "true",
            "true",
            "mine",
        ]
    );
    assert!(
        lines[6].ends_with("http.get: header \"X-Test\"'s value is not UTF-8 text"),
        "{}",
        lines[6]
    );
    assert!(
        lines[7].ends_with("http.get: the url is not UTF-8 text"),
        "{}",
        lines[7]
    );
}

#[test]
fn post_sends_json_and_a_string_body() {
    let base = start_server();
    let script = format!(
        r#"local resp = assert(http.post("{base}/echo", {{ json = {{ n = 1, tags = json.array() }} }}))
           local b = resp.json()
           print(b.method, b.content_type, b.body)
           local resp2 = assert(http.request{{ method = "put", url = "{base}/echo",
                                               body = "plain text", headers = {{ ["x-test"] = 7 }} }})
           local b2 = resp2:json()
           print(b2.method, b2.body, b2.x_test)"#
    );
    let run = Sandbox::new().lua(&script, &[]).ok();
    assert_eq!(
        run.lines(),
        [
            r#"POST	application/json	{"n":1,"tags":[]}"#,
            "PUT\tplain text\t7",
        ]
    );
}

#[test]
fn a_404_is_a_response_and_bad_json_is_nil_err() {
    let base = start_server();
    let script = format!(
        r#"local resp, err = http.get("{base}/missing")
           print(resp.status, resp.ok, resp.body, err)
           local text = assert(http.get("{base}/text"))
           local v, jerr = text.json()
           print(v, jerr.kind)"#
    );
    let run = Sandbox::new().lua(&script, &[]).ok();
    assert_eq!(
        run.lines(),
        ["404\tfalse\tno such thing\tnil", "nil\tparse_error"]
    );
}

#[test]
fn a_timeout_is_a_fetch_error() {
    let base = start_server();
    let script = format!(
        r#"local resp, err = http.request{{ url = "{base}/slow", timeout = 0.05 }}
           print(resp, err.kind)
           print(err.message)"#
    );
    let run = Sandbox::new().lua(&script, &[]).ok();
    let lines = run.lines();
    assert_eq!(lines[0], "nil\tfetch_error");
    assert!(lines[1].contains(&format!("{base}/slow")), "{}", lines[1]);
    assert!(lines[1].contains("timed out"), "{}", lines[1]);
    // 0 is a duration like any other: an immediate timeout (it was refused as not positive).
    let script = format!(
        r#"local resp, err = http.get("{base}/slow", {{ timeout = 0 }})
           print(resp, err.kind)"#
    );
    let run = Sandbox::new().lua(&script, &[]).ok();
    assert_eq!(run.lines(), ["nil\tfetch_error"]);
}

#[test]
fn a_refused_connection_is_a_fetch_error_naming_the_url_without_keys() {
    let url = refused_url();
    let script = format!(
        r#"local resp, err = http.get("{url}?key=sekrit-0123456789")
           print(resp, err.kind, tostring(err):sub(1, 12))
           print(err.message)
           local r2, e2 = http.get("not a url")
           print(r2, e2.kind)
           -- A password in the URL, and credentials under other names than key.
           local _, e3 = http.get("{with_password}?api_key=sekrit-a&access_token=sekrit-b&sig=sekrit-c&page=2")
           print(e3.message)
           print(e3.url)"#,
        with_password = url.replacen("://", "://me:sekrit-pw@", 1)
    );
    let run = Sandbox::new().lua(&script, &[]).ok();
    let lines = run.lines();
    assert_eq!(lines[0], "nil\tfetch_error\tfetch_error:");
    assert!(lines[1].contains(&url), "{}", lines[1]);
    assert!(!run.stdout.contains("sekrit"), "{}", run.stdout);
    assert_eq!(lines[2], "nil\tfetch_error");
    let redacted = format!(
        "{}?api_key=[redacted]&access_token=[redacted]&sig=[redacted]&page=2",
        url.replacen("://", "://me:[redacted]@", 1)
    );
    assert_eq!(lines[4], redacted);
    assert!(lines[3].contains(&redacted), "{}", lines[3]);
}

#[test]
fn two_coroutines_wait_at_once() {
    let base = start_server();
    let script = format!(
        r#"local a, b = ai.parallel(
             function() return http.get("{base}/slow") end,
             function() return http.get("{base}/fast") end)
           print(a.status, a.body, b.status, b.body)"#
    );
    let run = Sandbox::new().lua(&script, &[]).ok();
    assert_eq!(run.lines(), ["200\tslow\t200\tfast"]);
}

#[test]
fn a_misused_option_names_it() {
    let run = Sandbox::new()
        .lua(r#"http.get("http://127.0.0.1:1/", { timout = 1 })"#, &[])
        .failed();
    assert!(
        run.stderr.contains("http.get: unknown option \"timout\""),
        "{}",
        run.stderr
    );
    // A framing header is the client's: a short Content-Length sent the rest of the body as a
    // request of its own on the pooled connection.
    let run = Sandbox::new()
        .lua(
            r#"print(pcall(http.post, "http://127.0.0.1:1/", { body = "abcdef",
                 headers = { ["Content-Length"] = "3" } }))
               print(pcall(http.get, "http://127.0.0.1:1/", { headers = { ["transfer-encoding"] = "chunked" } }))"#,
            &[],
        )
        .ok();
    let lines = run.lines();
    assert!(
        lines[0].contains("http.post: header \"Content-Length\" is colony's to set"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("http.get: header \"transfer-encoding\" is colony's to set"),
        "{}",
        lines[1]
    );
}

#[test]
fn fs_round_trip_in_the_sandbox() {
    let sb = Sandbox::new();
    let dir = sb.path("files");
    std::fs::create_dir(&dir).unwrap();
    let dir = dir.display().to_string();
    let script = format!(
        r#"local dir = "{dir}"
           print(fs.write(dir .. "/b.txt", "hello, world"))
           print(fs.write(dir .. "/a.txt", "first"))
           print(fs.write(dir .. "/a.txt", "second"))
           print(fs.read(dir .. "/b.txt"), fs.read(dir .. "/a.txt"))
           local st = fs.stat(dir .. "/b.txt")
           print(st.size, st.is_dir, type(st.modified), st.modified > 1e9)
           print(fs.stat(dir).is_dir)
           print(table.concat(fs.list(dir), ","))
           print(fs.exists(dir .. "/a.txt"), fs.exists(dir .. "/zzz.txt"))
           local v, err = fs.read(dir .. "/zzz.txt")
           print(v, err.kind, err.message:find("zzz.txt", 1, true) ~= nil)
           local l, lerr = fs.list(dir .. "/nope")
           print(l, lerr.kind)
           print(require("fs") == fs)"#
    );
    let run = sb.lua(&script, &[]).ok();
    assert_eq!(
        run.lines(),
        [
            "true",
            "true",
            "true",
            "hello, world\tsecond",
            "12\tfalse\tnumber\ttrue",
            "true",
            "a.txt,b.txt",
            "true\tfalse",
            "nil\tnot_found\ttrue",
            "nil\tnot_found",
            "true",
        ]
    );
    // No temporary file is left beside the written ones.
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt", "b.txt"]);
}

#[test]
fn fs_write_keeps_a_symlink_and_the_file_s_mode() {
    // Renamed over, the link became a plain file and the mode the temporary file's 0644: a
    // script lost its exec bit, private notes became world-readable.
    use std::os::unix::fs::{PermissionsExt, symlink};
    let sb = Sandbox::new();
    let mode = |p: &str| std::fs::metadata(sb.path(p)).unwrap().permissions().mode() & 0o777;
    let script = sb.write("tool.sh", "#!/bin/sh\n");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).unwrap();
    let notes = sb.write("notes.txt", "old");
    std::fs::set_permissions(&notes, std::fs::Permissions::from_mode(0o600)).unwrap();
    symlink("notes.txt", sb.path("link.txt")).unwrap();
    symlink(sb.path("link.txt"), sb.path("link2.txt")).unwrap();
    let dir = sb.dir.path().display().to_string();
    for flags in [vec![], vec![format!("--allow-write={dir}")]] {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let run = sb
            .lua(
                r##"print(fs.write("tool.sh", "#!/bin/sh\necho hi\n"))
                   print(fs.write("link2.txt", "through two links"))"##,
                &flags,
            )
            .ok();
        assert_eq!(run.lines(), ["true", "true"], "{flags:?}");
        assert_eq!(mode("tool.sh"), 0o750, "{flags:?}");
        assert_eq!(mode("notes.txt"), 0o600, "{flags:?}");
        for link in ["link.txt", "link2.txt"] {
            let meta = std::fs::symlink_metadata(sb.path(link)).unwrap();
            assert!(meta.file_type().is_symlink(), "{link} {flags:?}");
        }
        assert_eq!(
            std::fs::read_to_string(sb.path("notes.txt")).unwrap(),
            "through two links"
        );
        std::fs::write(sb.path("notes.txt"), "old").unwrap();
    }
}

/// What a rename cannot keep is written in place, as a shell's `>` does: a named pipe (or a
/// device: `/dev/null`) was replaced by a plain file, and a hard link's other name kept the
/// old contents. A name near the folder's limit is written (the temporary name's suffix made
/// it too long). The owner is kept where colony may give it (checked when the tests run as
/// root, as CI does).
#[test]
fn fs_write_keeps_what_a_rename_would_replace() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let sb = Sandbox::new();
    let fifo = sb.path("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    // The reader the pipe waits for.
    let reading = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let one = sb.write("one.txt", "old");
    std::fs::hard_link(&one, sb.path("two.txt")).unwrap();
    let owned = sb.write("owned.txt", "old");
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        std::os::unix::fs::chown(&owned, Some(65534), Some(65534)).unwrap();
    }
    let long = "q".repeat(250);
    let run = sb
        .lua(
            &format!(
                r#"print(fs.write("pipe", "through the pipe"))
                   print(fs.write("one.txt", "new"))
                   print(fs.write("owned.txt", "new"))
                   print(fs.write("{long}", "long"))"#
            ),
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        ["true", "true", "true", "true"],
        "{}",
        run.stderr
    );
    assert_eq!(reading.join().unwrap(), "through the pipe");
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert_eq!(std::fs::read_to_string(sb.path("two.txt")).unwrap(), "new");
    assert_eq!(std::fs::read_to_string(sb.path(&long)).unwrap(), "long");
    if root {
        let meta = std::fs::metadata(&owned).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
    }
}

#[test]
fn a_wrong_argument_names_the_function_as_lua_s_own_do() {
    // mlua's refusal was "bad argument #1: error converting Lua nil to string": no function.
    let sb = Sandbox::new();
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            r#"for _, f in ipairs{ "fs.read", "fs.write", "fs.list", "fs.stat", "fs.exists",
                                   "fs.absolute", "json.decode", "ai.sleep", "ai.mail" } do
                 local m, n = f:match("(%w+)%.(%w+)")
                 print(select(2, pcall(_G[m][n], nil)))
               end
               print(select(2, pcall(fs.write, "x.txt", {})))"#,
            &[],
        )
        .ok();
    let line = |who: &str, n: usize, want: &str, got: &str| {
        format!("{at}:4: bad argument #{n} to '{who}': {want} expected, got {got}")
    };
    let mut expected: Vec<String> = [
        "fs.read",
        "fs.write",
        "fs.list",
        "fs.stat",
        "fs.exists",
        "fs.absolute",
        "json.decode",
    ]
    .iter()
    .map(|who| line(who, 1, "string", "nil"))
    .collect();
    expected.push(line("ai.sleep", 1, "number", "nil"));
    expected.push(line("ai.mail", 1, "table", "nil"));
    expected.push(line("fs.write", 2, "string", "table").replace(":4:", ":6:"));
    assert_eq!(run.lines(), expected, "{}", run.stderr);
}

#[test]
fn a_relative_path_resolves_against_the_scripts_folder() {
    let sb = Sandbox::new();
    sb.write("data.txt", "beside the script");
    // The binary runs in the project root (see `Sandbox::colony`), not in the sandbox.
    let run = sb
        .lua(
            r#"print(fs.read("data.txt"))
               print(fs.write("out.txt", "written"))
               print(fs.exists("data.txt"))"#,
            &[],
        )
        .ok();
    assert_eq!(run.lines(), ["beside the script", "true", "true"]);
    assert_eq!(
        std::fs::read_to_string(sb.path("out.txt")).unwrap(),
        "written"
    );
}

#[test]
fn names_keys_and_arguments_that_are_not_utf8_are_kept_as_bytes_or_refused() {
    use std::os::unix::ffi::OsStrExt;
    let sb = Sandbox::new();
    std::fs::write(
        sb.dir
            .path()
            .join(std::ffi::OsStr::from_bytes(b"bad\xff.txt")),
        "found",
    )
    .unwrap();
    let run = sb
        .lua(
            r#"
local names = assert(fs.list("."))
for _, n in ipairs(names) do
  if n:find("^bad") then print(#n, fs.read(n)) end
end
print(fs.write("nb\255.txt", "x"))
print(proc.run{ cmd = "printf", args = { "%s", "\255" } }.stdout == "\255")
print(pcall(store.set, "k\255", 1))
print(pcall(store.list, {}))
print(pcall(proc.run, { cmd = "echo", args = { "a", nil, "c" } }))
print(pcall(proc.run, { cmd = "echo", args = { x = "y" } }))
"#,
            &[],
        )
        .ok();
    let lines = run.lines();
    assert_eq!(lines[0], "8\tfound");
    assert_eq!(lines[1], "true");
    assert!(
        sb.dir
            .path()
            .join(std::ffi::OsStr::from_bytes(b"nb\xff.txt"))
            .exists()
    );
    assert_eq!(lines[2], "true");
    // Each misuse is raised at its line: `false`, then `FILE:LINE: message`.
    let raised = |line: &str, says: &str| {
        assert!(
            line.starts_with("false\t") && line.ends_with(says),
            "{line}"
        );
    };
    raised(
        lines[3],
        "store.set: the key \"k\u{fffd}\" is not UTF-8 text",
    );
    raised(
        lines[4],
        "store.list: the prefix must be a string, not table",
    );
    raised(
        lines[5],
        "proc.run: args[2] is nil: args must be a list with no holes",
    );
    raised(
        lines[6],
        "proc.run: args must be a list of strings; it has the key \"x\"",
    );
}

#[test]
fn a_wrong_option_table_or_callback_names_the_function_too() {
    let sb = Sandbox::new();
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            r#"local calls = {
  { "json.encode", json.encode, {}, "pretty" },
  { "json.array", json.array, "x" },
  { "http.get", http.get, "http://127.0.0.1:1/", "x" },
  { "http.post", http.post, "http://127.0.0.1:1/", 5 },
  { "http.request", http.request, "http://127.0.0.1:1/" },
  { "store.update", store.update, "k", 5 },
  { "term.is_tty", term.is_tty, {} },
  { "term.erase", term.erase },
  { "term.spinner", term.spinner, {} },
  { "term.render", term.render, "x", "wide" },
}
for _, c in ipairs(calls) do
  print(select(2, pcall(c[2], table.unpack(c, 3))))
end
print(select(2, pcall(proc.run, { cmd = "true", timeout = {} })))
print(select(2, pcall(proc.run, { cmd = "true", max_bytes = "x" })))"#,
            &[],
        )
        .ok();
    let line = |who: &str, n: usize, want: &str, got: &str| {
        format!("{at}:14: bad argument #{n} to '{who}': {want} expected, got {got}")
    };
    assert_eq!(
        run.lines(),
        [
            line("json.encode", 2, "table", "string"),
            line("json.array", 1, "table", "string"),
            line("http.get", 2, "table", "string"),
            line("http.post", 2, "table", "integer"),
            line("http.request", 1, "table", "string"),
            line("store.update", 2, "function", "integer"),
            line("term.is_tty", 1, "string", "table"),
            line("term.erase", 1, "string", "nil"),
            line("term.spinner", 1, "string", "table"),
            line("term.render", 2, "table", "string"),
            format!("{at}:16: proc.run: timeout must be a number"),
            format!("{at}:17: proc.run: max_bytes must be a number"),
        ],
        "{}",
        run.stderr
    );
}
