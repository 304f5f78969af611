//! Audit lines kept no longer than the config's `[store] keep_audit` says (`"90d"`): the log
//! gains a line with every tool call, and a service that runs for months filled its disk with
//! it. While a program runs, the lines past their keep are removed at once and then every
//! hour, a batch at a time ([`crate::store::PRUNE_BATCH`]) so that the writes waiting behind
//! each wait little. Without the setting the log is kept whole, as before.
//!
//! The pruning lives as long as the program's [`super::Lifecycle`]: a script without a watch
//! (a report run from cron, say) prunes too, and its end waits for the first look.

use std::sync::Arc;
use std::time::Duration;

use super::route::Route;
use crate::core::Core;
use crate::store::Store;

/// How often a running program looks for lines past their keep.
const EVERY: Duration = Duration::from_secs(3600);

/// The most batches one look removes (ten million lines): a longer history goes at the next.
const MOST_BATCHES: u32 = 1_000;

/// How long a program that ends waits for a first look still under way.
const FIRST_LOOK_PATIENCE: Duration = Duration::from_secs(10);

/// Removes the lines of `route`'s store past their keep until the returned guard is dropped
/// (the program's end). `None` for a program without a store.
pub fn keep(route: &Route) -> Option<Pruning> {
    // Held weakly between looks: the program's end closes its store when the program lets go
    // of it, not when this task is next polled after its abort.
    let store = Arc::downgrade(route.store()?);
    let core = route.core().clone();
    let (looked, first) = tokio::sync::watch::channel(false);
    let task = core.handle().clone().spawn(async move {
        loop {
            let Some(store) = store.upgrade() else {
                looked.send_replace(true);
                return;
            };
            prune(&core, &store).await;
            drop(store);
            looked.send_replace(true);
            tokio::time::sleep(EVERY).await;
        }
    });
    Some(Pruning {
        task: task.abort_handle(),
        first,
    })
}

/// One look: the config as it is now (a keep set or changed since the start counts).
async fn prune(core: &Core, store: &Arc<dyn Store>) {
    core.refresh_config();
    let Some(keep) = core.config().keep_audit() else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let before_ms = u64::try_from(now.saturating_sub(keep).as_millis()).unwrap_or(u64::MAX);
    let mut batches = 0;
    while batches < MOST_BATCHES {
        let store = store.clone();
        match tokio::task::spawn_blocking(move || store.prune_audit(before_ms)).await {
            Ok(Ok(true)) => batches += 1,
            Ok(Ok(false)) | Err(_) => break,
            Ok(Err(e)) => {
                tracing::warn!("cannot remove audit lines older than [store] keep_audit: {e}");
                break;
            }
        }
    }
    if batches > 0 {
        tracing::info!(
            "audit lines older than [store] keep_audit ({} s) removed",
            keep.as_secs()
        );
    }
}

/// The pruning of [`keep`]; dropping it ends the pruning.
pub struct Pruning {
    task: tokio::task::AbortHandle,
    first: tokio::sync::watch::Receiver<bool>,
}

impl Pruning {
    /// Waits (a while at most) for the first look, begun with the program: a short program
    /// has its log pruned all the same, not cut off mid-way. At once when no keep is set.
    pub async fn first_look(&self, core: &Core) {
        if core.config().keep_audit().is_none() {
            return;
        }
        let mut first = self.first.clone();
        let _ = tokio::time::timeout(FIRST_LOOK_PATIENCE, first.wait_for(|done| *done)).await;
    }
}

impl Drop for Pruning {
    fn drop(&mut self) {
        self.task.abort();
    }
}
