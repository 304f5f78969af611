//! `with_context`: text added to every step's system prompt, fixed or asked for at each step.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::{Infer, OnText, StepResult, reborrow};
use crate::providers::Endpoint;
use crate::vocab::InferRequest;

/// What `before_step` is asked with: the request about to be sent.
pub type BeforeStep =
    Arc<dyn Fn(&InferRequest) -> BoxFuture<'static, Option<String>> + Send + Sync>;

/// `with_context`: adds context to every step's system prompt: a fixed `system_suffix`, and
/// whatever `before_step` answers for this step (the time, the state of a queue...). Both are
/// appended after the request's own system text, each on a paragraph of its own; the
/// conversation itself is not touched, so nothing of it is stored.
pub struct Context<I> {
    inner: I,
    system_suffix: Option<String>,
    before_step: Option<BeforeStep>,
}

impl<I: Infer> Context<I> {
    pub fn new(inner: I) -> Context<I> {
        Context {
            inner,
            system_suffix: None,
            before_step: None,
        }
    }

    pub fn with_suffix(mut self, suffix: impl Into<String>) -> Context<I> {
        self.system_suffix = Some(suffix.into());
        self
    }

    pub fn with_before_step(mut self, f: BeforeStep) -> Context<I> {
        self.before_step = Some(f);
        self
    }
}

impl<I: Infer> Infer for Context<I> {
    async fn step<'a>(
        &'a self,
        req: &'a InferRequest,
        ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> StepResult {
        let mut added: Vec<String> = self.system_suffix.iter().cloned().collect();
        if let Some(f) = &self.before_step
            && let Some(text) = f(req).await
            && !text.trim().is_empty()
        {
            added.push(text);
        }
        if added.is_empty() {
            return self.inner.step(req, ep, on_text).await;
        }
        let mut req = req.clone();
        let mut system = req.system.take().unwrap_or_default();
        for text in added {
            if !system.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(&text);
        }
        req.system = Some(system);
        let mut on_text = on_text;
        self.inner.step(&req, ep, reborrow(&mut on_text)).await
    }
}
