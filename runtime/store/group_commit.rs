//! Group commit: writes that arrive while one transaction is being made durable wait, and share
//! the next transaction, so N writers at once pay one fsync between them instead of N.
//!
//! There is no writer thread. A caller queues its write; if no batch is in flight it leads: it
//! takes every write queued so far, hands them to `apply` (one transaction, one commit) and posts
//! each caller its own outcome. Callers that arrive meanwhile park; when the leader is done it
//! wakes the callers of its batch and promotes the oldest write still queued to lead the next
//! one. A caller is answered only after the transaction holding its write committed (with
//! `synchronous=FULL`, after it is on disk), never before and never with another's outcome.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Thread;

/// The most writes one transaction takes; the rest lead the next (bounds a batch's latency).
pub const MAX_BATCH: usize = 512;

/// A queue of writes `W` whose outcomes are `R`.
pub struct GroupCommit<W, R> {
    queue: Mutex<Queue<W, R>>,
    batches: AtomicU64,
    writes: AtomicU64,
}

/// How many batches were applied, and how many writes they held (the benches print the ratio:
/// writes an fsync).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Commits {
    pub transactions: u64,
    pub writes: u64,
}

/// A queued write and where its caller waits.
type Pending<W, R> = (W, Arc<Slot<R>>);

struct Queue<W, R> {
    waiting: Vec<Pending<W, R>>,
    /// A batch is being applied (or its leader was chosen and is waking up).
    leading: bool,
}

/// Where a parked caller learns what to do.
struct Slot<R> {
    thread: Thread,
    state: Mutex<SlotState<R>>,
}

enum SlotState<R> {
    Waiting,
    /// Its write is the oldest queued: it leads the next batch.
    Lead,
    Done(R),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing is left half-done under these locks (a panicking `apply` is handled by
    // `Batch::drop`), so a poisoned one is fine to use.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<W, R> GroupCommit<W, R> {
    pub fn new() -> GroupCommit<W, R> {
        GroupCommit {
            queue: Mutex::new(Queue {
                waiting: Vec::new(),
                leading: false,
            }),
            batches: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }
    }

    /// The batches applied so far.
    pub fn commits(&self) -> Commits {
        Commits {
            transactions: self.batches.load(Ordering::Acquire),
            writes: self.writes.load(Ordering::Acquire),
        }
    }

    /// Queues `write` and returns its outcome once the batch that holds it was applied. `apply`
    /// gets the writes in arrival order and returns one outcome each, in the same order (it runs
    /// on whichever caller leads that batch, so every caller passes the same function); `lost`
    /// is every write's outcome when `apply` panicked.
    pub fn submit(
        &self,
        write: W,
        apply: impl FnOnce(Vec<W>) -> Vec<R>,
        lost: impl Fn() -> R,
    ) -> R {
        let slot = Arc::new(Slot {
            thread: std::thread::current(),
            state: Mutex::new(SlotState::Waiting),
        });
        let taken = {
            let mut queue = lock(&self.queue);
            queue.waiting.push((write, slot.clone()));
            if queue.leading {
                None
            } else {
                queue.leading = true;
                Some(take(&mut queue))
            }
        };
        let taken = match taken {
            Some(taken) => taken,
            None => match wait(&slot) {
                Some(done) => return done,
                // Promoted: `leading` was left set for this caller, whose write is queued.
                None => take(&mut lock(&self.queue)),
            },
        };
        self.lead(taken, &slot, apply, lost)
    }

    /// Applies `taken` (this caller's write among them) as one batch.
    fn lead(
        &self,
        taken: Vec<Pending<W, R>>,
        me: &Arc<Slot<R>>,
        apply: impl FnOnce(Vec<W>) -> Vec<R>,
        lost: impl Fn() -> R,
    ) -> R {
        let (writes, slots): (Vec<W>, Vec<Arc<Slot<R>>>) = taken.into_iter().unzip();
        self.batches.fetch_add(1, Ordering::AcqRel);
        self.writes.fetch_add(writes.len() as u64, Ordering::AcqRel);
        let mut batch = Batch {
            group: self,
            slots,
            lost: &lost,
            posted: false,
        };
        let outcomes = apply(writes);
        assert_eq!(
            outcomes.len(),
            batch.slots.len(),
            "a batch's apply returns one outcome per write"
        );
        batch.post(outcomes);
        // This caller's write was in the batch it led (it was queued before it led).
        match std::mem::replace(&mut *lock(&me.state), SlotState::Waiting) {
            SlotState::Done(r) => r,
            _ => lost(),
        }
    }

    /// How many writes are queued and not yet taken by a batch.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        lock(&self.queue).waiting.len()
    }
}

/// The next batch: the oldest writes queued, up to [`MAX_BATCH`].
fn take<W, R>(queue: &mut Queue<W, R>) -> Vec<Pending<W, R>> {
    let n = queue.waiting.len().min(MAX_BATCH);
    queue.waiting.drain(..n).collect()
}

/// Parks until the slot is answered (`Some`) or promoted to lead (`None`).
fn wait<R>(slot: &Slot<R>) -> Option<R> {
    loop {
        {
            let mut state = lock(&slot.state);
            match std::mem::replace(&mut *state, SlotState::Waiting) {
                SlotState::Done(r) => return Some(r),
                SlotState::Lead => return None,
                SlotState::Waiting => {}
            }
        }
        // `unpark` before `park` makes `park` return at once, so no wake-up is missed.
        std::thread::park();
    }
}

/// A batch taken by a leader: posting its outcomes (or, if `apply` panicked, `lost` for each)
/// and handing the lead on happen exactly once, on every path out.
struct Batch<'a, W, R> {
    group: &'a GroupCommit<W, R>,
    slots: Vec<Arc<Slot<R>>>,
    lost: &'a dyn Fn() -> R,
    posted: bool,
}

impl<W, R> Batch<'_, W, R> {
    fn post(&mut self, outcomes: Vec<R>) {
        self.posted = true;
        let me = std::thread::current().id();
        for (slot, outcome) in self.slots.iter().zip(outcomes) {
            *lock(&slot.state) = SlotState::Done(outcome);
            if slot.thread.id() != me {
                slot.thread.unpark();
            }
        }
        self.hand_on();
    }

    /// Promotes the oldest queued write's caller to lead, or marks that none leads.
    fn hand_on(&self) {
        let mut queue = lock(&self.group.queue);
        match queue.waiting.first() {
            Some((_, next)) => {
                *lock(&next.state) = SlotState::Lead;
                next.thread.unpark();
            }
            None => queue.leading = false,
        }
    }
}

impl<W, R> Drop for Batch<'_, W, R> {
    fn drop(&mut self) {
        if self.posted {
            return;
        }
        // `apply` panicked: nobody in this batch may wait forever, nor the ones queued behind.
        let lost: Vec<R> = self.slots.iter().map(|_| (self.lost)()).collect();
        self.post(lost);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// Writes are numbers; a batch answers each with (its number, the batch's size).
    fn apply_recording(
        batches: &Mutex<Vec<Vec<u32>>>,
    ) -> impl FnOnce(Vec<u32>) -> Vec<(u32, usize)> + '_ {
        move |writes| {
            let n = writes.len();
            lock(batches).push(writes.clone());
            writes.into_iter().map(|w| (w, n)).collect()
        }
    }

    #[test]
    fn a_lone_write_is_its_own_batch() {
        let group = GroupCommit::<u32, (u32, usize)>::new();
        let batches = Mutex::new(Vec::new());
        assert_eq!(
            group.submit(7, apply_recording(&batches), || (0, 0)),
            (7, 1)
        );
        assert_eq!(
            group.submit(8, apply_recording(&batches), || (0, 0)),
            (8, 1)
        );
        assert_eq!(*lock(&batches), vec![vec![7], vec![8]]);
        assert_eq!(group.queued(), 0);
    }

    #[test]
    fn writes_arriving_during_a_batch_share_the_next_and_each_gets_its_own_outcome() {
        const OTHERS: u32 = 15;
        let group = GroupCommit::<u32, (u32, usize)>::new();
        let batches = Mutex::new(Vec::new());
        let first_applying = Barrier::new(2);
        let release = AtomicBool::new(false);
        std::thread::scope(|s| {
            // The first write's batch holds until every other write has queued behind it.
            let first = s.spawn(|| {
                group.submit(
                    0,
                    |writes| {
                        first_applying.wait();
                        while !release.load(Ordering::Acquire) {
                            std::thread::yield_now();
                        }
                        apply_recording(&batches)(writes)
                    },
                    || (u32::MAX, 0),
                )
            });
            first_applying.wait();
            let others: Vec<_> = (1..=OTHERS)
                .map(|w| {
                    let (group, batches) = (&group, &batches);
                    s.spawn(move || group.submit(w, apply_recording(batches), || (u32::MAX, 0)))
                })
                .collect();
            while group.queued() < OTHERS as usize {
                std::thread::yield_now();
            }
            release.store(true, Ordering::Release);
            assert_eq!(first.join().unwrap(), (0, 1));
            for (w, h) in (1..=OTHERS).zip(others) {
                assert_eq!(h.join().unwrap(), (w, OTHERS as usize), "write {w}");
            }
        });
        let batches = lock(&batches);
        assert_eq!(
            batches.len(),
            2,
            "one batch for the 15 that waited: {batches:?}"
        );
        let mut second = batches[1].clone();
        second.sort();
        assert_eq!(second, (1..=OTHERS).collect::<Vec<_>>());
        assert_eq!(group.queued(), 0);
    }

    #[test]
    fn a_panicking_batch_answers_its_writes_and_the_queue_goes_on() {
        let group = GroupCommit::<u32, Result<u32, String>>::new();
        let lost = || Err("lost".to_string());
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            group.submit(1, |_| panic!("apply failed"), lost)
        }));
        assert!(caught.is_err(), "the leader's own call panics");
        // The lead was handed on: the next write is applied, not parked forever.
        let ok = group.submit(2, |w| w.into_iter().map(Ok).collect(), lost);
        assert_eq!(ok, Ok(2));
    }
}
