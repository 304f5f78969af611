//! A session's transport that reads no further message while too many of its own wait to be
//! written: a client that sends requests and does not read the answers is slowed to the pace
//! at which it reads, as a pipe slows a writer.
//!
//! rmcp's service loop writes each answer on a task of its own and goes on reading, so with a
//! client that never read its stdout every request read became an answer held in memory (a
//! client writing pings without reading grew colony by gigabytes). Here, once
//! [`MAX_UNWRITTEN`] messages are being written, `receive` waits until one of them is: the
//! client's writes then fill the pipe to colony and block, and nothing grows.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rmcp::service::{RxJsonRpcMessage, ServiceRole, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::sync::Notify;

/// How many messages may wait to be written before the next one is read. rmcp holds as many
/// answers again in its channel from the handlers; past that a handler waits to hand its answer
/// over.
pub const MAX_UNWRITTEN: usize = 64;

/// `inner`, pausing its reading while [`MAX_UNWRITTEN`] messages wait to be written.
pub struct Paced<T> {
    inner: T,
    unwritten: Arc<Unwritten>,
}

#[derive(Default)]
struct Unwritten {
    count: AtomicUsize,
    written: Notify,
}

/// One message being written; counted until its write ends or is dropped (a session that
/// ends drops the writes it no longer waits for).
struct Writing(Arc<Unwritten>);

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
        self.0.written.notify_waiters();
    }
}

impl Unwritten {
    fn writing(self: &Arc<Self>) -> Writing {
        self.count.fetch_add(1, Ordering::AcqRel);
        Writing(self.clone())
    }

    /// Returns once fewer than [`MAX_UNWRITTEN`] messages wait to be written. Nothing is read
    /// before it returns, so dropping it (rmcp's loop polls `receive` in a `select!`) loses
    /// nothing.
    async fn room(&self) {
        loop {
            let written = self.written.notified();
            tokio::pin!(written);
            // Registered before the count is read: a write ending between the two still wakes it.
            written.as_mut().enable();
            if self.count.load(Ordering::Acquire) < MAX_UNWRITTEN {
                return;
            }
            written.await;
        }
    }
}

impl<T> Paced<T> {
    pub fn new(inner: T) -> Paced<T> {
        Paced {
            inner,
            unwritten: Arc::default(),
        }
    }
}

impl<R, T> Transport<R> for Paced<T>
where
    R: ServiceRole,
    T: Transport<R>,
{
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<R>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // Counted when rmcp asks for the write, before it spawns the task that awaits it.
        let writing = self.unwritten.writing();
        let send = self.inner.send(item);
        async move {
            let sent = send.await;
            drop(writing);
            sent
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<R>> {
        self.unwritten.room().await;
        self.inner.receive().await
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn there_is_room_until_max_unwritten_and_again_when_one_is_written() {
        let unwritten = Arc::new(Unwritten::default());
        let mut writes: Vec<Writing> = (0..MAX_UNWRITTEN - 1)
            .map(|_| unwritten.writing())
            .collect();
        assert!(futures::FutureExt::now_or_never(unwritten.room()).is_some());
        writes.push(unwritten.writing());
        let room = tokio::spawn({
            let unwritten = unwritten.clone();
            async move { unwritten.room().await }
        });
        tokio::task::yield_now().await;
        assert!(!room.is_finished(), "room with {MAX_UNWRITTEN} unwritten");
        drop(writes.pop());
        room.await.unwrap();
    }
}
