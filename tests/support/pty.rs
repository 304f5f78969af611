//! Driving the `colony` binary through a pseudo-terminal (expectrl), as a person at a terminal
//! would: its stdin, stdout and stderr are the terminal, Ctrl-C is a byte the terminal turns
//! into SIGINT, and what it shows is read back as text.

use std::time::Duration;

use expectrl::process::unix::WaitStatus;
use expectrl::{Eof, Expect, Session};

use super::script::Sandbox;

/// A colony process on a terminal, with everything it has shown so far.
pub struct Pty {
    session: expectrl::session::OsSession,
    /// Everything read from the terminal, escape sequences and all.
    pub shown: String,
}

impl Pty {
    /// Starts `colony ARGS...` in `sandbox` on a fresh terminal, with `env` added.
    pub fn start(sandbox: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Pty {
        let mut cmd = sandbox.command(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut session = Session::spawn(cmd).expect("colony starts on a pty");
        // A size of its own (a fresh pty has none; colony would assume 80 x 24).
        let _ = session.get_process_mut().set_window_size(100, 40);
        // Generous: a debug binary on a loaded 2-core machine. Only a hang reaches it.
        session.set_expect_timeout(Some(Duration::from_secs(60)));
        Pty {
            session,
            shown: String::new(),
        }
    }

    /// Waits until `text` has been shown (after what earlier waits consumed).
    #[track_caller]
    pub fn expect(&mut self, text: &str) {
        match self.session.expect(text) {
            Ok(found) => {
                self.shown
                    .push_str(&String::from_utf8_lossy(found.before()));
                for m in found.matches() {
                    self.shown.push_str(&String::from_utf8_lossy(m));
                }
            }
            Err(e) => panic!(
                "the terminal never showed {text:?}: {e}\nshown so far:\n{}",
                self.shown
            ),
        }
    }

    pub fn send(&mut self, text: &str) {
        self.session.send(text).expect("write to the pty");
    }

    pub fn send_line(&mut self, text: &str) {
        self.session.send_line(text).expect("write to the pty");
    }

    /// Sends colony's process `signal` (`TERM`, `HUP`), as `kill` would.
    #[allow(dead_code)]
    pub fn signal(&mut self, signal: &str) {
        let pid = self.session.get_process().pid().as_raw() as u32;
        super::signal(pid, signal);
    }

    /// Whether the terminal edits lines (ICANON, which a line editor turns off while it waits):
    /// what a shell after colony finds. (Not ECHO: expectrl's terminal starts without it.)
    #[allow(dead_code)]
    pub fn edits_lines(&self) -> bool {
        use std::os::fd::AsRawFd;
        let fd = self.session.get_stream().as_raw_fd();
        // SAFETY: tcgetattr writes only into `modes`, which outlives the call.
        let modes = unsafe {
            let mut modes: libc::termios = std::mem::zeroed();
            assert_eq!(libc::tcgetattr(fd, &mut modes), 0, "tcgetattr of the pty");
            modes
        };
        modes.c_lflag & libc::ICANON != 0
    }

    /// Ctrl-C, as the terminal sends it.
    pub fn ctrl_c(&mut self) {
        self.send("\x03");
    }

    /// [`Pty::finish`], and whether the terminal edits lines once colony has ended.
    #[allow(dead_code)]
    #[track_caller]
    pub fn finish_with_modes(mut self) -> (i32, String, bool) {
        let (code, shown) = self.finish_here();
        let edits = self.edits_lines();
        (code, shown, edits)
    }

    /// Reads to the end of output and returns the exit code.
    #[track_caller]
    pub fn finish(mut self) -> (i32, String) {
        self.finish_here()
    }

    #[track_caller]
    fn finish_here(&mut self) -> (i32, String) {
        match self.session.expect(Eof) {
            Ok(found) => {
                self.shown
                    .push_str(&String::from_utf8_lossy(found.before()));
                for m in found.matches() {
                    self.shown.push_str(&String::from_utf8_lossy(m));
                }
            }
            Err(e) => panic!("colony did not end: {e}\nshown:\n{}", self.shown),
        }
        let process = self.session.get_process_mut();
        let status = process.wait().expect("wait for colony");
        let code = match status {
            WaitStatus::Exited(_, code) => code,
            other => panic!("colony ended by {other:?}\nshown:\n{}", self.shown),
        };
        (code, self.shown.clone())
    }
}

/// The text a terminal shows for `raw` (escape sequences removed; carriage returns as line
/// starts are left to the caller).
pub fn visible(raw: &str) -> String {
    let mut out = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            match chars.peek() {
                Some('[') => {
                    chars.next();
                    for c in chars.by_ref() {
                        if c.is_ascii_alphabetic() || c == '~' {
                            break;
                        }
                    }
                }
                Some(_) => {
                    chars.next();
                }
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}
