//! A real PostgreSQL server for the tests, on 127.0.0.1, one per test binary.
//!
//! On first use it makes sure Debian's `postgresql` package is installed (`apt-get update` once,
//! then `apt-get install -y postgresql`; reused when its binaries are already there), runs
//! `initdb` into a fresh directory under `target/tmp/`, and starts the server on a free loopback
//! port with its unix socket in that directory. PostgreSQL refuses to run as root, so under root
//! it runs as an unprivileged user this harness creates (`colony-pg`). Each test asks for a
//! database of its own ([`database`]); the server is shared by the tests of a binary and shut
//! down when the binary exits (a shell beside it waits for the binary's end of a pipe to close,
//! then stops the server and removes its directory). Anything that goes wrong panics with what
//! was run and what it said: a test never skips for want of PostgreSQL.

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The unprivileged user the server runs as when the tests run as root.
const USER: &str = "colony-pg";
/// The database superuser `initdb` creates (trust authentication, loopback only).
const SUPERUSER: &str = "colony";

/// The running server.
pub struct Server {
    pub port: u16,
    /// Holds the server's data directory and its unix socket.
    pub dir: PathBuf,
    bin: PathBuf,
    /// The shell that stops the server when this process's end of its stdin closes.
    _keeper: Mutex<Child>,
}

static SERVER: OnceLock<Server> = OnceLock::new();
static NEXT_DB: AtomicUsize = AtomicUsize::new(0);

/// The shared server, started on first use.
pub fn server() -> &'static Server {
    SERVER.get_or_init(start)
}

/// A fresh, empty database on the shared server: its `postgres://` URL (with a password the
/// server does not check, so tests can look for it in messages).
pub fn database() -> String {
    let server = server();
    let name = format!(
        "t{}_{}",
        std::process::id(),
        NEXT_DB.fetch_add(1, Ordering::Relaxed)
    );
    server.sql("postgres", &format!("CREATE DATABASE {name}"));
    server.url(&name)
}

impl Server {
    /// The URL of database `name`, as a user would write it (user, password, host, port).
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgres://{SUPERUSER}:sekrit-pw@127.0.0.1:{}/{name}",
            self.port
        )
    }

    /// Runs `sql` in database `db` with `psql`, panicking with its output when it fails.
    pub fn sql(&self, db: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", SUPERUSER, "-d", db, "-c", sql])
            .output()
            .unwrap_or_else(|e| panic!("cannot run psql: {e}"));
        assert!(
            out.status.success(),
            "psql -d {db} -c {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

fn start() -> Server {
    let bin = installed();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(root).expect("target/tmp");
    remove_stale(root);
    let dir = root.join(format!("postgres-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the server's directory");
    let owner = run_as();
    if let Some((uid, gid)) = owner {
        chown(&dir, uid, gid);
    }
    let data = dir.join("data");
    let out = as_owner(Command::new(bin.join("initdb")), owner)
        .arg("-D")
        .arg(&data)
        .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.join("initdb").display()));
    assert!(
        out.status.success(),
        "initdb -D {} failed: {}{}",
        data.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for _ in 0..3 {
        let port = free_port();
        let log = dir.join("server.log");
        // The keeper: starts the server, waits for our end of its stdin to close (this process
        // exited, however), then stops the server (fast shutdown) and removes its files.
        let script = format!(
            "{postgres} -D {data} -k {dir} -h 127.0.0.1 -p {port} -c max_connections=200 \
             >>{log} 2>&1 & pid=$!; cat >/dev/null; kill -INT $pid; wait $pid; rm -rf {data}",
            postgres = bin.join("postgres").display(),
            data = data.display(),
            dir = dir.display(),
            log = log.display(),
        );
        let mut keeper = as_owner(Command::new("sh"), owner)
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start the PostgreSQL keeper shell");
        if wait_ready(&bin, port, &mut keeper) {
            return Server {
                port,
                dir,
                bin,
                _keeper: Mutex::new(keeper),
            };
        }
        let mut text = String::new();
        let _ = std::fs::File::open(&log).and_then(|mut f| f.read_to_string(&mut text));
        if !text.contains("could not bind") && !text.contains("in use") {
            panic!("PostgreSQL did not start on 127.0.0.1:{port}; its log:\n{text}");
        }
        drop(keeper);
    }
    panic!("PostgreSQL could not bind a free port on 127.0.0.1 after three tries");
}

/// Whether the server answers on `port` within 60 s (false when it exited).
fn wait_ready(bin: &Path, port: u16, keeper: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let ok = Command::new(bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return true;
        }
        if let Ok(Some(_)) = keeper.try_wait() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The directory of PostgreSQL's server binaries, installing Debian's package if missing.
fn installed() -> PathBuf {
    if let Some(bin) = find_bin() {
        return bin;
    }
    // One install at a time among test binaries running together.
    let lock_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("postgres-install.lock");
    std::fs::create_dir_all(lock_path.parent().unwrap()).expect("target/tmp");
    let lock = std::fs::File::create(&lock_path).expect("the install lock");
    lock.lock().expect("the install lock");
    if let Some(bin) = find_bin() {
        return bin;
    }
    for args in [&["update"][..], &["install", "-y", "postgresql"][..]] {
        let out = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .unwrap_or_else(|e| panic!("PostgreSQL is not installed and apt-get cannot run: {e}"));
        assert!(
            out.status.success(),
            "PostgreSQL is not installed and `apt-get {}` failed (the tests install Debian's \
             postgresql package; run them as root or install it): {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    find_bin().expect("apt-get installed postgresql but no /usr/lib/postgresql/*/bin/initdb")
}

/// The newest `/usr/lib/postgresql/<version>/bin` holding `initdb` and `postgres`.
fn find_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file())
                .then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// `(uid, gid)` of the unprivileged user to run the server as, created if missing; `None` when
/// the tests do not run as root (the server then runs as the current user).
fn run_as() -> Option<(u32, u32)> {
    if id(&["-u"]) != Some(0) {
        return None;
    }
    if id(&["-u", USER]).is_none() {
        let out = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot run useradd to create {USER}: {e}"));
        // Another test binary may have created it meanwhile.
        assert!(
            out.status.success() || id(&["-u", USER]).is_some(),
            "useradd {USER} failed (PostgreSQL refuses to run as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let uid = id(&["-u", USER]).expect("the user just created");
    let gid = id(&["-g", USER]).expect("the user's group");
    Some((uid, gid))
}

fn id(args: &[&str]) -> Option<u32> {
    let out = Command::new("id").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn as_owner(mut command: Command, owner: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = owner {
        command.uid(uid).gid(gid);
    }
    command
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .unwrap_or_else(|e| panic!("cannot chown {} to {uid}:{gid}: {e}", path.display()));
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Removes the directories of servers whose test binary is gone (killed before its keeper could
/// clean up).
fn remove_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("postgres-")
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
