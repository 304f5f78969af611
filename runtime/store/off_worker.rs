//! Waiting for the disk without holding up tokio's workers.
//!
//! The [`Store`](super::Store) API is synchronous (a resident's hooks call it between two awaits),
//! and a durable write waits for an fsync. Made on one of the multi-thread runtime's few worker
//! threads, that wait would stall every task queued on the worker, and with as many residents
//! committing as there are workers no further commit could even be made to share the fsync in
//! flight. So a call made on a worker runs under [`tokio::task::block_in_place`]: the worker's
//! queue moves to another thread for the wait. Everywhere else (the Lua thread's current-thread
//! runtime, a plain thread, `spawn_blocking`) the call simply runs.

use tokio::runtime::{Handle, RuntimeFlavor};

/// Runs `f`, which may block, so that it does not block a multi-thread runtime's worker.
pub fn off_worker<R>(f: impl FnOnce() -> R) -> R {
    if on_multi_thread_worker() {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

/// Whether this thread is polling a task of a multi-thread runtime (where `block_in_place` is
/// allowed; on a current-thread runtime it would panic).
fn on_multi_thread_worker() -> bool {
    tokio::task::try_id().is_some()
        && Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `off_worker` moved the worker's queue away: a task spawned before the call and
    /// only able to run while the calling worker is busy runs during the call.
    fn lets_others_run() -> bool {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        drop(tokio::spawn(async move {
            let _ = tx.send(());
        }));
        off_worker(|| rx.recv_timeout(std::time::Duration::from_secs(10)).is_ok())
    }

    #[test]
    fn on_a_single_worker_the_others_run_meanwhile() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        // The only worker waits inside `off_worker` for a task queued on it: it can run only if
        // the worker's queue was handed over.
        let ran = rt.block_on(async { tokio::spawn(async { lets_others_run() }).await.unwrap() });
        assert!(ran, "the spawned task ran while the worker waited");
    }

    #[test]
    fn elsewhere_it_just_runs() {
        assert_eq!(off_worker(|| 1), 1, "a plain thread");
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(
            current.block_on(async { off_worker(|| 2) }),
            2,
            "current-thread runtime"
        );
        let local = tokio::task::LocalSet::new();
        assert_eq!(
            local.block_on(&current, async {
                tokio::task::spawn_local(async { off_worker(|| 3) })
                    .await
                    .unwrap()
            }),
            3,
            "a LocalSet on it, as the Lua thread runs"
        );
        let multi = tokio::runtime::Runtime::new().unwrap();
        assert_eq!(
            multi.block_on(async { off_worker(|| 4) }),
            4,
            "multi-thread block_on"
        );
        let blocking = multi.block_on(async {
            tokio::task::spawn_blocking(|| off_worker(|| 5))
                .await
                .unwrap()
        });
        assert_eq!(blocking, 5, "spawn_blocking");
    }
}
