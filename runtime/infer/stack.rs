//! A stack built from a host's description of its layers: what `middleware = {...}` on a route, a
//! resident or a script's own turn makes. The host gives each layer as a [`LayerSpec`], with its
//! callbacks as closures (the Lua layer's post to the VM), and where the stack's breaker keeps its
//! state; each owner's breaker has a key of its own ([`breaker_key`]), so an open breaker stays
//! open, with its probe schedule, across a restart.

use std::sync::Arc;

use super::SharedInfer;
use super::breaker::{Breaker, BreakerPolicy, BreakerStatus, BreakerStore, TransitionInfo};
use super::context::{BeforeStep, Context};
use super::retries::{Retries, RetryPolicy};

/// The key of the route's breaker: the one every resident without middleware of its own shares.
pub const ROUTE_BREAKER_KEY: &str = "ai/breaker";

/// The key of `owner`'s own breaker: a resident's name, or `script` for a script's own turns.
pub fn breaker_key(owner: &str) -> String {
    format!("{ROUTE_BREAKER_KEY}/{owner}")
}

/// Whose breaker `key` is: the owner named by [`breaker_key`], or `route` for the route's.
pub fn breaker_owner(key: &str) -> &str {
    key.strip_prefix(ROUTE_BREAKER_KEY)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or("route")
}

/// Told of each change of a breaker's state (see [`super::breaker::OnTransition`]: keep it short).
pub type TransitionHook = Arc<dyn Fn(BreakerStatus, BreakerStatus, &TransitionInfo) + Send + Sync>;

/// One layer of a stack, as a host describes it.
#[derive(Clone)]
pub enum LayerSpec {
    /// `with_retries`.
    Retries(RetryPolicy),
    /// `with_breaker`.
    Breaker {
        policy: BreakerPolicy,
        on_transition: Option<TransitionHook>,
    },
    /// `with_context`.
    Context {
        system_suffix: Option<String>,
        before_step: Option<BeforeStep>,
    },
}

/// The stack `layers` make around `inner` (the core, for a program), the first layer outermost:
/// `[context, breaker, retries]` is `Context(Breaker(Retries(inner)))`. A breaker takes up the
/// state `breakers` holds and saves its own there; without one it keeps its state in memory.
pub fn build(
    inner: SharedInfer,
    layers: &[LayerSpec],
    breakers: Option<Arc<dyn BreakerStore>>,
) -> SharedInfer {
    let mut stack = inner;
    for layer in layers.iter().rev() {
        stack = match layer {
            LayerSpec::Retries(policy) => Arc::new(Retries::new(stack).with_policy(*policy)),
            LayerSpec::Breaker {
                policy,
                on_transition,
            } => {
                let mut b = Breaker::new(stack).with_policy(*policy);
                if let Some(store) = &breakers {
                    b = b.with_store(store.clone());
                }
                if let Some(hook) = on_transition {
                    let hook = hook.clone();
                    b = b.on_transition(move |from, to, info| hook(from, to, info));
                }
                Arc::new(b)
            }
            LayerSpec::Context {
                system_suffix,
                before_step,
            } => {
                let mut c = Context::new(stack);
                if let Some(s) = system_suffix {
                    c = c.with_suffix(s.clone());
                }
                if let Some(f) = before_step {
                    c = c.with_before_step(f.clone());
                }
                Arc::new(c)
            }
        };
    }
    stack
}

#[cfg(test)]
mod tests;
