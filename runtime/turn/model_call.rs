//! One model call as both a script's `ai.ask` and a turn's step make it: the settings resolved
//! afresh, the text streamed to a callback as it arrives, and a refusal that names an
//! attachment ([`crate::files::shed`]) sent once more with that attachment shed.

use std::future::Future;

use tokio::sync::mpsc;

use crate::config::Overrides;
use crate::core::Core;
use crate::files;
use crate::infer::DynInfer;
use crate::providers::ProviderError;
use crate::vocab::{InferRequest, Inferred};

/// Calls the model with `req` through `stack`, handing each text delta to `on_text` in order
/// (the call and the callback take turns: the deltas go through a channel, so a callback that
/// itself waits runs outside the HTTP read loop). The outer `Err` is what `on_text` failed with
/// (the call is still read to its end); the inner one the provider's.
pub async fn call_model<E, F, Fut>(
    core: &Core,
    stack: &dyn DynInfer,
    overrides: &Overrides,
    req: &mut InferRequest,
    mut on_text: Option<F>,
) -> Result<Result<Inferred, ProviderError>, E>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let mut attempt = once(core, stack, overrides, req, on_text.as_mut()).await?;
    // A refusal that names an attachment: once more, with the attachment shed.
    if let Err(e) = &attempt
        && let Ok(resolved) = core.resolve(overrides)
        && files::shed::shed_named(req, e, resolved.endpoint.style, resolved.endpoint.reads)
    {
        attempt = once(core, stack, overrides, req, on_text.as_mut()).await?;
    }
    Ok(attempt)
}

async fn once<E, F, Fut>(
    core: &Core,
    stack: &dyn DynInfer,
    overrides: &Overrides,
    req: &mut InferRequest,
    on_text: Option<&mut F>,
) -> Result<Result<Inferred, ProviderError>, E>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let ep = match core.settle(overrides, req) {
        Ok(ep) => ep,
        Err(e) => return Ok(Err(e)),
    };
    let req = &*req;
    let Some(on_text) = on_text else {
        return Ok(stack.step_boxed(req, &ep, None).await);
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let call = async move {
        let mut send = move |t: &str| {
            let _ = tx.send(t.to_string());
        };
        stack.step_boxed(req, &ep, Some(&mut send)).await
    };
    let forward = async {
        while let Some(delta) = rx.recv().await {
            on_text(delta).await?;
        }
        Ok(())
    };
    let (result, forwarded) = tokio::join!(call, forward);
    forwarded?;
    Ok(result)
}
