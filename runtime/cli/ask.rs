//! `colony ask QUESTION`: a one-shot question with use-type `helper`, answered by the Lua script
//! `scripts/ask.lua` on the public API.

use super::{Cassettes, Failure, build_core, not_blank};

/// Ask a model one question (use-type `helper` unless --use says otherwise).
///
/// The model is grounded in this machine's colony: its commands, shipped scripts and examples,
/// providers, use-types and MCP servers. When a tool cache exists (`colony tools refresh`), the
/// cached MCP tools are offered, and the model may call them (starting their servers).
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cassettes: Cassettes,
    /// The use-type whose settings answer.
    #[arg(long = "use", value_name = "USE", default_value = "helper", value_parser = not_blank)]
    use_type: String,
    /// Override the provider (e.g. anthropic, openai, gemini, groq, ollama, kimi).
    #[arg(long, value_parser = not_blank)]
    provider: Option<String>,
    /// Override the model.
    #[arg(long, value_parser = not_blank)]
    model: Option<String>,
    /// The question.
    #[arg(required = true, num_args = 1..)]
    question: Vec<String>,
}

pub fn run(args: Args, handle: &tokio::runtime::Handle) -> Result<(), Failure> {
    let question = args.question.join(" ");
    if question.trim().is_empty() {
        // Refused here, not by the script's `assert` (which printed a Lua traceback).
        return Err(Failure::input(
            "colony ask: the question is empty (colony ask QUESTION...)",
        ));
    }
    if let Some(p) = &args.provider {
        super::known_provider("colony ask", p)?;
    }
    let core = build_core(&args.cassettes, handle)?;
    let mut script_args = vec![format!("--use={}", args.use_type)];
    if let Some(p) = args.provider {
        script_args.push(format!("--provider={p}"));
    }
    if let Some(m) = args.model {
        script_args.push(format!("--model={m}"));
    }
    script_args.push("--".into());
    script_args.push(question);
    // Ctrl-C or SIGTERM ends the command as their own action would, but ends the stdio MCP
    // servers a tool call started first: in groups of their own, they ran on after colony.
    // Listened for before the script starts, so a signal is never left to its default action.
    let listening = {
        let _entered = handle.enter();
        listen()
    };
    let _signals = listening.map(|signals| handle.spawn(end_on_signal(signals)));
    let ran = crate::lua::run_source(
        core,
        "scripts/ask.lua",
        crate::shipped::script("ask")
            .expect("ask.lua is shipped")
            .source
            .as_bytes()
            .to_vec(),
        script_args,
    );
    // Ending on a signal: the script's end (its call refused, or cut) is not the command's,
    // which exits with the signal's status once its servers are ended.
    if crate::signals::ending_with().is_some() {
        loop {
            std::thread::park();
        }
    }
    ran.map_err(|e| Failure::run(e.0))
}

type Signals = (crate::signals::Sigint, tokio::signal::unix::Signal);

fn listen() -> Option<Signals> {
    use tokio::signal::unix::{SignalKind, signal};
    Some((
        crate::signals::sigint().ok()?,
        signal(SignalKind::terminate()).ok()?,
    ))
}

/// Waits for SIGINT or SIGTERM, then ends the process with 130 or 143, its MCP servers first.
async fn end_on_signal((mut int, mut term): Signals) {
    let (name, code) = tokio::select! {
        _ = int.recv() => ("SIGINT", 130),
        _ = term.recv() => ("SIGTERM", 143),
    };
    super::terminal::restore();
    super::say_failure(&format!("colony ask: interrupted ({name})"));
    // Before the servers end: the call a turn waits on then fails at once, and the turn would
    // send its next model call (paid, its answer printed) before the exit.
    crate::signals::end_with(code);
    tokio::task::spawn_blocking(move || {
        crate::mcp::server_group::end_all();
        std::process::exit(code)
    });
}
