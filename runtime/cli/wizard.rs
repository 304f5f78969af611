//! `colony config` with no action: a walk through choosing a provider and a model for each
//! use-type, then a one-word round trip with each one chosen.
//!
//! Written in Rust beside the other `config` actions rather than as a Lua script: it edits the
//! config file, which no Lua API writes (a program should not rewrite the user's settings). The
//! model lists come from the same call `ai.models` makes.

use std::borrow::Cow;

use rustyline::completion::Completer;
use rustyline::config::Configurer;
use rustyline::error::ReadlineError;
use rustyline::highlight::{CmdKind, Highlighter};
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::Validator;
use rustyline::{ColorMode, Editor, Helper};

use super::Failure;
use crate::config::{self, Config};
use crate::core::Core;
use crate::providers::Providers;
use crate::providers::catalogue::{CATALOGUE, CatalogueEntry};

/// The use-types the walk offers, in order; others are set with `colony config set`.
const USES: &[&str] = &["general", "chat", "code", "helper"];

/// How many models of a list are numbered (a gateway may offer hundreds); any other is typed.
const SHOWN_MODELS: usize = 30;

/// Shows what is typed as blanks while `masking` (the key prompt). rustyline's own recipe; it
/// keeps a key off the screen, not out of a determined observer's reach.
struct Masking {
    masking: bool,
}

impl Highlighter for Masking {
    fn highlight<'l>(&self, line: &'l str, _pos: usize) -> Cow<'l, str> {
        if self.masking {
            Cow::Owned(" ".repeat(unicode_width::UnicodeWidthStr::width(line)))
        } else {
            Cow::Borrowed(line)
        }
    }

    fn highlight_char(&self, _line: &str, _pos: usize, kind: CmdKind) -> bool {
        self.masking && kind != CmdKind::MoveCursor
    }
}
impl Completer for Masking {
    type Candidate = String;
}
impl Hinter for Masking {
    type Hint = String;
}
impl Validator for Masking {}
impl Helper for Masking {}

/// How many answers in a row that name no provider a walk takes from input that is not a
/// terminal.
const PIPED_REFUSALS: u32 = 3;

struct Prompter(Editor<Masking, DefaultHistory>);

impl Prompter {
    fn new() -> Result<Prompter, Failure> {
        let mut ed = Editor::new().map_err(|e| Failure::run(format!("colony config: {e}")))?;
        ed.set_helper(Some(Masking { masking: false }));
        ed.set_auto_add_history(false);
        Ok(Prompter(ed))
    }

    /// One answer, trimmed. Ctrl-C or the end of input abandons the walk, nothing saved.
    fn ask(&mut self, prompt: &str) -> Result<String, Failure> {
        match self.0.readline(prompt) {
            Ok(line) => Ok(line.trim().to_string()),
            Err(ReadlineError::Interrupted | ReadlineError::Eof) => {
                Err(Failure::input("colony config: stopped; nothing was saved"))
            }
            Err(e) => Err(Failure::run(format!("colony config: {e}"))),
        }
    }

    fn ask_secret(&mut self, prompt: &str) -> Result<String, Failure> {
        if let Some(h) = self.0.helper_mut() {
            h.masking = true;
        }
        self.0.set_color_mode(ColorMode::Forced);
        let answer = self.ask(prompt);
        if let Some(h) = self.0.helper_mut() {
            h.masking = false;
        }
        self.0.set_color_mode(ColorMode::Enabled);
        answer
    }
}

fn key_status(e: &CatalogueEntry) -> String {
    if e.key_env.is_empty() || e.key_optional {
        "no key needed".into()
    } else if let Some(var) = crate::config::key_vars(e)
        .into_iter()
        .find(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
    {
        format!("{var} is set")
    } else {
        format!("{} is not set", e.key_env)
    }
}

/// Providers a person would choose (the replay provider is for tests and demos).
fn choosable() -> impl Iterator<Item = &'static CatalogueEntry> {
    CATALOGUE.iter().filter(|e| e.id != "replay")
}

pub async fn run(handle: &tokio::runtime::Handle) -> Result<(), Failure> {
    let path = config::path();
    let mut cfg = Config::load().map_err(|e| Failure::input(format!("colony config: {e}")))?;
    let read = cfg.clone();
    let mut p = Prompter::new()?;
    println!(
        "colony config: a provider and a model for each use-type, saved in {}",
        path.display()
    );
    println!("Enter keeps the value in [brackets]; \"-\" skips a use-type (what it has is kept).");
    println!();
    println!("Providers:");
    for e in choosable() {
        println!("  {:10} {:24} {}", e.id, e.name, key_status(e));
    }
    let mut chosen = Vec::new();
    // A key typed once serves every use-type that picks the same provider in this walk.
    let mut typed_keys: std::collections::HashMap<&str, String> = Default::default();
    for use_type in USES {
        println!();
        let current = cfg.uses.get(*use_type).cloned().unwrap_or_default();
        let default = current.provider.clone().unwrap_or_else(|| {
            if *use_type == "general" {
                choosable()
                    .find(|e| key_status(e).ends_with("is set"))
                    .map_or("anthropic", |e| e.id)
                    .to_string()
            } else {
                "-".into()
            }
        });
        let mut refused = 0;
        let entry = loop {
            // Piped answers (`yes | colony config`) that name no provider were asked again for
            // ever: a few in a row end the walk. A person at a terminal is asked on.
            if refused == PIPED_REFUSALS && !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                return Err(Failure::input(format!(
                    "colony config: {refused} answers in a row named no provider (the input is \
                     not a terminal); nothing was saved"
                )));
            }
            let answer = p.ask(&format!("{use_type}: provider [{default}]: "))?;
            let id = if answer.is_empty() {
                default.clone()
            } else {
                answer
            };
            if id == "-" {
                break None;
            }
            match choosable().find(|e| e.id == id) {
                Some(e) => break Some(e),
                None => {
                    refused += 1;
                    println!("  no provider {id:?}; one of the list above, or \"-\"");
                }
            }
        };
        let Some(entry) = entry else { continue };
        let mut key = None;
        let same_provider = current.provider.as_deref() == Some(entry.id);
        if !same_provider {
            // Another provider: nothing of the old one's table (its key, base URL, tools
            // level) may travel to the new one.
            cfg.uses.insert(use_type.to_string(), Default::default());
        }
        if entry.key_env.is_empty() || entry.key_optional {
        } else if key_status(entry).ends_with("is set") {
            println!(
                "  key: from {}",
                key_status(entry).trim_end_matches(" is set")
            );
        } else if same_provider && (current.key.is_some() || current.key_env.is_some()) {
            println!("  key: as the config has it");
        } else if let Some(k) = typed_keys.get(entry.id) {
            println!("  key: the one typed above for {}", entry.id);
            key = Some(k.clone());
        } else {
            let typed = p.ask_secret(&format!(
                "  key for {} (kept in the config file, mode 0600; Enter to skip): ",
                entry.id
            ))?;
            if !typed.is_empty() {
                typed_keys.insert(entry.id, typed.clone());
                key = Some(typed);
            }
        }
        cfg.set(use_type, "provider", entry.id)
            .map_err(|e| Failure::input(format!("colony config: {e}")))?;
        if let Some(k) = &key {
            cfg.set(use_type, "key", k)
                .map_err(|e| Failure::input(format!("colony config: {e}")))?;
        }
        let core = Core::new(cfg.clone(), Providers::new(None, None), handle.clone());
        let overrides = config::Overrides {
            use_type: Some(use_type.to_string()),
            ..Default::default()
        };
        let models = match core.resolve(&overrides) {
            Ok(r) => core.providers().models(&r.endpoint).await,
            Err(e) => Err(e),
        };
        let models = match models {
            Ok(list) => list,
            Err(e) => {
                println!("  (the model list could not be fetched: {e})");
                Vec::new()
            }
        };
        for (i, m) in models.iter().take(SHOWN_MODELS).enumerate() {
            println!("  {:>2}. {m}", i + 1);
        }
        if models.len() > SHOWN_MODELS {
            println!(
                "  ... and {} more (type a name)",
                models.len() - SHOWN_MODELS
            );
        }
        let default_model = current
            .model
            .clone()
            .filter(|_| same_provider)
            .unwrap_or_else(|| entry.default_model.to_string());
        let answer = p.ask(&format!(
            "{use_type}: model (a number or a name) [{default_model}]: "
        ))?;
        let model = match answer.parse::<usize>() {
            Ok(n) if n >= 1 && n <= models.len().min(SHOWN_MODELS) => models[n - 1].clone(),
            _ if answer.is_empty() => default_model,
            _ => answer,
        };
        cfg.set(use_type, "model", &model)
            .map_err(|e| Failure::input(format!("colony config: {e}")))?;
        chosen.push(use_type.to_string());
    }
    println!();
    // The walk took minutes: the file is read again, under the lock `config set` takes, and
    // only the use-types the walk changed are put in it. Saved whole, the walk's copy undid
    // a `config set` made meanwhile in another terminal.
    let failed_to = |e: config::ConfigError| Failure::run(format!("colony config: {e}"));
    let cfg = {
        let (mut now, _lock) = Config::edit(&path).map_err(failed_to)?;
        for (use_type, table) in &cfg.uses {
            if read.uses.get(use_type) != Some(table) {
                now.uses.insert(use_type.clone(), table.clone());
            }
        }
        now.save_to(&path).map_err(failed_to)?;
        // Read unchecked: the keys it holds are kept out of what the round trips print.
        now.register_secrets();
        now
    };
    println!("saved {}", path.display());
    if chosen.is_empty() {
        return Ok(());
    }
    println!("Trying each one with a one-word question:");
    let core = Core::new(cfg, Providers::new(None, None), handle.clone());
    let mut failed = 0;
    for use_type in &chosen {
        match super::config::round_trip(&core, use_type).await {
            Ok(line) => println!("  {use_type}: ok: {line}"),
            Err(line) => {
                failed += 1;
                println!("  {use_type}: failed: {line}");
            }
        }
    }
    if failed > 0 {
        return Err(Failure::run(format!(
            "colony config: {failed} of {} round trips failed (the settings are saved; `colony config test USE` tries again)",
            chosen.len()
        )));
    }
    Ok(())
}
