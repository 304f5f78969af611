//! The terminal's modes as colony found them, put back as it ends. A line editor (rustyline:
//! `term.readline`, `colony chat`'s prompt, the config walk's hidden key) holds the terminal raw
//! while it waits, and a program a signal ended there (`kill PID`, a closed terminal: SIGTERM,
//! SIGHUP) ended with the editor still holding it: the user's shell was left without echo or
//! line editing until `stty sane`.

use std::sync::OnceLock;

/// The modes of stdin's terminal when colony started, if stdin is one.
static FOUND: OnceLock<Option<libc::termios>> = OnceLock::new();

/// Notes the terminal's modes (once, as colony starts).
pub fn remember() {
    FOUND.get_or_init(|| {
        // SAFETY: tcgetattr writes only into `modes`, which outlives the call.
        unsafe {
            let mut modes: libc::termios = std::mem::zeroed();
            (libc::isatty(libc::STDIN_FILENO) == 1
                && libc::tcgetattr(libc::STDIN_FILENO, &mut modes) == 0)
                .then_some(modes)
        }
    });
}

/// Puts the modes noted back, if they were changed and colony is the terminal's foreground
/// job (from the background, changing them would stop colony with SIGTTOU).
pub fn restore() {
    let Some(Some(found)) = FOUND.get() else {
        return;
    };
    // SAFETY: plain calls on stdin's descriptor; tcgetattr writes only into `now`.
    unsafe {
        if libc::tcgetpgrp(libc::STDIN_FILENO) != libc::getpgrp() {
            return;
        }
        let mut now: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(libc::STDIN_FILENO, &mut now) != 0 {
            return;
        }
        let changed = now.c_lflag != found.c_lflag
            || now.c_iflag != found.c_iflag
            || now.c_oflag != found.c_oflag
            || now.c_cflag != found.c_cflag;
        if changed {
            libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, found);
            // The line editor that made it raw also asked the terminal for bracketed paste:
            // left on, every later paste into the shell came wrapped in `^[[200~`.
            if libc::isatty(libc::STDOUT_FILENO) == 1 {
                let off = b"\x1b[?2004l";
                libc::write(libc::STDOUT_FILENO, off.as_ptr().cast(), off.len());
            }
        }
    }
}

/// For a command that waits in a line editor on its own thread (the config walk): SIGTERM or
/// SIGHUP puts the terminal back and ends the process with their status (143, 129). Their
/// default action left it raw.
pub async fn give_back_on_signals() {
    let Some(why) = crate::signals::term_or_hangup().await else {
        return;
    };
    restore();
    super::say_failure(&format!("\ncolony: ended by {why}"));
    std::process::exit(super::run::signal_status(why).into());
}
