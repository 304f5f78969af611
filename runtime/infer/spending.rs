//! Who pays for a model call that is not a resident's own step: a call a tool handler makes
//! during a resident's turn (a sub-agent tool's `ai.ask`), one a resident's source makes.
//! Without this a budget counted only the resident's own steps, and a tool
//! that called a model spent past it unseen (a user's resident with a budget of 1,000 tokens
//! spent 5,400 and was never blocked).
//!
//! The work such a call is made in runs inside [`charged_to`]; [`crate::core::Core::call_provider`],
//! the innermost step of every model call, hands what each answer used to the payer in scope
//! ([`charge`]). A resident's own turn runs in no such scope: it counts its steps itself.

use std::future::Future;
use std::sync::Arc;

use crate::vocab::Usage;

/// Counts one answer's usage, from `provider`'s `model`, against whoever pays.
pub type Payer = Arc<dyn Fn(&Usage, &str, &str) + Send + Sync>;

tokio::task_local! {
    static PAYER: Payer;
}

/// Runs `work` with the model calls it makes charged to `payer` (none: as it was).
pub async fn charged_to<F: Future>(payer: Option<Payer>, work: F) -> F::Output {
    match payer {
        Some(payer) => PAYER.scope(payer, work).await,
        None => work.await,
    }
}

/// Charges `usage`, answered by `provider`'s `model`, to the payer in scope, if there is one.
pub fn charge(usage: &Usage, provider: &str, model: &str) {
    let _ = PAYER.try_with(|pay| pay(usage, provider, model));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn a_call_in_scope_is_charged_and_one_outside_is_not() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let payer: Payer = Arc::new(move |u: &Usage, p: &str, m: &str| {
            log.lock()
                .unwrap()
                .push((u.input, p.to_string(), m.to_string()));
        });
        let usage = Usage {
            input: 7,
            ..Usage::default()
        };
        charge(&usage, "outside", "m");
        charged_to(Some(payer), async { charge(&usage, "openai", "m") }).await;
        charged_to(None, async { charge(&usage, "none", "m") }).await;
        assert_eq!(*seen.lock().unwrap(), [(7, "openai".into(), "m".into())]);
    }
}
