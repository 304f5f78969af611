//! `colony models PROVIDER`: the models an account can reach, asked over the network.

use super::{Cassettes, Failure, build_core};
use crate::config::Overrides;

/// List the models a provider offers to your key.
#[derive(clap::Args)]
pub struct Args {
    /// A provider id from `colony providers`.
    provider: String,
    /// Use this base URL instead of the provider's.
    #[arg(long)]
    base_url: Option<String>,
    /// Take the key and base URL from this use-type's table in the config (default: the first
    /// use-type set to PROVIDER, `general` first; else the provider's environment variable).
    #[arg(long = "use", value_name = "USE")]
    use_type: Option<String>,
}

pub async fn run(args: Args, handle: &tokio::runtime::Handle) -> Result<(), Failure> {
    let core = build_core(&Cassettes::default(), handle)?;
    let use_type = args
        .use_type
        .clone()
        .or_else(|| use_type_for(&core.config(), &args.provider));
    let resolved = core
        .resolve(&Overrides {
            use_type,
            provider: Some(args.provider.clone()),
            base_url: args.base_url,
            ..Default::default()
        })
        .map_err(|e| Failure::input(format!("colony models: {e}")))?;
    let models = core
        .providers()
        .models(&resolved.endpoint)
        .await
        .map_err(|e| {
            Failure::run(format!(
                "colony models {}: {} ({})",
                args.provider,
                e,
                e.kind()
            ))
        })?;
    if models.is_empty() {
        // Nothing on stdout, as a list of none; said, so it is not taken for a failure unsaid.
        eprintln!(
            "colony models {}: the provider lists no models",
            args.provider
        );
    }
    for m in models {
        println!("{m}");
    }
    Ok(())
}

/// The use-type whose table holds `provider`'s settings: `general` if it is set to that
/// provider, else the first that is. A key kept under `[use.chat]` was not found: only
/// `[use.general]` was read, and the error sent the user to put the key there.
fn use_type_for(config: &crate::config::Config, provider: &str) -> Option<String> {
    let entry = crate::providers::catalogue::find(provider)?;
    let names = |u: &crate::config::UseConfig| {
        u.provider
            .as_deref()
            .and_then(crate::providers::catalogue::find)
            .is_some_and(|e| e.id == entry.id)
    };
    if config.uses.get("general").is_some_and(names) {
        return Some("general".into());
    }
    config
        .uses
        .iter()
        .find(|(_, u)| names(u))
        .map(|(name, _)| name.clone())
}
