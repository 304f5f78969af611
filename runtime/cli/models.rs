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
}

pub async fn run(args: Args, handle: &tokio::runtime::Handle) -> Result<(), Failure> {
    let core = build_core(&Cassettes::default(), handle)?;
    let resolved = core
        .resolve(&Overrides {
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
    for m in models {
        println!("{m}");
    }
    Ok(())
}
