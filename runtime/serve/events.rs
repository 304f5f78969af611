//! What happens, as Server-Sent Events: each event gets the next id and goes to every
//! subscriber; the newest [`REPLAY`] are kept, so a client that reconnects with
//! `Last-Event-ID` is sent what it missed (or, when that has left the buffer, a `gap` event
//! first, saying how many it lost).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// How many events are kept for resumption.
pub const REPLAY: usize = 4096;

/// One event: its id, its type (the SSE `event:` field) and its JSON.
#[derive(Debug, Clone)]
pub struct Published {
    pub id: u64,
    pub kind: &'static str,
    pub data: Arc<str>,
}

/// The event stream: the replay buffer and the live channel.
pub struct Events {
    inner: Mutex<Buffer>,
    live: broadcast::Sender<Published>,
    /// Cancelled when the service stops: every stream ends, so the listener can close.
    closed: tokio_util::sync::CancellationToken,
}

struct Buffer {
    /// This run's first id.
    first: u64,
    next: u64,
    kept: VecDeque<Published>,
    capacity: usize,
}

impl Default for Events {
    /// A run's events, numbered from [`run_base`]: an id a client kept from the run before
    /// is below every id of this one, so it is told of the restart ([`Events::of_this_run`]).
    fn default() -> Events {
        Events::starting_at(REPLAY, run_base())
    }
}

/// The first id of a run started now: the time in milliseconds times a thousand. The ids of
/// a run before stay below it unless that run published a thousand events a millisecond, and
/// the ids stay exact in a JavaScript number (under 2^53) for two more centuries. With ids
/// from 1 in each run, a client that came back with id 4 after a restart was taken to have
/// seen this run's first four events, and was never sent them.
fn run_base() -> u64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| {
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 1000)
        });
    ms.saturating_mul(1000).max(1)
}

impl Events {
    pub fn with_capacity(capacity: usize) -> Events {
        Events::starting_at(capacity, 1)
    }

    fn starting_at(capacity: usize, first: u64) -> Events {
        let first = first.max(1);
        Events {
            inner: Mutex::new(Buffer {
                first,
                next: first,
                kept: VecDeque::with_capacity(capacity.min(1024)),
                capacity: capacity.max(1),
            }),
            live: broadcast::channel(capacity.max(16)).0,
            closed: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// Publishes `data` (an object; `type` is added) as an event of `kind`; answers its id.
    pub fn publish(&self, kind: &'static str, mut data: Value) -> u64 {
        if let Some(map) = data.as_object_mut() {
            map.insert("type".into(), Value::String(kind.into()));
        }
        let mut buffer = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let id = buffer.next;
        buffer.next += 1;
        let event = Published {
            id,
            kind,
            data: Arc::from(data.to_string()),
        };
        if buffer.kept.len() == buffer.capacity {
            buffer.kept.pop_front();
        }
        buffer.kept.push_back(event.clone());
        // Sent under the lock: a subscriber sees the buffer and then the channel, no gap.
        let _ = self.live.send(event);
        id
    }

    /// The id the next event will get.
    pub fn next_id(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).next
    }

    /// Whether `id` is one this run gave (or is about to give): one below its first or past
    /// its last was given by another run.
    fn of_this_run(&self, id: u64) -> bool {
        let buffer = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        id + 1 >= buffer.first && id < buffer.next
    }

    /// The id before this run's first: "seen nothing of this run".
    fn before_first(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).first - 1
    }

    /// Ends every stream, now and to come (the service is stopping).
    pub fn close(&self) {
        self.closed.cancel();
    }

    /// What a client that last saw `after` missed (with how many fell out of the buffer), and
    /// the live events from then on.
    pub fn subscribe(
        &self,
        after: Option<u64>,
    ) -> (u64, Vec<Published>, broadcast::Receiver<Published>) {
        let buffer = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let rx = self.live.subscribe();
        let Some(after) = after else {
            return (0, Vec::new(), rx);
        };
        let oldest = buffer.kept.front().map_or(buffer.next, |e| e.id);
        let lost = oldest.saturating_sub(after + 1);
        let missed = buffer
            .kept
            .iter()
            .filter(|e| e.id > after)
            .cloned()
            .collect();
        (lost, missed, rx)
    }

    /// The stream for `GET /api/events`: what the client missed since `after`, then live.
    /// It ends when `revoked` does (the token it was opened with was taken out at a reload).
    pub fn stream(
        self: &Arc<Self>,
        after: Option<u64>,
        revoked: futures::future::BoxFuture<'static, ()>,
    ) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<>> {
        let (tx, rx) = tokio::sync::mpsc::channel::<Event>(256);
        let feeding = feed(self.clone(), after, tx);
        tokio::spawn(async move {
            tokio::select! {
                () = feeding => {}
                () = revoked => tracing::info!(
                    "an event stream was ended: the token it was opened with is no longer admitted"
                ),
            }
        });
        let stream =
            futures::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
            );
        Sse::new(stream).keep_alive(KeepAlive::default())
    }
}

/// Sends a client its events until it goes away.
async fn feed(events: Arc<Events>, after: Option<u64>, tx: tokio::sync::mpsc::Sender<Event>) {
    // An id this run never gave was given by another (before a restart): the client is told
    // so and sent what this one kept, from the first. Read as its own, it silenced every event
    // until the new ids passed the old, or skipped this run's first ones.
    let after = match after {
        Some(id) if !events.of_this_run(id) => {
            let reset = json!({ "type": "reset", "last_event_id": id,
                "message": "the service restarted: event ids started again" });
            if tx
                .send(Event::default().event("reset").data(reset.to_string()))
                .await
                .is_err()
            {
                return;
            }
            Some(events.before_first())
        }
        given => given,
    };
    let (mut lost, mut missed, mut rx) = events.subscribe(after);
    let mut last = after.unwrap_or_else(|| events.before_first());
    loop {
        if lost > 0 {
            let gap = json!({ "type": "gap", "lost": lost });
            if tx
                .send(Event::default().event("gap").data(gap.to_string()))
                .await
                .is_err()
            {
                return;
            }
        }
        for e in missed.drain(..) {
            last = e.id;
            if tx.send(sse(&e)).await.is_err() {
                return;
            }
        }
        loop {
            // What was published before the close is sent first: a drain's last events (the
            // turns it cut) were lost to the close, at random.
            let e = tokio::select! {
                biased;
                e = rx.recv() => e,
                _ = tx.closed() => return,
                _ = events.closed.cancelled() => return,
            };
            match e {
                Ok(e) if e.id <= last => {}
                Ok(e) => {
                    last = e.id;
                    if tx.send(sse(&e)).await.is_err() {
                        return;
                    }
                }
                // A slow reader: send what the buffer still has, and say what it lost.
                Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
        (lost, missed, rx) = events.subscribe(Some(last));
    }
}

fn sse(e: &Published) -> Event {
    Event::default()
        .id(e.id.to_string())
        .event(e.kind)
        .data(&*e.data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_resumes_after_its_last_event_and_is_told_what_left_the_buffer() {
        let events = Events::with_capacity(3);
        for n in 0..5 {
            events.publish("tick", json!({ "n": n }));
        }
        // Ids 1..=5; the buffer keeps 3, 4, 5.
        let (lost, missed, _) = events.subscribe(Some(3));
        assert_eq!(
            (lost, missed.iter().map(|e| e.id).collect::<Vec<_>>()),
            (0, vec![4, 5])
        );
        let (lost, missed, _) = events.subscribe(Some(1));
        assert_eq!(
            (lost, missed.iter().map(|e| e.id).collect::<Vec<_>>()),
            (1, vec![3, 4, 5])
        );
        let (lost, missed, _) = events.subscribe(None);
        assert_eq!((lost, missed.len()), (0, 0));
        assert!(missed.is_empty());
        assert!(events.subscribe(Some(5)).1.is_empty());
    }

    /// An id kept from the run before a restart is below every id of this run, however few
    /// events this run has published: the client is told of the restart, not skipped ahead.
    #[test]
    fn an_id_of_the_run_before_is_not_taken_for_one_of_this_run() {
        let before = Events::default();
        for n in 0..5 {
            before.publish("tick", json!({ "n": n }));
        }
        let kept = before.next_id() - 1;
        std::thread::sleep(std::time::Duration::from_millis(2));
        let now = Events::default();
        for n in 0..10 {
            now.publish("tick", json!({ "n": n }));
        }
        assert!(!now.of_this_run(kept), "{kept} read as this run's");
        assert!(!now.of_this_run(4));
        assert!(now.of_this_run(now.next_id() - 1));
        assert!(now.of_this_run(now.before_first()));
        assert!(!now.of_this_run(now.next_id()));
        // Everything this run kept follows the reset, with no gap.
        let (lost, missed, _) = now.subscribe(Some(now.before_first()));
        assert_eq!((lost, missed.len()), (0, 10));
    }
}
