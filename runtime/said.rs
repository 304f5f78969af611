//! Lines that a busy path would repeat (a mail refused, a call retried) said at most once a
//! period, with how many went unsaid: one line a mail, or a retry, filled a log in seconds.

use std::sync::Mutex;

/// A line said at most once a period, counting the times it was not.
pub struct SaidEvery {
    state: Mutex<(Option<std::time::Instant>, u64)>,
}

impl SaidEvery {
    pub const PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

    pub const fn new() -> SaidEvery {
        SaidEvery {
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(n)` when the line is to be said now, `n` the times it was not since; `None`: not
    /// now (counted).
    pub fn say(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        match state.0 {
            Some(last) if now.duration_since(last) < Self::PERIOD => {
                state.1 += 1;
                None
            }
            _ => {
                let unsaid = std::mem::take(&mut state.1);
                state.0 = Some(now);
                Some(unsaid)
            }
        }
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
pub struct SaidEach {
    keys: Mutex<std::collections::HashMap<String, (std::time::Instant, u64)>>,
}

impl SaidEach {
    pub const KEYS: usize = 1024;

    pub fn new() -> SaidEach {
        SaidEach {
            keys: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// [`SaidEvery::say`] for `key`.
    pub fn say(&self, key: &str) -> Option<u64> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if let Some((last, unsaid)) = keys.get_mut(key) {
            if now.duration_since(*last) < SaidEvery::PERIOD {
                *unsaid += 1;
                return None;
            }
            let was = std::mem::take(unsaid);
            *last = now;
            return Some(was);
        }
        if keys.len() >= Self::KEYS {
            keys.retain(|_, (last, _)| now.duration_since(*last) < SaidEvery::PERIOD);
            if keys.len() >= Self::KEYS {
                keys.clear();
            }
        }
        keys.insert(key.to_string(), (now, 0));
        Some(0)
    }
}

impl Default for SaidEach {
    fn default() -> SaidEach {
        SaidEach::new()
    }
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
    }

    #[test]
    fn a_repeated_line_is_said_once_a_period_with_the_count_of_the_rest() {
        let said = SaidEvery::new();
        assert_eq!(said.say(), Some(0));
        assert_eq!(said.say(), None);
        assert_eq!(said.say(), None);
        // A period later (moved back rather than waited for).
        said.state.lock().unwrap().0 = Some(std::time::Instant::now() - SaidEvery::PERIOD);
        assert_eq!(said.say(), Some(2));
    }
}
