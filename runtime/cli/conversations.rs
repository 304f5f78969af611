//! `colony conversations FILE.lua list|show|export|drop|clear`: a program's persisted
//! conversations.

use clap::Subcommand;

use super::Failure;
use super::state::{Target, count};
use crate::store::SavedResident;
use crate::store::select::ProgramStore;
use crate::vocab::{Message, Part};

/// Inspect or clear a program's persisted conversations.
#[derive(clap::Args)]
#[command(
    long_about = "Inspect or clear a program's persisted conversations: each resident's \
        messages, the mail it accepted and has not served yet (its backlog, which `drop` \
        trims), and the step in flight when the program stopped.\n\n\
        Opens the program's state directory the way the program does, with its lock: while the \
        program runs this refuses, naming the process that holds it, and while this runs the \
        program cannot start."
)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// List the conversations, with their message and backlog counts.
    List,
    /// Print a conversation readably: each message by role, tool calls with their arguments,
    /// tool results; then the held mail and the step in flight, if any.
    Show {
        /// The resident's name.
        name: String,
    },
    /// Print a conversation's messages as JSONL, one neutral message (colony's own format) per
    /// line.
    Export {
        /// The resident's name.
        name: String,
    },
    /// Remove held mail (numbered as `show` lists it), keeping the conversation.
    ///
    /// The way on for a resident blocked at every start by one mail its model refuses (too
    /// large, say). The mail's id stays accepted, so the same mail sent again is not taken
    /// twice. Asks nothing; prints what it removed.
    Drop {
        /// The resident's name.
        name: String,
        /// The held mail's numbers, as `show` lists them (1 is the oldest).
        #[arg(required = true, value_name = "N")]
        mail: Vec<usize>,
    },
    /// Remove a conversation: its messages, backlog and step in flight. Asks nothing; prints
    /// what it removed.
    Clear {
        /// The resident's name.
        name: String,
    },
}

pub fn run(args: Args) -> Result<(), Failure> {
    let state = args.target.open("conversations")?;
    let store = state.dyn_store();
    let fail = |e: crate::store::StoreError| Failure::run(format!("colony conversations: {e}"));
    let load = |name: &str| -> Result<SavedResident, Failure> {
        store.load_cell(name).map_err(fail)?.ok_or_else(|| {
            Failure::run(format!(
                "colony conversations: no conversation named {name:?} in {}",
                state.place()
            ))
        })
    };
    match args.action {
        Action::List => {
            let names = store.conversations().map_err(fail)?;
            let mut rows = Vec::new();
            // One conversation that cannot be read is named in its row; the others still show.
            let mut unreadable = 0;
            for name in names {
                let shown = match store.load_cell(&name) {
                    Ok(Some(cell)) => summary(&cell),
                    Ok(None) => continue,
                    Err(e) => {
                        unreadable += 1;
                        format!("cannot be read: {e}")
                    }
                };
                rows.push((name, shown));
            }
            let width = rows
                .iter()
                .map(|(n, _)| n.chars().count())
                .max()
                .unwrap_or(0);
            for (name, summary) in rows {
                println!("{name:<width$}  {summary}");
            }
            if unreadable > 0 {
                return Err(Failure::run(format!(
                    "colony conversations: {} cannot be read; `colony conversations ... clear \
                     NAME` removes one",
                    count(unreadable, "conversation", "conversations")
                )));
            }
        }
        Action::Show { name } => {
            let cell = load(&name)?;
            for message in &cell.messages {
                for line in show_message(message) {
                    println!("{line}");
                }
            }
            if !cell.backlog.is_empty() {
                println!("held mail, not yet served:");
                for (n, mail) in cell.backlog.iter().enumerate() {
                    println!("  {}. {}", n + 1, indent(&mail.as_user_text()));
                    for file in &mail.files {
                        println!(
                            "  [attached {} ({}, ref {})]",
                            file.name,
                            file.content_type,
                            file.handle()
                        );
                    }
                }
            }
            if cell.dropped > 0 {
                println!(
                    "{} discarded during an outage, not yet reported to the model",
                    count(cell.dropped as usize, "older arrival", "older arrivals")
                );
            }
            if !cell.journal.is_empty() {
                println!("step in flight:");
                for entry in &cell.journal {
                    let status = match &entry.result {
                        None => "started",
                        Some(r) if r.is_error => "failed",
                        Some(_) => "finished",
                    };
                    println!("  {} ({}): {status}", entry.tool, entry.call_id);
                }
            }
        }
        Action::Export { name } => {
            let cell = load(&name)?;
            for message in &cell.messages {
                let line = serde_json::to_string(message)
                    .map_err(|e| Failure::run(format!("colony conversations: {e}")))?;
                println!("{line}");
            }
        }
        Action::Drop { name, mut mail } => {
            mail.sort_unstable();
            mail.dedup();
            refuse_if_leased(&state, &name, "")?;
            let cell = load(&name)?;
            let held = cell.backlog.len();
            let mut rows = Vec::new();
            for n in &mail {
                let Some(m) = n.checked_sub(1).and_then(|i| cell.backlog.get(i)) else {
                    return Err(Failure::input(format!(
                        "colony conversations: {name:?} holds {}: there is no mail {n} \
                         (`show {name}` numbers them)",
                        count(held, "mail", "mails")
                    )));
                };
                // Every backlog mail read from a store was saved as a row; one without would
                // be a store's defect, not the user's.
                let row = m.saved.ok_or_else(|| {
                    Failure::run(format!(
                        "colony conversations: held mail {n} of {name:?} has no saved row"
                    ))
                })?;
                if !rows.contains(&row) {
                    rows.push(row);
                }
            }
            // Only the rows go: the conversation and a step in flight are left as they are (a
            // rewrite of the conversation from this copy could undo a step a node of a cluster
            // committed meanwhile).
            let removed = store.drop_backlog(&name, &rows).map_err(fail)?;
            if removed < rows.len() {
                // Served or dropped between the read above and the write (a node of a cluster,
                // another drop): which ones cannot be told from the count.
                println!(
                    "dropped {removed} of the {} held mails asked for from {name}: the others \
                     were no longer held (served or dropped meanwhile)",
                    rows.len()
                );
                return Ok(());
            }
            for n in &mail {
                if let Some(m) = cell.backlog.get(n - 1) {
                    println!(
                        "dropped held mail {n} of {name}: {}",
                        first_line(&m.as_user_text())
                    );
                }
            }
        }
        Action::Clear { name } => {
            refuse_if_leased(&state, &name, "dismiss it there, or ")?;
            // A conversation that cannot be read is removed all the same: clearing it is the
            // way out for a program that cannot start with it.
            let was = match store.load_cell(&name) {
                Ok(Some(cell)) => summary(&cell),
                Ok(None) => String::new(),
                Err(e) => format!("it could not be read: {e}"),
            };
            if !store.clear_cell(&name).map_err(fail)? {
                return Err(Failure::run(format!(
                    "colony conversations: no conversation named {name:?} in {}",
                    state.place()
                )));
            }
            println!("removed conversation {name} ({was})");
        }
    }
    Ok(())
}

/// A running program's state directory is locked, so the open refused; a cluster's shared
/// store is not, and the node running the resident wrote all it held back at its next step
/// ("removed", then 989 messages of 987): a change is refused while a node holds its lease.
/// `instead` is what the user may do there meanwhile ("dismiss it there, or ").
fn refuse_if_leased(state: &ProgramStore, name: &str, instead: &str) -> Result<(), Failure> {
    let ProgramStore::Postgres(pg) = state else {
        return Ok(());
    };
    let fail = |e: crate::store::StoreError| Failure::run(format!("colony conversations: {e}"));
    let now = pg.now_ms().map_err(fail)?;
    match pg
        .leases()
        .map_err(fail)?
        .into_iter()
        .find(|l| l.name == name && l.expires_at_ms > now)
    {
        Some(lease) => Err(Failure::run(format!(
            "colony conversations: {name:?} runs on node {:?}, which would write it back: \
             {instead}stop the program on every node, first",
            lease.owner
        ))),
        None => Ok(()),
    }
}

/// The first line of a mail's text, cut at 100 characters: enough to tell which was dropped.
fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    let cut: String = line.chars().take(100).collect();
    if cut.len() < line.len() || text.lines().nth(1).is_some() {
        format!("{cut} ...")
    } else {
        cut
    }
}

/// "3 messages, 1 in backlog" (and the dropped count and the step in flight when there are any).
fn summary(cell: &SavedResident) -> String {
    let mut s = format!(
        "{}, {} in backlog",
        count(cell.messages.len(), "message", "messages"),
        cell.backlog.len()
    );
    if cell.dropped > 0 {
        s.push_str(&format!(", {} dropped", cell.dropped));
    }
    if !cell.journal.is_empty() {
        s.push_str(&format!(
            ", {} in flight",
            count(cell.journal.len(), "call", "calls")
        ));
    }
    s
}

/// Later lines of a multi-line text, indented under the first.
fn indent(text: &str) -> String {
    text.trim_end_matches('\n').replace('\n', "\n    ")
}

/// One line per part: `role: text`, `assistant calls TOOL (ID): ARGS`, `tool: TOOL (ID) returned:
/// CONTENT`.
fn show_message(message: &Message) -> Vec<String> {
    let role = message.role.as_str();
    let mut lines = Vec::new();
    for part in &message.parts {
        match part {
            Part::Text { text, .. } => lines.push(format!("{role}: {}", indent(text))),
            Part::Reasoning { text, .. } => {
                if !text.trim().is_empty() {
                    lines.push(format!("{role} (reasoning): {}", indent(text)));
                }
            }
            Part::ToolCall(call) => lines.push(format!(
                "{role} calls {} ({}): {}",
                call.name,
                call.id,
                if call.arguments.trim().is_empty() {
                    "{}"
                } else {
                    call.arguments.as_str()
                }
            )),
            Part::ToolResult(result) => lines.push(format!(
                "{role}: {} ({}) {}: {}",
                result.name,
                result.call_id,
                if result.is_error {
                    "failed"
                } else {
                    "returned"
                },
                indent(&result.content)
            )),
            Part::File(file) => lines.push(format!(
                "{role} attached {} ({}, {}, ref {}){}",
                file.name,
                file.content_type,
                crate::files::human_size(file.size),
                file.handle(),
                match &file.shed {
                    Some(reason) => format!(": shed, the provider refused it ({reason})"),
                    None => String::new(),
                }
            )),
        }
    }
    if message.parts.is_empty() {
        lines.push(format!("{role}:"));
    }
    lines
}
