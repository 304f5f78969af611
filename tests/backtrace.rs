//! A panic's backtrace names file:line: `COLONY_PANIC_ON_PURPOSE` makes the binary panic as it
//! starts, and with `RUST_BACKTRACE=1` its frames read `at .../runtime/cli/mod.rs:LINE:COL`.
//! (This is the test build; the same check on an installed release binary, whose line tables
//! are compressed at link time by `build.rs`, is in the README under "When things go wrong".)

use std::process::Command;

use colony::cli::PANIC_ON_PURPOSE;

#[test]
fn a_panic_on_purpose_has_a_backtrace_naming_file_and_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_colony"))
        .args(["providers"])
        .env(PANIC_ON_PURPOSE, "1")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("colony runs");
    assert!(!out.status.success(), "a panic fails the process");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("colony panics on purpose"),
        "the panic message: {stderr}"
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
}
