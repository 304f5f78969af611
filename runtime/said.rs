//! Lines that a busy path would repeat (a mail refused, a call retried) said at most once a
//! period, with how many went unsaid: one line a mail, or a retry, filled a log in seconds.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// When a line was last said, and how many times it was not since.
#[derive(Default)]
struct Said {
    last: Option<Instant>,
    unsaid: u64,
}

impl Said {
    /// [`SaidEvery::say`] at `now`.
    fn say(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.duration_since(last) < SaidEvery::PERIOD => {
                self.unsaid += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.unsaid))
            }
        }
    }
}

/// A line said at most once a period, counting the times it was not.
pub struct SaidEvery {
    state: Mutex<Said>,
}

impl SaidEvery {
    pub const PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

    pub const fn new() -> SaidEvery {
        SaidEvery {
            state: Mutex::new(Said {
                last: None,
                unsaid: 0,
            }),
        }
    }

    /// `Some(n)` when the line is to be said now, `n` the times it was not since; `None`: not
    /// now (counted).
    pub fn say(&self) -> Option<u64> {
        lock(&self.state).say(Instant::now())
    }
}

impl Default for SaidEvery {
    fn default() -> SaidEvery {
        SaidEvery::new()
    }
}

/// [`SaidEvery`] for each of many keys (a resident's tool): one key's lines do not hide
/// another's. At most [`SaidEach::KEYS`] keys are kept; past that, those not said within the
/// period are let go, and all of them when every one was (their unsaid counts are lost, and
/// their next line is said).
#[derive(Default)]
pub struct SaidEach {
    keys: Mutex<HashMap<String, Said>>,
}

impl SaidEach {
    pub const KEYS: usize = 1024;

    pub fn new() -> SaidEach {
        SaidEach::default()
    }

    /// [`SaidEvery::say`] for `key`.
    pub fn say(&self, key: &str) -> Option<u64> {
        let mut keys = lock(&self.keys);
        let now = Instant::now();
        if let Some(said) = keys.get_mut(key) {
            return said.say(now);
        }
        if keys.len() >= Self::KEYS {
            keys.retain(|_, s| {
                s.last
                    .is_some_and(|l| now.duration_since(l) < SaidEvery::PERIOD)
            });
            if keys.len() >= Self::KEYS {
                keys.clear();
            }
        }
        keys.entry(key.to_string()).or_default().say(now)
    }
}

/// A line said once a process for each key (a name a warning is about).
pub struct SaidOnce {
    keys: Mutex<Option<HashSet<String>>>,
}

impl SaidOnce {
    pub const fn new() -> SaidOnce {
        SaidOnce {
            keys: Mutex::new(None),
        }
    }

    /// Whether `key` is new: the line about it is to be said.
    pub fn first(&self, key: &str) -> bool {
        lock(&self.keys)
            .get_or_insert_with(HashSet::new)
            .insert(key.to_string())
    }
}

impl Default for SaidOnce {
    fn default() -> SaidOnce {
        SaidOnce::new()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Says `n more since the last such line` when `n` lines went unsaid, for the end of a line.
pub fn also(unsaid: u64) -> String {
    match unsaid {
        0 => String::new(),
        n => format!(" ({n} more since the last such line)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_is_said_once_a_period_apart_from_the_others() {
        let said = SaidEach::new();
        assert_eq!(said.say("a"), Some(0));
        assert_eq!(said.say("a"), None);
        assert_eq!(said.say("a"), None);
        assert_eq!(said.say("b"), Some(0));
        assert_eq!(said.say("b"), None);
        let once = SaidOnce::new();
        assert!(once.first("a") && !once.first("a") && once.first("b"));
    }

    #[test]
    fn a_repeated_line_is_said_once_a_period_with_the_count_of_the_rest() {
        let said = SaidEvery::new();
        assert_eq!(said.say(), Some(0));
        assert_eq!(said.say(), None);
        assert_eq!(said.say(), None);
        // A period later (moved back rather than waited for).
        said.state.lock().unwrap().last = Some(std::time::Instant::now() - SaidEvery::PERIOD);
        assert_eq!(said.say(), Some(2));
    }
}
