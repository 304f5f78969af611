//! A scripted inner step, for tests: the layers' own, the residents' and the integration tests.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use super::clock::Clock;
use super::{Infer, OnText, StepResult, lock};
use crate::providers::{Endpoint, ProviderError};
use crate::vocab::InferRequest;

/// A fake inner step answering from a queue, recording when each call came (by its clock). Once
/// the queue is empty it answers a fatal `Config` error, so a test that calls too often fails
/// loudly. Public for the residents' and the integration tests.
pub struct Scripted {
    answers: Mutex<VecDeque<StepResult>>,
    calls: Mutex<Vec<u64>>,
    clock: Arc<dyn Clock>,
}

impl Scripted {
    pub fn new(clock: Arc<dyn Clock>, answers: impl IntoIterator<Item = StepResult>) -> Scripted {
        Scripted {
            answers: Mutex::new(answers.into_iter().collect()),
            calls: Mutex::new(Vec::new()),
            clock,
        }
    }

    pub fn push(&self, answer: StepResult) {
        lock(&self.answers).push_back(answer);
    }

    /// The clock's reading at each call so far.
    pub fn calls(&self) -> Vec<u64> {
        lock(&self.calls).clone()
    }
}

impl Infer for Scripted {
    fn step<'a>(
        &'a self,
        _req: &'a InferRequest,
        _ep: &'a Endpoint,
        on_text: OnText<'a>,
    ) -> impl Future<Output = StepResult> + Send + 'a {
        lock(&self.calls).push(self.clock.now_ms());
        let answer = lock(&self.answers).pop_front().unwrap_or_else(|| {
            Err(ProviderError::Config(
                "scripted step: no answer left".into(),
            ))
        });
        if let (Some(f), Ok(inferred)) = (on_text, &answer) {
            f(&inferred.text());
        }
        async move {
            tokio::task::yield_now().await;
            answer
        }
    }
}
