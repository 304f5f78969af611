//! The price table a cost budget is counted in: per-model prices per million tokens, from the
//! config's `[prices]` and, while the config keeps to US dollars, the defaults shipped for the
//! catalogue's default models ([`DEFAULTS`], taken on [`DEFAULTS_TAKEN`]).
//!
//! ```toml
//! [prices]
//! currency = "EUR"                 # the table's currency (default USD)
//! [prices.models."gpt-4.1-mini"]    # a model, or "provider/model" to tell two apart
//! input = 0.37                      # per million input tokens
//! output = 1.48                     # per million output tokens
//! cache_read = 0.09                 # optional; the input price when absent
//! ```
//!
//! A config in another currency drops the defaults: a sum of dollars and euros means nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The currency of the shipped defaults.
pub const DEFAULT_CURRENCY: &str = "USD";

/// When the shipped prices were read from the providers' price pages. Prices change: set your
/// own in `[prices.models]` for a budget that matters.
pub const DEFAULTS_TAKEN: &str = "2025-10-01";

/// The catalogue's default models, `(model, input, output)` in US dollars per million tokens.
pub const DEFAULTS: &[(&str, f64, f64)] = &[
    ("claude-sonnet-4-5", 3.00, 15.00),
    ("gpt-4.1-mini", 0.40, 1.60),
    ("llama-3.3-70b-versatile", 0.59, 0.79),
    // Ollama runs on the user's own machine.
    ("llama3.2", 0.0, 0.0),
    ("kimi-k2-0905-preview", 0.60, 2.50),
    ("gemini-2.5-flash", 0.30, 2.50),
    ("replay", 0.0, 0.0),
];

/// One model's prices, per million tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
}

/// `[prices]` in the config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, Price>,
}

/// The highest price a table may give, per million tokens: far past any model's, and low
/// enough that a cost stays finite at any count a server is believed
/// ([`crate::vocab::Usage::MOST_REPORTED`]). `1e308` made the cost infinite, stored as null:
/// the usage went uncounted and a cost budget never blocked.
const MOST_PRICE: f64 = 1e9;

impl Prices {
    /// The table's currency.
    pub fn currency(&self) -> &str {
        self.currency.as_deref().unwrap_or(DEFAULT_CURRENCY)
    }

    /// Checks the prices are numbers a sum can use; the error names the model and field.
    pub fn validate(&self) -> Result<(), String> {
        for (model, p) in &self.models {
            let fields = [
                ("input", Some(p.input)),
                ("output", Some(p.output)),
                ("cache_read", p.cache_read),
            ];
            for (field, v) in fields {
                if let Some(v) = v
                    && !(v.is_finite() && (0.0..=MOST_PRICE).contains(&v))
                {
                    return Err(format!(
                        "[prices.models.{model:?}] {field} = {v} is not a price (0 to a billion, \
                         per million tokens)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The price of `model` from `provider`: the config's `provider/model`, then its `model`,
    /// then (in US dollars only) the shipped default.
    pub fn find(&self, provider: &str, model: &str) -> Option<Price> {
        if let Some(p) = self
            .models
            .get(&format!("{provider}/{model}"))
            .or_else(|| self.models.get(model))
        {
            return Some(p.clone());
        }
        if self.currency() != DEFAULT_CURRENCY {
            return None;
        }
        DEFAULTS
            .iter()
            .find(|(m, _, _)| *m == model)
            .map(|&(_, input, output)| Price {
                input,
                output,
                cache_read: None,
            })
    }

    /// What `usage` cost from `provider`'s `model`, or `None` when it has no price.
    pub fn cost(&self, provider: &str, model: &str, usage: &crate::vocab::Usage) -> Option<f64> {
        let p = self.find(provider, model)?;
        let per = 1_000_000.0;
        // `input` counts the tokens read from the cache too: those are priced as cache reads,
        // the rest (cache writes among them) as input.
        let cache_read = usage.cache_read.min(usage.input);
        Some(
            (usage.input - cache_read) as f64 * p.input / per
                + cache_read as f64 * p.cache_read.unwrap_or(p.input) / per
                + usage.output as f64 * p.output / per,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::Usage;

    #[test]
    fn the_config_wins_and_another_currency_drops_the_defaults() {
        let usage = Usage {
            input: 1_000_000,
            output: 500_000,
            ..Usage::default()
        };
        let mut prices = Prices::default();
        assert_eq!(
            prices.cost("openai", "gpt-4.1-mini", &usage),
            Some(0.4 + 0.8)
        );
        assert_eq!(prices.cost("openai", "unknown-model", &usage), None);
        prices.models.insert(
            "openai/gpt-4.1-mini".into(),
            Price {
                input: 1.0,
                output: 2.0,
                cache_read: None,
            },
        );
        assert_eq!(prices.cost("openai", "gpt-4.1-mini", &usage), Some(2.0));
        prices.currency = Some("EUR".into());
        assert_eq!(prices.cost("anthropic", "claude-sonnet-4-5", &usage), None);
        prices.models.insert(
            "m".into(),
            Price {
                input: -1.0,
                output: 0.0,
                cache_read: None,
            },
        );
        assert!(
            prices
                .validate()
                .unwrap_err()
                .contains("[prices.models.\"m\"] input = -1")
        );
    }

    #[test]
    fn every_catalogue_default_model_has_a_shipped_price() {
        for entry in crate::providers::catalogue::CATALOGUE {
            assert!(
                DEFAULTS.iter().any(|(m, _, _)| *m == entry.default_model),
                "{} has no default price",
                entry.default_model
            );
        }
    }
}
