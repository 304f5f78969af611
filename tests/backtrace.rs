//! A panic's backtrace names file:line: `COLONY_PANIC_ON_PURPOSE` makes the binary panic as it
//! starts, and with `RUST_BACKTRACE=1` its frames read `at .../runtime/cli/mod.rs:LINE:COL`.
//! colony prints that short backtrace itself (`cli::panic`), cut where std's own would be.
//! (This is the test build; the same check on an installed release binary, which keeps no
//! symbol table and whose line tables are compressed at link time by `build.rs`, is
//! `benches/binary.sh`, with its `.dwo` file and without.)

use std::process::Command;

use colony::cli::PANIC_ON_PURPOSE;

fn panic_on_purpose(backtrace: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_colony"))
        .args(["providers"])
        .env(PANIC_ON_PURPOSE, "1")
        .env("RUST_BACKTRACE", backtrace)
        .output()
        .expect("colony runs");
    assert!(!out.status.success(), "a panic fails the process");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_panic_on_purpose_has_a_backtrace_naming_file_and_line() {
    let stderr = panic_on_purpose("1");
    assert!(
        stderr.contains("colony panics on purpose") && stderr.contains("stack backtrace:"),
        "the panic message and a backtrace: {stderr}"
    );
    // A frame's location (from the line tables), not the panic message's own `panicked at`
    // (which a binary without line tables prints too).
    assert!(
        stderr.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with("at ") && l.contains("runtime/cli/mod.rs:")
        }),
        "a frame at runtime/cli/mod.rs:LINE: {stderr}"
    );
    // Cut where std's short backtrace is: from the panic on, not the hook printing it.
    assert!(
        !stderr.contains("cli::panic::"),
        "the hook's own frames are left out: {stderr}"
    );
    assert!(
        stderr.contains("   0: ") && stderr.contains("RUST_BACKTRACE=full"),
        "numbered from 0, with std's note: {stderr}"
    );
}

#[test]
fn without_rust_backtrace_the_panic_says_how_to_get_one() {
    let stderr = panic_on_purpose("0");
    assert!(stderr.contains("colony panics on purpose"), "{stderr}");
    assert!(!stderr.contains("stack backtrace:"), "{stderr}");
    assert!(stderr.contains("RUST_BACKTRACE=1"), "{stderr}");
}

/// colony's report (`RUST_BACKTRACE=1`) opens as std's own does (`RUST_BACKTRACE=0`): the thread's
/// name, its id as the OS knows it, where it panicked.
#[test]
fn the_report_opens_as_std_s_own() {
    fn opening(stderr: &str) -> String {
        let line = stderr
            .lines()
            .find(|l| l.starts_with("thread "))
            .unwrap_or_else(|| panic!("a `thread ...` line: {stderr}"));
        // The id differs from run to run; its place and form do not.
        let (name, rest) = line.split_once(" (").expect("an id after the name");
        let (id, rest) = rest.split_once(") ").expect("the id closed");
        assert!(id.bytes().all(|b| b.is_ascii_digit()), "a number: {line}");
        format!("{name} (N) {rest}")
    }
    let std_s = opening(&panic_on_purpose("0"));
    assert!(
        std_s.starts_with("thread 'main' (N) panicked at runtime/cli/mod.rs:"),
        "{std_s}"
    );
    assert_eq!(opening(&panic_on_purpose("1")), std_s);
}
