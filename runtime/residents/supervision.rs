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
    fn transient_and_temporary() {
        let t = Instant::now();
        let mut s = Supervisor::new(RestartPolicy::new(Restart::Transient));
        assert_eq!(s.decide(&Exit::Normal, t), Decision::Done);
        assert_eq!(s.decide(&Exit::Crashed("x".into()), t), Decision::Restart);
        let mut s = Supervisor::new(RestartPolicy::new(Restart::Temporary));
        assert_eq!(s.decide(&Exit::Crashed("x".into()), t), Decision::Done);
    }
}
