//! Supervision as in OTP: a child (a resident or a source) that raises *crashes*; its restart
//! policy says whether it is started again; too many restarts in a short window and it has
//! *failed*, and the rest of the program goes on without it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Whether a child is started again when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// Always: after a crash and after a normal end.
    Permanent,
    /// After a crash only.
    Transient,
    /// Never.
    Temporary,
}

impl Restart {
    pub fn parse(s: &str) -> Option<Restart> {
        match s {
            "permanent" => Some(Restart::Permanent),
            "transient" => Some(Restart::Transient),
            "temporary" => Some(Restart::Temporary),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Restart::Permanent => "permanent",
            Restart::Transient => "transient",
            Restart::Temporary => "temporary",
        }
    }
}

/// A restart policy with its intensity limit: at most `max_restarts` within `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    pub restart: Restart,
    pub max_restarts: u32,
    pub window: Duration,
}

impl RestartPolicy {
    /// OTP's defaults: 3 restarts within 5 seconds.
    pub fn new(restart: Restart) -> RestartPolicy {
        RestartPolicy {
            restart,
            max_restarts: 3,
            window: Duration::from_secs(5),
        }
    }
}

/// The span over which stops for running without waiting count ([`Supervisor::decide`]).
pub const SPIN_WINDOW: Duration = Duration::from_secs(3600);

/// The wait before a first restart ([`Supervisor::backoff`]).
const BACKOFF_START: Duration = Duration::from_millis(250);

/// How a child's run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Exit {
    /// It returned.
    Normal,
    /// It raised.
    Crashed(Fault),
}

pub use crate::script::Fault;

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Restart,
    /// Done for good, not a failure (a normal end under `transient`, any end under `temporary`).
    Done,
    /// Past the intensity limit.
    Failed,
}

/// The restart history of one child.
#[derive(Debug)]
pub struct Supervisor {
    policy: RestartPolicy,
    /// Its restarts within the window, and (`true`) its stops for running without waiting
    /// within [`SPIN_WINDOW`]: one list, so that every idle resident's task is no larger.
    restarts: VecDeque<(Instant, bool)>,
    total: u32,
}

impl Supervisor {
    pub fn new(policy: RestartPolicy) -> Supervisor {
        Supervisor {
            policy,
            restarts: VecDeque::new(),
            total: 0,
        }
    }

    /// Decides after an exit at `now`.
    ///
    /// A child stopped for running without waiting ([`Fault::spun`]) has spun for the
    /// watchdog's slice (10 s) before each stop, so its stops never come `max_restarts` within
    /// the default window: it was restarted for ever, holding the program's one Lua thread
    /// nearly all the time. Those stops count within [`SPIN_WINDOW`] instead, against the same
    /// `max_restarts`.
    pub fn decide(&mut self, exit: &Exit, now: Instant) -> Decision {
        let wanted = matches!(
            (self.policy.restart, exit),
            (Restart::Permanent, _) | (Restart::Transient, Exit::Crashed(_))
        );
        if !wanted {
            return Decision::Done;
        }
        let (window, spin_window) = (self.policy.window, self.policy.window.max(SPIN_WINDOW));
        self.restarts
            .retain(|&(t, spun)| now.duration_since(t) <= if spun { spin_window } else { window });
        if self.in_window(now) >= self.policy.max_restarts {
            return Decision::Failed;
        }
        let spun = matches!(exit, Exit::Crashed(f) if f.spun);
        if spun && self.spins() >= self.policy.max_restarts {
            return Decision::Failed;
        }
        self.restarts.push_back((now, spun));
        self.total += 1;
        Decision::Restart
    }

    /// Restarts so far.
    pub fn restarts(&self) -> u32 {
        self.total
    }

    /// How long to wait before the restart just decided: 250 ms, doubling with each restart
    /// still in the window, at most the window shared out among the restarts it allows (so a
    /// child that keeps failing is past the limit within the window, as without a wait). A
    /// source whose endpoint was restarting got no chance to outlast it: with the default
    /// policy it failed for good within a millisecond; now within about 1.75 s.
    pub fn backoff(&self, now: Instant) -> Duration {
        let n = self.in_window(now).max(1);
        let doubled = BACKOFF_START.saturating_mul(1 << (n - 1).min(16));
        let share = self.policy.window / (self.policy.max_restarts.max(1) + 1);
        doubled.min(share)
    }

    pub fn policy(&self) -> RestartPolicy {
        self.policy
    }

    /// Restarts within the policy's window before `now`, of either kind.
    fn in_window(&self, now: Instant) -> u32 {
        self.restarts
            .iter()
            .filter(|(t, _)| now.duration_since(*t) <= self.policy.window)
            .count() as u32
    }

    /// Stops for running without waiting still counted.
    fn spins(&self) -> u32 {
        self.restarts.iter().filter(|(_, spun)| *spun).count() as u32
    }

    /// Why it failed, once [`Supervisor::decide`] said so: "at most 3 restarts within 5 s".
    pub fn limit_passed(&self, exit: &Exit, now: Instant) -> String {
        let policy = self.policy;
        if matches!(exit, Exit::Crashed(f) if f.spun) && self.in_window(now) < policy.max_restarts {
            return format!(
                "stopped {} times within {} for running without waiting; at most {} restarts \
                 of such code",
                policy.max_restarts + 1,
                if policy.window > SPIN_WINDOW {
                    format!("{} s", policy.window.as_secs_f64())
                } else {
                    "an hour".to_string()
                },
                policy.max_restarts
            );
        }
        format!(
            "at most {} restarts within {} s",
            policy.max_restarts,
            policy.window.as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permanent_restarts_until_the_intensity_limit() {
        let mut s = Supervisor::new(RestartPolicy::new(Restart::Permanent));
        let t = Instant::now();
        let crash = Exit::Crashed("x".into());
        assert_eq!(s.decide(&crash, t), Decision::Restart);
        assert_eq!(s.decide(&Exit::Normal, t), Decision::Restart);
        assert_eq!(s.decide(&crash, t), Decision::Restart);
        assert_eq!(s.decide(&crash, t), Decision::Failed);
        // Outside the window the count starts again.
        let mut s = Supervisor::new(RestartPolicy::new(Restart::Permanent));
        for i in 0..10 {
            assert_eq!(
                s.decide(&crash, t + Duration::from_secs(6 * i)),
                Decision::Restart
            );
        }
    }

    #[test]
    fn restarts_wait_longer_each_time_yet_fail_within_the_window() {
        let crash = Exit::Crashed("x".into());
        let t = Instant::now();
        let mut s = Supervisor::new(RestartPolicy::new(Restart::Permanent));
        let mut waits = Vec::new();
        let mut at = t;
        while s.decide(&crash, at) == Decision::Restart {
            waits.push(s.backoff(at));
            at += s.backoff(at);
        }
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [250, 500, 1000]);
        // Failed within the window, as without the waits.
        assert!(at - t < s.policy().window);
        // Many restarts allowed in a short window: the window's share bounds the wait.
        let policy = RestartPolicy {
            max_restarts: 9,
            window: Duration::from_secs(1),
            ..RestartPolicy::new(Restart::Permanent)
        };
        let mut s = Supervisor::new(policy);
        for _ in 0..5 {
            assert_eq!(s.decide(&crash, t), Decision::Restart);
        }
        assert_eq!(s.backoff(t), Duration::from_millis(100));
    }

    #[test]
    fn stops_for_spinning_count_within_an_hour() {
        let spun = Exit::Crashed(Fault {
            spun: true,
            ..Fault::from("deadline")
        });
        let t = Instant::now();
        // 10 s apart, as the watchdog stops them: never 3 within the default 5 s window.
        let mut s = Supervisor::new(RestartPolicy::new(Restart::Permanent));
        let at = |i: u64| t + Duration::from_secs(10 * i);
        for i in 0..3 {
            assert_eq!(s.decide(&spun, at(i)), Decision::Restart);
        }
        assert_eq!(s.decide(&spun, at(3)), Decision::Failed);
        assert_eq!(
            s.limit_passed(&spun, at(3)),
            "stopped 4 times within an hour for running without waiting; at most 3 restarts \
             of such code"
        );
        // Other crashes in between do not count as spins, and spins an hour old are forgotten.
        let crash = Exit::Crashed("x".into());
        let mut s = Supervisor::new(RestartPolicy::new(Restart::Permanent));
        for i in 0..3 {
            assert_eq!(s.decide(&spun, at(i)), Decision::Restart);
            assert_eq!(
                s.decide(&crash, at(i) + Duration::from_secs(5)),
                Decision::Restart
            );
        }
        assert_eq!(
            s.decide(&spun, at(3) + SPIN_WINDOW - Duration::from_secs(1)),
            Decision::Restart
        );
        assert_eq!(
            s.limit_passed(&crash, at(3)),
            "at most 3 restarts within 5 s"
        );
    }

    #[test]
    fn transient_and_temporary() {
        let t = Instant::now();
        let mut s = Supervisor::new(RestartPolicy::new(Restart::Transient));
        assert_eq!(s.decide(&Exit::Normal, t), Decision::Done);
        assert_eq!(s.decide(&Exit::Crashed("x".into()), t), Decision::Restart);
        let mut s = Supervisor::new(RestartPolicy::new(Restart::Temporary));
        assert_eq!(s.decide(&Exit::Crashed("x".into()), t), Decision::Done);
    }
}
