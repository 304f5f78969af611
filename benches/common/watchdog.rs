//! The watchdog hook's cost, side by side in one run. The hook that stops Lua code spinning past
//! its deadline (runtime/lua/watchdog.rs) is installed on a VM as it is made, unless
//! `COLONY_BENCH_NO_WATCHDOG` is set, so a bench measures both by running itself as a child
//! twice per round, once with the hook and once without, alternating so that a change in the
//! machine's load falls on both alike; each figure is the best of its rounds.
//!
//! A bench calls [`pair`] from `main` with the function that measures; in a child, that function
//! runs once and its figures go to the parent on stdout.

use std::process::Command;
use std::time::Duration;

/// Set in a child: measure once and print the figures.
const CHILD: &str = "COLONY_BENCH_WATCHDOG_CHILD";
/// What the hook reads: set, a VM is made without it.
const NO_WATCHDOG: &str = "COLONY_BENCH_NO_WATCHDOG";
const ROUNDS: usize = 5;

/// With `measure` giving figures where lower is better (times), the best of [`ROUNDS`] with the
/// hook and without, in `measure`'s order: `(with, without)`. In a child, measures, prints and
/// exits.
pub fn pair(measure: impl Fn() -> Vec<f64>) -> (Vec<f64>, Vec<f64>) {
    if std::env::var_os(CHILD).is_some() {
        let figures = measure();
        let line: Vec<String> = figures.iter().map(|f| f.to_string()).collect();
        println!("FIGURES {}", line.join(" "));
        std::process::exit(0);
    }
    let exe = std::env::current_exe().expect("the bench's own path");
    let run = |hook: bool| -> Vec<f64> {
        let mut cmd = Command::new(&exe);
        cmd.env(CHILD, "1");
        if hook {
            cmd.env_remove(NO_WATCHDOG);
        } else {
            cmd.env(NO_WATCHDOG, "1");
        }
        let out = cmd.output().expect("the bench runs itself");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "the bench's child failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("FIGURES "))
            .expect("the child's figures")
            .split_whitespace()
            .map(|f| f.parse().expect("a figure"))
            .collect()
    };
    let best = |a: Option<Vec<f64>>, b: Vec<f64>| match a {
        None => b,
        Some(a) => a.iter().zip(&b).map(|(x, y)| x.min(*y)).collect(),
    };
    let (mut with, mut without) = (None, None);
    for _ in 0..ROUNDS {
        with = Some(best(with, run(true)));
        without = Some(best(without, run(false)));
    }
    (with.unwrap_or_default(), without.unwrap_or_default())
}

/// One comparison line: the figure with the hook, without, and what the hook adds.
pub fn line(label: &str, unit: &str, with: f64, without: f64) {
    let cost = if without > 0.0 {
        (with - without) / without * 100.0
    } else {
        0.0
    };
    println!("{label:<34} {with:>9.2} {unit}  {without:>9.2} {unit}  {cost:>+7.1} %");
}

/// The header of the comparison lines.
pub fn header(what: &str) {
    println!(
        "{what}: with the watchdog hook and without, best of {ROUNDS} rounds each, alternating"
    );
    println!(
        "{:<34} {:>12}  {:>12}  {:>9}",
        "", "with hook", "without", "the hook"
    );
}

/// This process's user and system CPU time so far, all threads (`getrusage`, microseconds).
#[allow(dead_code)] // turn_step reads it; tool_roundtrip times by the wall clock
pub fn cpu() -> Duration {
    // SAFETY: getrusage writes one rusage into the zeroed value it is handed.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0, "getrusage failed");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}
