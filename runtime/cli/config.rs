//! `colony config get|set|unset|list|test`: the per-use-type settings in the config file; with no
//! action, the walk through them ([`super::wizard`]).

use std::time::Instant;

use clap::Subcommand;

use super::{Cassettes, Failure, build_core};
use crate::config::{self, Config, FIELDS, Overrides};
use crate::core::{Ask, Core};
use crate::vocab::Message;

/// Read and change the settings of each use-type (chat, code, helper, general, ...).
///
/// With no action, walks through choosing a provider and a model for each use-type (keys from
/// the environment, or typed once and kept in the file with mode 0600), then tries each.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Option<Action>,
}

#[derive(Subcommand)]
enum Action {
    /// Print a use-type's settings, or one field of them.
    Get {
        use_type: String,
        field: Option<String>,
    },
    /// Set one field of a use-type (an empty value clears it). Fields: provider, model, key,
    /// key_env, base_url, max_tokens, temperature, timeout (seconds), max_response_bytes, tools
    /// (native, text or none), images (true or false), max_concurrent_calls.
    Set {
        use_type: String,
        field: String,
        #[arg(allow_hyphen_values = true)]
        value: String,
    },
    /// Remove one field of a use-type, or with no field the whole use-type.
    Unset {
        use_type: String,
        field: Option<String>,
    },
    /// Print the config file's path and every use-type in it.
    List,
    /// Send a one-word question with a use-type's settings and report who answered, and how fast.
    Test { use_type: String },
}

fn load() -> Result<Config, Failure> {
    Config::load().map_err(|e| Failure::input(format!("colony config: {e}")))
}

/// The file as `set` and `unset` change it: read without judging its values, so the one that
/// keeps it from loading can be mended; the result is judged before it is written.
fn load_to_change(who: &str) -> Result<(Config, config::EditLock), Failure> {
    Config::edit(&config::path()).map_err(|e| Failure::input(format!("{who}: {e}")))
}

/// `colony config unset USE FIELD` on a file that does not load (`failed` says why): the field
/// is removed from its text if it is there, and what still keeps the file from loading is said.
fn unset_in_text(use_type: &str, field: &str, failed: Failure) -> Result<(), Failure> {
    let path = config::path();
    let removed = match Config::unset_in_text(&path, use_type, field) {
        Ok(removed) => removed,
        // A file that is not TOML at all is said as it was (status 2), not as toml_edit says.
        Err(config::ConfigError::Parse { .. }) => return Err(failed),
        Err(e) => return Err(Failure::run(format!("colony config unset: {e}"))),
    };
    if !removed {
        return Err(failed);
    }
    println!("{use_type}.{field} removed from {}", path.display());
    if let Err(e) = Config::load_from(&path) {
        eprintln!("colony config unset: still to mend: {e}");
    }
    Ok(())
}

/// Refuses a change that brings a value no call could use; one that leaves the file's other
/// problems as they were is written (each can be mended in turn), and they are named.
fn check_changed(before: &Config, after: &Config, who: &str) -> Result<(), Failure> {
    let path = config::path();
    let had = before.problems();
    let (old, new): (Vec<String>, Vec<String>) =
        after.problems().into_iter().partition(|p| had.contains(p));
    if let Some(problem) = new.first() {
        return Err(Failure::input(format!(
            "{who}: {}: {problem} (nothing was written)",
            path.display()
        )));
    }
    for problem in old {
        eprintln!(
            "{who}: {}: still to mend: {problem} (colony will not load the file until then)",
            path.display()
        );
    }
    Ok(())
}

pub async fn run(args: Args, handle: &tokio::runtime::Handle) -> Result<(), Failure> {
    let Some(action) = args.action else {
        return super::wizard::run(handle).await;
    };
    match action {
        Action::Get { use_type, field } => {
            let cfg = load()?;
            let table = cfg.for_use(&use_type);
            // `COLONY_CONFIG` with a typo in it reads as an empty config: said on stderr, so
            // a script reading the value from stdout gets it as before.
            let path = config::path();
            if !path.exists() {
                super::say_failure(&format!(
                    "colony config: note: {} is not there: nothing is read from it",
                    path.display()
                ));
            }
            match field {
                Some(f) => {
                    if !FIELDS.contains(&f.as_str()) {
                        return Err(Failure::input(format!(
                            "colony config: unknown field {f:?} (fields: {})",
                            FIELDS.join(", ")
                        )));
                    }
                    println!("{}", table.field(&f).unwrap_or_default());
                }
                None => {
                    // A use-type the file does not set runs on general's settings: said above
                    // the table, as `colony config test` says it (it read as the file's own).
                    if use_type != "general" && !cfg.uses.contains_key(&use_type) {
                        println!("# {use_type} is not set in the config file: general's settings");
                    }
                    print_table(&use_type, &table)
                }
            }
            Ok(())
        }
        Action::Set {
            use_type,
            field,
            value,
        } => {
            let (before, _lock) = load_to_change("colony config set")?;
            let mut cfg = before.clone();
            cfg.set(&use_type, &field, &value)
                .map_err(|e| Failure::input(format!("colony config set: {e}")))?;
            check_changed(&before, &cfg, "colony config set")?;
            let path = config::path();
            cfg.save_to(&path)
                .map_err(|e| Failure::run(format!("colony config set: {e}")))?;
            let done = if value.is_empty() { "cleared" } else { "set" };
            println!("{use_type}.{field} {done} in {}", path.display());
            Ok(())
        }
        Action::Unset { use_type, field } => {
            let (before, _lock) = match (load_to_change("colony config unset"), &field) {
                (Ok(loaded), _) => loaded,
                // A file that does not load (a field colony does not know, `modle`): the
                // field is taken out of its text, whatever it is.
                (Err(failed), Some(f)) => return unset_in_text(&use_type, f, failed),
                (Err(failed), None) => return Err(failed),
            };
            let mut cfg = before.clone();
            let removed = cfg
                .unset(&use_type, field.as_deref())
                .map_err(|e| Failure::input(format!("colony config unset: {e}")))?;
            check_changed(&before, &cfg, "colony config unset")?;
            let what = match &field {
                Some(f) => format!("{use_type}.{f}"),
                None => format!("use-type {use_type}"),
            };
            let path = config::path();
            if !removed {
                println!("{what} was not set in {}", path.display());
                return Ok(());
            }
            cfg.save_to(&path)
                .map_err(|e| Failure::run(format!("colony config unset: {e}")))?;
            println!("{what} removed from {}", path.display());
            Ok(())
        }
        Action::List => {
            let cfg = load()?;
            let path = config::path();
            // `COLONY_CONFIG` with a typo in it reads as an empty config: said.
            let missing = if path.exists() {
                ""
            } else {
                " (not there: nothing is read from it)"
            };
            println!("# {}{missing}", path.display());
            if cfg.uses.is_empty() {
                println!(
                    "(no use-types set; `colony config set general provider anthropic` starts one)"
                );
            }
            for (name, table) in &cfg.uses {
                print_table(name, table);
            }
            Ok(())
        }
        Action::Test { use_type } => test(&use_type, handle).await,
    }
}

fn print_table(name: &str, table: &config::UseConfig) {
    // As the file writes it: a name that is not a bare key is quoted (`[use.a.b]` read as a
    // table `b` inside `a`).
    println!("[use.{}]", toml_edit::Key::new(name).display_repr());
    for f in FIELDS {
        if let Some(v) = table.field(f) {
            println!("{f} = {v}");
        }
    }
}

async fn test(use_type: &str, handle: &tokio::runtime::Handle) -> Result<(), Failure> {
    let core = build_core(&Cassettes::default(), handle)?;
    // A use-type the file does not set runs on general's settings: said, so a misspelt name is
    // not taken for one that works.
    let fallback = if core.config().uses.contains_key(use_type) {
        String::new()
    } else {
        format!(" ({use_type} is not set in the config file: these are general's settings)")
    };
    match round_trip(&core, use_type).await {
        Ok(line) => {
            println!("ok: {line}{fallback}");
            Ok(())
        }
        Err(line) => Err(Failure::run(format!(
            "colony config test {use_type}: {line}"
        ))),
    }
}

/// Sends the one-word question with `use_type`'s settings: who answered, with which model, how
/// fast and what (`Ok`), or who failed and why (`Err`).
pub async fn round_trip(core: &Core, use_type: &str) -> Result<String, String> {
    let ask = Ask {
        overrides: Overrides {
            use_type: Some(use_type.to_string()),
            max_tokens: Some(16),
            ..Default::default()
        },
        messages: vec![Message::user("Reply with the single word: ok")],
        ..Default::default()
    };
    let (req, ep) = core.prepare(ask).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let result = core.call_provider(&req, &ep, None).await;
    let ms = started.elapsed().as_millis();
    match result {
        Ok(inferred) => Ok(format!(
            "{} answered with model {} in {ms} ms: {:?}",
            ep.provider,
            inferred.model.as_deref().unwrap_or(&req.model),
            inferred.text().trim()
        )),
        Err(e) => Err(format!(
            "{} with model {} failed after {ms} ms: {e} ({})",
            ep.provider,
            req.model,
            e.kind()
        )),
    }
}
