//! Who pays for a model call that is not a resident's own step: a call a tool handler makes
//! during a resident's turn (a sub-agent tool's `ai.ask`), one a resident's source makes.
//! Without this a budget counted only the resident's own steps, and a tool
//! that called a model spent past it unseen (a user's resident with a budget of 1,000 tokens
//! spent 5,400 and was never blocked).
//!
//! The work such a call is made in runs inside [`charged_to`]; [`crate::core::Core::call_provider`],
//! the innermost step of every model call, hands what each answer used to the payer in scope
//! ([`charge`]), and asks it first whether the call may be made at all ([`refusal`]): a
//! resident over its budget is blocked from starting turns, and its sources and tools may not
//! go on spending either (a clock source asking a model each minute spent without bound). A
//! resident's own turn runs in no such scope: it counts its steps and checks its budget itself.

use std::future::Future;
use std::sync::Arc;

use crate::vocab::Usage;

/// Whoever pays for the model calls made in a scope.
pub trait Pays: Send + Sync {
    /// Counts one answer's usage, from `provider`'s `model`.
    fn charge(&self, usage: &Usage, provider: &str, model: &str);
    /// Why no model call may be made for it now (a budget spent, until when), if so.
    fn refusal(&self) -> Option<String>;
}

pub type Payer = Arc<dyn Pays>;

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
    let _ = PAYER.try_with(|payer| payer.charge(usage, provider, model));
}

/// Why the payer in scope may not pay for another model call now, if there is one and it may not.
pub fn refusal() -> Option<String> {
    PAYER.try_with(|payer| payer.refusal()).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Log(Mutex<Vec<(u64, String, String)>>);

    impl Pays for Log {
        fn charge(&self, u: &Usage, p: &str, m: &str) {
            self.0
                .lock()
                .unwrap()
                .push((u.input, p.to_string(), m.to_string()));
        }
        fn refusal(&self) -> Option<String> {
            (!self.0.lock().unwrap().is_empty()).then(|| "spent".to_string())
        }
    }

    #[tokio::test]
    async fn a_call_in_scope_is_charged_and_one_outside_is_not() {
        let seen = Arc::new(Log(Mutex::new(Vec::new())));
        let payer: Payer = seen.clone();
        let usage = Usage {
            input: 7,
            ..Usage::default()
        };
        charge(&usage, "outside", "m");
        let refused = charged_to(Some(payer), async {
            let before = refusal();
            charge(&usage, "openai", "m");
            (before, refusal())
        })
        .await;
        assert_eq!(refused, (None, Some("spent".to_string())));
        assert_eq!(refusal(), None);
        charged_to(None, async { charge(&usage, "none", "m") }).await;
        assert_eq!(*seen.0.lock().unwrap(), [(7, "openai".into(), "m".into())]);
    }
}
