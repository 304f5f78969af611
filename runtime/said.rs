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
