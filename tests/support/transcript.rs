//! The transcript check of the durability tests (`tests/crash.rs`, `tests/cluster.rs`): a
//! persisted conversation is valid, and which mails it answered.

use std::collections::{BTreeMap, HashSet};

use colony::vocab::{Message, Part, Role};

/// Checks one conversation of mails `mail N` from `sender`: every call has exactly one result in the next message, no result
/// without a call; counts each mail's user turn once it is followed by a final reply. Returns
/// the number of results that finished (not interrupted).
pub fn check(
    name: &str,
    sender: &str,
    messages: &[Message],
    answered: &mut BTreeMap<usize, usize>,
) -> usize {
    let prefix = format!("[mail from {sender}] mail ");
    let mut finished = 0;
    let mut open_mails: Vec<usize> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        match m.role {
            Role::User => {
                if let Some(n) = m.text().strip_prefix(prefix.as_str()) {
                    open_mails.push(n.parse().unwrap());
                }
            }
            Role::Assistant => {
                let calls: Vec<String> = m.tool_calls().map(|c| c.id.clone()).collect();
                if calls.is_empty() {
                    for n in open_mails.drain(..) {
                        *answered.entry(n).or_insert(0) += 1;
                    }
                    continue;
                }
                let next = messages
                    .get(i + 1)
                    .unwrap_or_else(|| panic!("{name}: calls at the end"));
                assert_eq!(
                    next.role,
                    Role::Tool,
                    "{name}: calls without results at {i}"
                );
                let results: Vec<String> = next.tool_results().map(|r| r.call_id.clone()).collect();
                let set: HashSet<&String> = results.iter().collect();
                assert_eq!(
                    set.len(),
                    results.len(),
                    "{name}: a call answered twice at {i}"
                );
                assert_eq!(
                    calls.iter().collect::<HashSet<_>>(),
                    set,
                    "{name}: calls and results differ at {i}"
                );
                finished += next
                    .parts
                    .iter()
                    .filter(|p| matches!(p, Part::ToolResult(r) if !r.is_error))
                    .count();
            }
            Role::Tool => {
                let prev = &messages[i - 1];
                assert!(
                    prev.role == Role::Assistant && prev.tool_calls().next().is_some(),
                    "{name}: results without calls at {i}"
                );
            }
            Role::System => {}
        }
    }
    assert!(
        open_mails.is_empty(),
        "{name}: mail without an answer: {open_mails:?}"
    );
    finished
}
