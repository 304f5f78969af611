//! Where each breaker of a program's model calls stands, as the route last saw it: for the
//! host's view of a resident (`colony serve`'s API and metrics) and its transitions (an
//! observer hears each one).
//!
//! A breaker keeps its state in the program's store under its owner's key
//! ([`crate::infer::stack::breaker_key`]); the route hands each stack a [`Tracked`] store
//! ([`super::Route::breaker_store`]) that saves there, as [`super::persist::StoreBreaker`] does,
//! and also notes the state in the route's [`Breakers`] and tells the observer of each change.
//! A resident's breaker is its own (`middleware` given on `ai.spawn`), else the route's (owner
//! `route`), which every resident without middleware of its own shares.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::observe::{Observation, Observer};
use super::persist::StoreBreaker;
use crate::infer::breaker::{BreakerState, BreakerStatus, BreakerStore};
use crate::store::Store;

/// The owner of the route's breaker, shared by the residents without middleware of their own.
pub const ROUTE_OWNER: &str = "route";

/// Every breaker's state by owner: `None` for an owner whose stack was built but whose breaker
/// has not been used yet (or whose stack has no breaker).
#[derive(Debug, Default)]
pub struct Breakers(Mutex<HashMap<String, Option<BreakerState>>>);

impl Breakers {
    /// The breaker resident `name`'s model calls go through, where it stands: its own if it
    /// has a stack of its own, else the route's. `None`: no breaker has been used for it.
    pub fn of(&self, name: &str) -> Option<BreakerState> {
        let table = lock(&self.0);
        match table.get(name) {
            Some(own) => own.clone(),
            None => table.get(ROUTE_OWNER).cloned().flatten(),
        }
    }

    /// Forgets `owner`'s breaker (a resident dismissed).
    pub fn forget(&self, owner: &str) {
        lock(&self.0).remove(owner);
    }

    fn built(&self, owner: &str) {
        lock(&self.0).entry(owner.to_string()).or_insert(None);
    }

    /// Notes `state`; answers the status it had before (closed for one never noted).
    fn note(&self, owner: &str, state: &BreakerState) -> BreakerStatus {
        lock(&self.0)
            .insert(owner.to_string(), Some(state.clone()))
            .flatten()
            .map_or(BreakerStatus::Closed, |s| s.status)
    }
}

/// A breaker's store that the route tracks: saved in the program's store (if it has one),
/// noted in the route's [`Breakers`], each change told to the observer.
pub struct Tracked {
    pub(super) owner: String,
    pub(super) saved: Option<StoreBreaker>,
    pub(super) breakers: Arc<Breakers>,
    pub(super) observer: Option<Observer>,
}

impl Tracked {
    pub(super) fn new(
        owner: &str,
        key: &str,
        store: Option<&Arc<dyn Store>>,
        breakers: Arc<Breakers>,
        observer: Option<Observer>,
    ) -> Tracked {
        breakers.built(owner);
        Tracked {
            owner: owner.to_string(),
            saved: store.map(|store| StoreBreaker {
                store: store.clone(),
                key: key.to_string(),
            }),
            breakers,
            observer,
        }
    }
}

impl BreakerStore for Tracked {
    fn load(&self) -> Option<BreakerState> {
        let state = self.saved.as_ref().and_then(BreakerStore::load)?;
        // Taken up after a restart: where it stands, but not a transition.
        self.breakers.note(&self.owner, &state);
        Some(state)
    }

    /// Called on each transition, and as failures are counted, under the breaker's lock: a note,
    /// and a message for a transition (a failure counted while closed was told as a "closed to
    /// closed" transition).
    fn save(&self, state: &BreakerState) {
        if let Some(saved) = &self.saved {
            saved.save(state);
        }
        let from = self.breakers.note(&self.owner, state);
        if from == state.status {
            return;
        }
        if let Some(observer) = &self.observer {
            let _ = observer.send(Observation::Breaker {
                owner: self.owner.clone(),
                from,
                state: state.clone(),
            });
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::breaker::BreakerPolicy;

    fn state(status: BreakerStatus) -> BreakerState {
        BreakerState {
            status,
            ..BreakerState::closed(&BreakerPolicy::default(), 0)
        }
    }

    #[test]
    fn a_resident_reads_its_own_breaker_else_the_routes_and_each_change_is_told() {
        let breakers = Arc::new(Breakers::default());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let route = Tracked::new(ROUTE_OWNER, "ai/breaker", None, breakers.clone(), Some(tx));
        let own = Tracked::new("solo", "ai/breaker/solo", None, breakers.clone(), None);
        assert_eq!(breakers.of("anyone"), None);
        route.save(&state(BreakerStatus::Open));
        assert_eq!(
            breakers.of("anyone").map(|s| s.status),
            Some(BreakerStatus::Open)
        );
        // A stack of its own, unused: no breaker has been used for it (not the route's).
        assert_eq!(breakers.of("solo"), None);
        own.save(&state(BreakerStatus::HalfOpen));
        assert_eq!(
            breakers.of("solo").map(|s| s.status),
            Some(BreakerStatus::HalfOpen)
        );
        route.save(&state(BreakerStatus::HalfOpen));
        let told: Vec<(BreakerStatus, BreakerStatus)> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|o| match o {
                Observation::Breaker { owner, from, state } => {
                    assert_eq!(owner, ROUTE_OWNER);
                    (from, state.status)
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            told,
            [
                (BreakerStatus::Closed, BreakerStatus::Open),
                (BreakerStatus::Open, BreakerStatus::HalfOpen)
            ]
        );
        breakers.forget("solo");
        assert_eq!(
            breakers.of("solo").map(|s| s.status),
            Some(BreakerStatus::HalfOpen)
        );
    }

    /// A failure counted while the breaker stays as it was is saved and noted, not told as a
    /// transition ("closed to closed" reached the events as one).
    #[test]
    fn a_failure_counted_without_a_change_is_not_told_as_a_transition() {
        let breakers = Arc::new(Breakers::default());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let route = Tracked::new(ROUTE_OWNER, "ai/breaker", None, breakers.clone(), Some(tx));
        let counted = BreakerState {
            failures: 1,
            ..state(BreakerStatus::Closed)
        };
        route.save(&counted);
        assert_eq!(breakers.of("anyone").map(|s| s.failures), Some(1));
        assert!(rx.try_recv().is_err(), "a failure counted was told");
        route.save(&state(BreakerStatus::Open));
        assert!(matches!(
            rx.try_recv(),
            Ok(Observation::Breaker {
                from: BreakerStatus::Closed,
                ..
            })
        ));
    }
}
