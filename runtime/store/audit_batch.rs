//! Audit lines that end close together, written in one transaction.
//!
//! A script's own turns run on the Lua thread, and each tool call's audit line was its own
//! transaction there: with fifty turns in flight the thread spent a third of its time in
//! SQLite's per-transaction work (locks, a WAL frame, the commit), one line at a time. Here a
//! line is queued and its call waits for the batch it went into; the first caller to wait lets
//! the tasks that are ready run first (they queue their lines too), then writes the batch. A
//! call still goes on only once its line is written, so what the README promises (a line
//! survives the process dying) holds; alone, a line costs one yield more than before.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::{AuditEntry, Store};

pub struct AuditBatch {
    store: Arc<dyn Store>,
    state: Mutex<State>,
    /// Held while a batch is taken and written, so batches are written in their order.
    writing: Mutex<()>,
    written: Notify,
}

struct State {
    pending: Vec<AuditEntry>,
    /// The batch that lines queued now go into.
    open: u64,
    /// The last batch written (or given up on: a failed write is logged, as a lone line's was).
    done: u64,
    /// Whether a caller has taken on writing the open batch.
    flushing: bool,
}

impl AuditBatch {
    pub fn new(store: Arc<dyn Store>) -> Arc<AuditBatch> {
        Arc::new(AuditBatch {
            store,
            state: Mutex::new(State {
                pending: Vec::new(),
                open: 1,
                done: 0,
                flushing: false,
            }),
            writing: Mutex::new(()),
            written: Notify::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `entry`; the number returned is the batch to wait for ([`AuditBatch::written`]).
    pub fn add(&self, entry: AuditEntry) -> u64 {
        let mut state = self.state();
        state.pending.push(entry);
        state.open
    }

    /// Whether batch `n` is written.
    pub fn is_written(&self, n: u64) -> bool {
        self.state().done >= n
    }

    /// Waits until batch `n` is written. The first caller to wait writes it, after one yield:
    /// the other tasks that are ready (turns whose answers came in the same wake-up) queue
    /// their lines meanwhile and share its transaction.
    pub async fn written(&self, n: u64) {
        loop {
            let notified = self.written.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let writes = {
                let mut state = self.state();
                if state.done >= n {
                    return;
                }
                !std::mem::replace(&mut state.flushing, true)
            };
            if writes {
                // Dropped during the yield (the turn was cancelled), it writes at once: a
                // queued line is never left for nobody to write.
                let writer = Flusher(self);
                tokio::task::yield_now().await;
                drop(writer);
            } else {
                notified.await;
            }
        }
    }

    /// Writes every queued line now, and tells those waiting.
    pub fn flush(&self) {
        {
            let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
            let (lines, n) = {
                let mut state = self.state();
                let lines = std::mem::take(&mut state.pending);
                let n = state.open;
                state.open += 1;
                (lines, n)
            };
            if !lines.is_empty()
                && let Err(e) = self.store.audit_all(&lines)
            {
                tracing::error!("cannot write {} audit line(s): {e}", lines.len());
            }
            let mut state = self.state();
            state.done = state.done.max(n);
            state.flushing = false;
        }
        self.written.notify_waiters();
    }
}

/// Writes the open batch when dropped.
struct Flusher<'a>(&'a AuditBatch);

impl Drop for Flusher<'_> {
    fn drop(&mut self) {
        self.0.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::AuditFilter;
    use crate::store::memory::MemoryStore;

    fn logged(store: &MemoryStore) -> Vec<String> {
        store
            .audit_log(&AuditFilter::default())
            .unwrap()
            .into_iter()
            .map(|e| e.tool)
            .collect()
    }

    /// Lines queued by tasks that are ready together are written by the first to wait, in one
    /// batch; each waiter returns only once its line is written.
    #[tokio::test(flavor = "current_thread")]
    async fn lines_queued_together_are_written_once_before_their_callers_go_on() {
        let store = Arc::new(MemoryStore::new());
        let batch = AuditBatch::new(store.clone());
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let mut tasks = Vec::new();
                for n in 0..5 {
                    let batch = batch.clone();
                    let store = store.clone();
                    tasks.push(tokio::task::spawn_local(async move {
                        let b = batch.add(AuditEntry::numbered(n));
                        batch.written(b).await;
                        assert!(logged(&store).contains(&format!("t{n}")));
                        b
                    }));
                }
                let mut batches = Vec::new();
                for t in tasks {
                    batches.push(t.await.unwrap());
                }
                assert_eq!(batches, [1, 1, 1, 1, 1]);
            })
            .await;
        assert_eq!(logged(&store).len(), 5);
        assert!(batch.is_written(1));
        assert!(!batch.is_written(2));
    }

    /// A waiter dropped while it was to write (its turn cancelled) writes on its way out.
    #[tokio::test(flavor = "current_thread")]
    async fn a_waiter_dropped_before_it_wrote_still_writes() {
        let store = Arc::new(MemoryStore::new());
        let batch = AuditBatch::new(store.clone());
        let b = batch.add(AuditEntry::numbered(1));
        {
            let waiting = batch.written(b);
            tokio::pin!(waiting);
            let polled = futures::poll!(waiting.as_mut());
            assert!(polled.is_pending(), "it yields before writing");
            assert!(logged(&store).is_empty());
        }
        assert_eq!(logged(&store), ["t1"]);
        assert!(batch.is_written(b));
        // The next line gets a batch of its own, written by its own waiter.
        let b2 = batch.add(AuditEntry::numbered(2));
        assert_eq!(b2, 2);
        batch.written(b2).await;
        assert_eq!(logged(&store), ["t1", "t2"]);
    }
}
