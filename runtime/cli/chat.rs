//! `colony chat [QUESTION]`: the multi-turn chat client, the Lua script `scripts/chat.lua` on the
//! public API. This file only parses the command line, opens the chat's state directory and hands
//! both to the script.

use std::path::PathBuf;

use super::{Cassettes, Failure, build_core};
use crate::lua::HostSetup;
use crate::store::state_dir::{self, StateDir};

/// Chat with a configured model, with tools, streaming and Markdown.
///
/// One conversation is kept per use-type in $XDG_STATE_HOME/colony/chat, so `colony chat` later continues it. With no QUESTION it is
/// interactive: /new, /use NAME, /model NAME, /tools, /attach PATH, /save FILE, /history, /help, /exit.
/// Ctrl-C cancels the reply in flight (the conversation is kept); Ctrl-C at the prompt exits.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cassettes: Cassettes,
    /// The use-type whose settings answer, and whose conversation is continued.
    #[arg(long = "use", value_name = "USE", default_value = "chat", value_parser = super::not_blank)]
    use_type: String,
    /// Override the provider (e.g. anthropic, openai, gemini, groq, ollama, kimi).
    #[arg(long, value_parser = super::not_blank)]
    provider: Option<String>,
    /// Override the model.
    #[arg(long, value_parser = super::not_blank)]
    model: Option<String>,
    /// Start a new conversation (the use-type's previous one is discarded).
    #[arg(long)]
    new: bool,
    /// Print the conversation and exit.
    #[arg(long, conflicts_with_all = ["new", "clear", "question"])]
    history: bool,
    /// Delete the conversation and exit.
    #[arg(long, conflicts_with_all = ["new", "question"])]
    clear: bool,
    /// Attach a file to the first message (repeatable).
    #[arg(long = "file", value_name = "PATH")]
    files: Vec<PathBuf>,
    /// Enable a built-in tool, kept enabled for later chats; `/tools` lists them.
    // The names are `scripts/chat.lua`'s built-ins, checked here so that a wrong one is told
    // in one line with status 2 (the script's own check ended in a traceback).
    #[arg(
        long = "tool",
        value_name = "NAME",
        value_parser = ["read_file", "list_dir", "fetch"]
    )]
    tools: Vec<String>,
    /// The question (interactive when absent).
    #[arg(num_args = 0..)]
    question: Vec<String>,
}

pub fn run(args: Args, handle: &tokio::runtime::Handle) -> Result<(), Failure> {
    let mut script_args = vec![format!("--use={}", args.use_type)];
    if let Some(p) = &args.provider {
        super::known_provider("colony chat", p)?;
    }
    if let Some(p) = args.provider {
        script_args.push(format!("--provider={p}"));
    }
    if let Some(m) = args.model {
        script_args.push(format!("--model={m}"));
    }
    for (flag, on) in [
        ("--new", args.new),
        ("--history", args.history),
        ("--clear", args.clear),
    ] {
        if on {
            script_args.push(flag.into());
        }
    }
    // Attachments travel as absolute paths: whatever reads them later need not know our cwd.
    // Checked as they will be read (a pipe, `/dev/stdin`, a file past any API's limit), so a
    // bad one is refused before anything runs.
    for file in &args.files {
        let refused = |why: &dyn std::fmt::Display| {
            Failure::input(format!("colony chat: --file {}: {why}", file.display()))
        };
        match crate::files::attachable(file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(refused(&"no such file"));
            }
            Err(e) if crate::files::TooLarge::of(&e).is_some() => {
                return Err(refused(&format_args!(
                    "{e} (`split -b 50M FILE part-` makes parts to attach)"
                )));
            }
            Err(e) => return Err(refused(&e)),
            Ok(_) => {}
        }
        let absolute = std::path::absolute(file).unwrap_or_else(|_| file.clone());
        // The script takes its arguments as text: a name that is not UTF-8 would reach it
        // changed, naming another file.
        let Some(absolute) = absolute.to_str() else {
            return Err(refused(
                &"the name is not UTF-8 (rename the file, or attach it from a script)",
            ));
        };
        script_args.push(format!("--file={absolute}"));
    }
    for tool in &args.tools {
        script_args.push(format!("--tool={tool}"));
    }
    if !args.question.is_empty() {
        let question = args.question.join(" ");
        // `colony chat --new ""` ended 0 without a word, as `colony ask ""` does not.
        if question.trim().is_empty() {
            return Err(Failure::input(
                "colony chat: the question is empty (colony chat QUESTION..., or no question \
                 for the prompt)",
            ));
        }
        script_args.push("--".into());
        script_args.push(question);
    }
    let core = build_core(&args.cassettes, handle)?;
    let state =
        StateDir::open(&chat_dir()).map_err(|e| Failure::run(format!("colony chat: {e}")))?;
    // SIGTERM and SIGHUP end the chat through its end (the terminal's modes put back, its
    // store closed), not by their default action, which left the terminal raw when they came
    // at the prompt. (Ctrl-C is the chat's own: it cancels a reply.)
    let interrupt = crate::lua::watchdog::Interrupt::default();
    let ending = handle.spawn(end_on_signals(interrupt.clone()));
    let host = HostSetup {
        store: Some(state.dyn_store()),
        interrupt: interrupt.clone(),
        ..HostSetup::default()
    };
    let source = crate::shipped::script("chat")
        .expect("chat.lua is shipped")
        .source;
    let result = crate::lua::run_source_with(
        core,
        "scripts/chat.lua",
        source.as_bytes().to_vec(),
        script_args,
        host,
    )
    .map_err(|e| Failure::run(e.0));
    ending.abort();
    drop(state);
    if let Some(why) = interrupt.abandoned_by() {
        return Err(Failure {
            message: format!("colony chat: ended by {why}"),
            code: super::run::signal_status(&why),
        });
    }
    result
}

/// How long a chat whose reply a signal cut short has to keep the exchange and end.
const KEEP_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Ends the chat at SIGTERM or SIGHUP. A reply in flight is cut short as Ctrl-C cuts it, so
/// that the chat keeps the question and what had arrived and ends itself (a one-shot
/// `colony chat "..."` under `timeout`, a closed terminal); a chat that does not within
/// [`KEEP_GRACE`], or another signal, or one at the prompt, is ended where it waits.
async fn end_on_signals(interrupt: crate::lua::watchdog::Interrupt) {
    let Some(why) = crate::signals::term_or_hangup().await else {
        return;
    };
    if interrupt.interruptible_running() {
        interrupt.end_interruptible(why);
        tokio::select! {
            _ = tokio::time::sleep(KEEP_GRACE) => {}
            _ = crate::signals::term_or_hangup() => {}
        }
    }
    interrupt.abandon(why);
}

/// Where the chats live: `<state home>/colony/chat`, one store for every use-type.
pub fn chat_dir() -> PathBuf {
    state_dir::state_home().join("colony").join("chat")
}
