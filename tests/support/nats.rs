//! A real NATS server with JetStream for the tests, on 127.0.0.1, one per test binary.
//!
//! On first use it makes sure Debian's `nats-server` package is installed (`apt-get update`
//! once, then `apt-get install -y nats-server`; reused when the binary is already there), and
//! starts `nats-server -js` on a free loopback port with its JetStream store in a fresh
//! directory under `target/tmp/`. The server is shared by the tests of a binary and stopped
//! when the binary exits (a shell beside it waits for the binary's end of a pipe to close, then
//! stops the server and removes its directory). Anything that goes wrong panics with what was
//! run and what it said: a test never skips for want of NATS.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The running server.
pub struct Server {
    pub port: u16,
    /// The user and password it asks of a client, if any.
    login: Option<(&'static str, &'static str)>,
    _keeper: Mutex<Child>,
}

/// The user and password of [`server_with_password`].
pub const LOGIN: (&str, &str) = ("colony", "NatsPW77");

static SERVER: OnceLock<Server> = OnceLock::new();
static WITH_PASSWORD: OnceLock<Server> = OnceLock::new();

/// The shared server, started on first use.
pub fn server() -> &'static Server {
    SERVER.get_or_init(|| start(None))
}

/// A second shared server, which takes only clients that log in as [`LOGIN`].
pub fn server_with_password() -> &'static Server {
    WITH_PASSWORD.get_or_init(|| start(Some(LOGIN)))
}

impl Server {
    /// Its URL, as `--cluster` takes it (with the user and password it asks for).
    pub fn url(&self) -> String {
        match self.login {
            Some((user, pass)) => format!("nats://{user}:{pass}@127.0.0.1:{}", self.port),
            None => format!("nats://127.0.0.1:{}", self.port),
        }
    }
}

fn start(login: Option<(&'static str, &'static str)>) -> Server {
    let bin = installed();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(root).expect("target/tmp");
    remove_stale(root);
    let suffix = if login.is_some() { "-login" } else { "" };
    let dir = root.join(format!("nats-{}{suffix}", std::process::id()));
    let auth = match login {
        Some((user, pass)) => format!(" --user {user} --pass {pass}"),
        None => String::new(),
    };
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the server's directory");
    for _ in 0..3 {
        let port = free_port();
        let log = dir.join("server.log");
        let script = format!(
            "{bin} -a 127.0.0.1 -p {port} -js -sd {dir}/js{auth} >>{log} 2>&1 & pid=$!; \
             cat >/dev/null; kill -TERM $pid; wait $pid; rm -rf {dir}",
            bin = bin.display(),
            dir = dir.display(),
            log = log.display(),
        );
        let mut keeper = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start the NATS keeper shell");
        if wait_ready(port, &mut keeper) {
            return Server {
                port,
                login,
                _keeper: Mutex::new(keeper),
            };
        }
        let mut text = String::new();
        let _ = std::fs::File::open(&log).and_then(|mut f| f.read_to_string(&mut text));
        if !text.contains("address already in use") {
            panic!("nats-server did not start on 127.0.0.1:{port}; its log:\n{text}");
        }
        drop(keeper);
    }
    panic!("nats-server could not bind a free port on 127.0.0.1 after three tries");
}

/// Whether the server takes connections on `port` within 60 s (false when it exited).
fn wait_ready(port: u16, keeper: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        if let Ok(Some(_)) = keeper.try_wait() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The `nats-server` binary, installing Debian's package if missing.
fn installed() -> PathBuf {
    if let Some(bin) = find_bin() {
        return bin;
    }
    let lock_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nats-install.lock");
    std::fs::create_dir_all(lock_path.parent().unwrap()).expect("target/tmp");
    let lock = std::fs::File::create(&lock_path).expect("the install lock");
    lock.lock().expect("the install lock");
    if let Some(bin) = find_bin() {
        return bin;
    }
    for args in [&["update"][..], &["install", "-y", "nats-server"][..]] {
        let out = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .unwrap_or_else(|e| panic!("nats-server is not installed and apt-get cannot run: {e}"));
        assert!(
            out.status.success(),
            "nats-server is not installed and `apt-get {}` failed (the tests install Debian's \
             nats-server package; run them as root or install it): {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    find_bin().expect("apt-get installed nats-server but there is no /usr/bin/nats-server")
}

fn find_bin() -> Option<PathBuf> {
    ["/usr/bin/nats-server", "/usr/sbin/nats-server"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Removes the directories of servers whose test binary is gone.
fn remove_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("nats-")
            .and_then(|p| p.trim_end_matches("-login").parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A NATS server of one test's own, which the test stops and starts again on the same port,
/// with its JetStream store kept or lost (a server that came back without its disk).
pub struct Private {
    pub port: u16,
    dir: PathBuf,
    server: Option<Child>,
    runs: usize,
}

impl Private {
    pub fn start() -> Private {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(root).expect("target/tmp");
        let dir = root.join(format!(
            "nats-private-{}-{}",
            std::process::id(),
            free_port()
        ));
        let mut me = Private {
            port: free_port(),
            dir,
            server: None,
            runs: 0,
        };
        me.start_again(true);
        me
    }

    /// Its URL, as `--cluster` takes it.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server (SIGKILL: nothing it holds in memory is written out).
    pub fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
    }

    /// Starts the server on its port again: with the JetStream store it had, or, with `fresh`,
    /// an empty one.
    pub fn start_again(&mut self, fresh: bool) {
        self.stop();
        if fresh {
            self.runs += 1;
        }
        let store = self.dir.join(format!("js{}", self.runs));
        std::fs::create_dir_all(&store).expect("the server's store");
        let log = std::fs::File::create(self.dir.join("server.log")).expect("the server's log");
        let mut server = Command::new(installed())
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&store)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("nats-server starts");
        if !wait_ready(self.port, &mut server) {
            let mut text = String::new();
            let _ = std::fs::File::open(self.dir.join("server.log"))
                .and_then(|mut f| f.read_to_string(&mut text));
            panic!(
                "nats-server did not start on 127.0.0.1:{}: {text}",
                self.port
            );
        }
        self.server = Some(server);
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
