//! Running the `colony` binary the way a user does, in a clean environment: no keys, no base
//! URLs and no config file from the machine running the tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What a run printed and how it ended.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Panics with both streams unless the run succeeded.
    #[track_caller]
    pub fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "colony failed\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// Panics unless the run failed.
    #[track_caller]
    pub fn failed(self) -> Run {
        assert_ne!(
            self.code, 0,
            "colony should have failed\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    pub fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }
}

/// A scratch directory with its own config path and the environment for the binary.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

/// Variables from the outer environment that would change what colony does.
const SCRUBBED: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GROQ_API_KEY",
    "MOONSHOT_API_KEY",
    "OLLAMA_HOST",
    "ANTHROPIC_BASE_URL",
    "OPENAI_BASE_URL",
    "GEMINI_BASE_URL",
    "GROQ_BASE_URL",
    "MOONSHOT_BASE_URL",
    "OLLAMA_BASE_URL",
    "RUST_LOG",
    "RUST_BACKTRACE",
];

impl Sandbox {
    pub fn new() -> Sandbox {
        let dir = tempfile::tempdir().expect("a temp dir");
        let config = dir.path().join("config.toml");
        // Programs' state directories (`colony state`) go under the sandbox, never the machine's.
        let state = dir.path().join("state");
        Sandbox {
            env: vec![
                ("COLONY_CONFIG".into(), config.display().to_string()),
                ("XDG_STATE_HOME".into(), state.display().to_string()),
            ],
            dir,
        }
    }

    /// The `XDG_STATE_HOME` the binary sees: `colony::store::state_dir::default_under(this,
    /// script)` is a script's default state directory.
    pub fn state_home(&self) -> PathBuf {
        self.path("state")
    }

    pub fn env(mut self, k: &str, v: &str) -> Sandbox {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).expect("write a scratch file");
        p
    }

    /// `colony ARGS...` as a command in the sandbox's environment, not yet started (for a
    /// pseudo-terminal to run).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_colony"));
        cmd.args(args).current_dir(project_root());
        // As a terminal's foreground job gets it: SIGINT as its default, even when the tests
        // run as a background job of a shell (which ignores it, and colony then leaves it so).
        // Safety: `signal` is async-signal-safe, as what runs between fork and exec must be.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
        for k in SCRUBBED {
            cmd.env_remove(k);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Starts `colony ARGS...` without waiting, its output piped (for signalling it).
    pub fn spawn(&self, args: &[&str]) -> std::process::Child {
        self.command(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the colony binary starts")
    }

    /// Runs `colony ARGS...`.
    pub fn colony(&self, args: &[&str]) -> Run {
        let out = self.command(args).output().expect("the colony binary runs");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs `colony ARGS...` with `input` on its stdin (then closed).
    #[allow(dead_code)] // Not every test binary that includes this module calls it.
    pub fn colony_with_stdin(&self, args: &[&str], input: &str) -> Run {
        use std::io::Write;
        let mut child = self
            .command(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the colony binary runs");
        let mut stdin = child.stdin.take().expect("stdin");
        // A colony that ends before reading all of it closes the pipe: not the test's failure.
        let _ = stdin.write_all(input.as_bytes());
        drop(stdin);
        let out = child.wait_with_output().expect("the colony binary runs");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Writes `source` to a script file and runs it with `colony run [EXTRA...] FILE`.
    pub fn lua(&self, source: &str, extra: &[&str]) -> Run {
        let file = self.write("script.lua", source);
        let file = file.display().to_string();
        let mut args = vec!["run"];
        args.extend_from_slice(extra);
        args.push(&file);
        self.colony(&args)
    }
}

pub fn project_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}
