//! Which caller opened each `/mcp` session. A session answers only the caller that opened it:
//! MCP's security practices bind a session to its user, so that a caller who learns another's
//! session id (from a log, a proxy, a shared trace) can neither call tools on it, nor resume its
//! streams (with their progress and results), nor end it. rmcp's sessions know no caller.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The header that names a session.
pub const SESSION_HEADER: &str = "mcp-session-id";

/// How long an entry unused is kept: rmcp ends a session idle for 5 minutes, so an entry idle
/// for longer names a session that is gone.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

/// Past this many entries, those unused for [`FORGET_AFTER`] are dropped when one is added.
const PRUNE_PAST: usize = 1024;

/// The most sessions one caller may hold open at once (used within rmcp's five idle minutes).
/// Each holds about 70 KB until it is deleted or idles out: ten thousand `initialize`s from one
/// loopback process took the service from 55 MB to 770 MB.
pub const MOST_PER_CALLER: usize = 256;

/// How long rmcp keeps a session nobody uses.
const IDLE: Duration = Duration::from_secs(5 * 60);

/// What a request on a session is to the gate.
#[derive(Debug, PartialEq, Eq)]
pub enum Standing {
    /// The caller opened it.
    Own,
    /// Another caller opened it.
    Foreign,
    /// No session of that id is open (it ended, or never was).
    Unknown,
}

#[derive(Default)]
pub struct Owners(
    Mutex<HashMap<String, (String, Instant)>>,
    Mutex<HashMap<String, usize>>,
);

impl Owners {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds a place for a session `caller` is opening, if it holds fewer than
    /// [`MOST_PER_CALLER`] counting those being opened: requests sent at once each passed a
    /// count of the sessions already open. [`Owners::opening_ended`] gives the place back.
    pub fn reserve(&self, caller: &str) -> bool {
        let open = self.lock();
        let mut opening = self.1.lock().unwrap_or_else(|e| e.into_inner());
        let held = open
            .values()
            .filter(|(owner, used)| owner == caller && used.elapsed() < IDLE)
            .count();
        let pending = opening.entry(caller.to_string()).or_default();
        if held + *pending >= MOST_PER_CALLER {
            return false;
        }
        *pending += 1;
        true
    }

    /// The session `caller` was opening is open (recorded with [`Owners::opened`]) or was not.
    pub fn opening_ended(&self, caller: &str) {
        let mut opening = self.1.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = opening.get_mut(caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                opening.remove(caller);
            }
        }
    }

    /// `caller`'s standing on session `id`; its own is marked used.
    pub fn standing(&self, id: &str, caller: &str) -> Standing {
        match self.lock().get_mut(id) {
            Some((owner, used)) if owner == caller => {
                *used = Instant::now();
                Standing::Own
            }
            Some(_) => Standing::Foreign,
            None => Standing::Unknown,
        }
    }

    /// `caller` opened session `id`.
    pub fn opened(&self, id: &str, caller: &str) {
        let mut owners = self.lock();
        if owners.len() >= PRUNE_PAST {
            owners.retain(|_, (_, used)| used.elapsed() < FORGET_AFTER);
        }
        owners.insert(id.to_string(), (caller.to_string(), Instant::now()));
    }

    /// Session `id` ended (deleted, or found gone).
    pub fn ended(&self, id: &str) {
        self.lock().remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_its_openers_alone_until_it_ends() {
        let owners = Owners::default();
        assert_eq!(owners.standing("s1", "alice"), Standing::Unknown);
        owners.opened("s1", "alice");
        assert_eq!(owners.standing("s1", "alice"), Standing::Own);
        assert_eq!(owners.standing("s1", "bob"), Standing::Foreign);
        owners.ended("s1");
        assert_eq!(owners.standing("s1", "alice"), Standing::Unknown);
    }
}
