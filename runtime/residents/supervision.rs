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
    restarts: VecDeque<Instant>,
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
    pub fn decide(&mut self, exit: &Exit, now: Instant) -> Decision {
        let wanted = matches!(
            (self.policy.restart, exit),
            (Restart::Permanent, _) | (Restart::Transient, Exit::Crashed(_))
        );
        if !wanted {
            return Decision::Done;
        }
        while let Some(&t) = self.restarts.front() {
            if now.duration_since(t) > self.policy.window {
                self.restarts.pop_front();
            } else {
                break;
            }
        }
        if self.restarts.len() as u32 >= self.policy.max_restarts {
            return Decision::Failed;
        }
        self.restarts.push_back(now);
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
    pub fn backoff(&self) -> Duration {
        let n = self.restarts.len().max(1) as u32;
        let doubled = BACKOFF_START.saturating_mul(1 << (n - 1).min(16));
        let share = self.policy.window / (self.policy.max_restarts.max(1) + 1);
        doubled.min(share)
    }

    pub fn policy(&self) -> RestartPolicy {
        self.policy
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
            waits.push(s.backoff());
            at += s.backoff();
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
        assert_eq!(s.backoff(), Duration::from_millis(100));
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
