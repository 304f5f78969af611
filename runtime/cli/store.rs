//! `colony store FILE.lua get|list`: a program's key-value store (`store.get/set/list` in Lua).

use clap::Subcommand;

use super::Failure;
use super::state::Target;

/// Read a program's key-value store.
#[derive(clap::Args)]
#[command(
    long_about = "Read a program's key-value store: what its Lua code keeps with `store.set`, \
        in the global space or in a workspace's own.\n\n\
        Opens the program's state directory the way the program does, with its lock: while the \
        program runs this refuses, naming the process that holds it, and while this runs the \
        program cannot start."
)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// Read the workspace's space instead of the program's global one (before FILE or after
    /// the action, either).
    #[arg(long, value_name = "WORKSPACE", global = true)]
    space: Option<String>,
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Print a key's value as (pretty) JSON; an error when there is no such key.
    Get {
        /// The key, as the program's `store.set` named it.
        key: String,
    },
    /// Print the keys, or those starting with PREFIX, one per line in byte order.
    List {
        /// Only the keys starting with this (taken literally: no wildcards).
        prefix: Option<String>,
    },
}

pub fn run(args: Args) -> Result<(), Failure> {
    let state = args.target.open("store")?;
    let store = state.dyn_store();
    let fail = |e: crate::store::StoreError| Failure::run(format!("colony store: {e}"));
    let space = args.space.unwrap_or_default();
    match args.action {
        Action::Get { key } => match store.get(&space, &key).map_err(fail)? {
            Some(value) => {
                let text = serde_json::to_string_pretty(&value)
                    .map_err(|e| Failure::run(format!("colony store: {e}")))?;
                println!("{text}");
            }
            None => {
                let where_ = if space.is_empty() {
                    "the global space".to_string()
                } else {
                    format!("workspace {space:?}")
                };
                return Err(Failure::run(format!(
                    "colony store: no key {key:?} in {where_} of {}",
                    state.place()
                )));
            }
        },
        Action::List { prefix } => {
            for key in store
                .list(&space, prefix.as_deref().unwrap_or(""))
                .map_err(fail)?
            {
                println!("{}", listed(&key));
            }
        }
    }
    Ok(())
}

/// A key as `list` prints it, one a line: as it is, unless it holds a control character (a line
/// break would make it two keys, an escape sequence would drive the terminal), then quoted with
/// the character escaped (`"two\nlines"`, `"\u{1b}[31mred"`).
fn listed(key: &str) -> std::borrow::Cow<'_, str> {
    if key.chars().any(char::is_control) {
        std::borrow::Cow::Owned(format!("{key:?}"))
    } else {
        std::borrow::Cow::Borrowed(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_with_a_control_character_is_listed_quoted_and_escaped() {
        assert_eq!(listed("plain/key é"), "plain/key é");
        assert_eq!(listed("two\nlines"), "\"two\\nlines\"");
        assert_eq!(listed("\u{1b}[31mred"), "\"\\u{1b}[31mred\"");
    }
}
