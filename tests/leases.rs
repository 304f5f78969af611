//! Leases for placement in the PostgreSQL store (a real server, tests/support/postgres.rs):
//! one owner at a time, a new fencing token with each acquisition, the heartbeat, release for
//! an immediate hand-over, and the fence: a node whose lease was taken over cannot write the
//! resident's cell any more, whatever it still believes.

mod support;

use std::sync::Arc;
use std::time::Duration;

use colony::residents::Mail;
use colony::store::postgres::{FencedStore, PostgresStore};
use colony::store::{JournalEntry, Store};
use colony::vocab::Message;

const LONG: Duration = Duration::from_secs(600);

fn store() -> Arc<PostgresStore> {
    Arc::new(PostgresStore::open(&support::postgres::database()).unwrap())
}

#[test]
fn a_lease_has_one_owner_until_it_expires_or_is_released() {
    let store = store();
    let a1 = store
        .acquire("r1", "node-a", LONG)
        .unwrap()
        .expect("free: taken");
    assert_eq!((a1.name.as_str(), a1.owner.as_str()), ("r1", "node-a"));
    assert!(
        store.acquire("r1", "node-b", LONG).unwrap().is_none(),
        "held by a"
    );
    assert_eq!(store.lease("r1").unwrap(), Some(a1.clone()));

    // Acquiring again, even by the owner, starts a new ownership: a new, larger token.
    let a2 = store.acquire("r1", "node-a", LONG).unwrap().unwrap();
    assert!(a2.token > a1.token, "{a2:?} after {a1:?}");

    // The heartbeat keeps the token and moves the expiry on; a stale lease cannot renew.
    let renewed = store.renew(&a2, LONG * 2).unwrap().expect("still a's");
    assert_eq!(renewed.token, a2.token);
    assert!(renewed.expires_at_ms > a2.expires_at_ms);
    assert!(
        store.renew(&a1, LONG).unwrap().is_none(),
        "a1's token is gone"
    );

    // Released: another node takes it at once, without waiting for the expiry.
    assert!(
        !store.release(&a1).unwrap(),
        "a stale lease releases nothing"
    );
    assert!(store.release(&a2).unwrap());
    let b = store
        .acquire("r1", "node-b", LONG)
        .unwrap()
        .expect("released: taken");
    assert!(b.token > a2.token);
    assert!(store.renew(&a2, LONG).unwrap().is_none());

    // Expired (a lease of no length): taken over without a release.
    let c = store
        .acquire("r2", "node-c", Duration::ZERO)
        .unwrap()
        .unwrap();
    let d = store
        .acquire("r2", "node-d", LONG)
        .unwrap()
        .expect("expired: taken");
    assert!(d.token > c.token);
    assert!(store.renew(&c, LONG).unwrap().is_none(), "c lost it");
    assert_eq!(store.lease("r2").unwrap().unwrap().owner, "node-d");
    assert_eq!(store.lease("nobody").unwrap(), None);
}

#[test]
fn nodes_racing_for_a_free_lease_get_it_once() {
    let store = store();
    for round in 0..10 {
        let name = format!("r{round}");
        let won: Vec<bool> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..6)
                .map(|n| {
                    let (store, name) = (&store, &name);
                    s.spawn(move || {
                        store
                            .acquire(name, &format!("node-{n}"), LONG)
                            .unwrap()
                            .is_some()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "round {round}: {won:?}"
        );
    }
}

#[test]
fn a_node_that_lost_its_lease_cannot_write_after_another_took_over() {
    let store = store();
    let node_a = FencedStore::new(store.clone(), "node-a");
    let node_b = FencedStore::new(store.clone(), "node-b");

    // Without a lease a node writes nothing.
    let err = node_a
        .commit_step("r", &[Message::user("no lease")], &[], 0)
        .unwrap_err();
    assert_eq!(err.kind(), "fenced", "{err}");
    assert!(err.to_string().contains("holds no lease"), "{err}");
    assert_eq!(store.load_cell("r").unwrap(), None);

    // a holds a lease that runs out at once (a node paused past its lease): while nobody took
    // it over, its token is still the current one and its writes go through.
    let lease_a = store
        .acquire("r", "node-a", Duration::ZERO)
        .unwrap()
        .unwrap();
    node_a.hold(&lease_a);
    node_a
        .commit_step("r", &[Message::user("from a")], &[], 0)
        .unwrap();

    // b takes over and writes.
    let lease_b = store
        .acquire("r", "node-b", LONG)
        .unwrap()
        .expect("expired: taken");
    node_b.hold(&lease_b);
    let from_b = [Message::user("from a"), Message::assistant("b carried on")];
    node_b.commit_step("r", &from_b, &[], 0).unwrap();
    let mut m = Mail::new("r", "feeder", "for b", 0);
    m.id = Some("m-1".into());
    let row = node_b
        .push_backlog("r", &m)
        .unwrap()
        .expect("a new id is appended");

    // a resumes, still believing it owns r: every cell write is refused, naming it.
    let refused = [
        node_a
            .commit_step("r", &[Message::user("a overwrites")], &[row], 0)
            .unwrap_err(),
        node_a
            .push_backlog("r", &Mail::new("r", "feeder", "via a", 0))
            .unwrap_err(),
        node_a
            .journal(
                "r",
                &JournalEntry {
                    call_id: "c1".into(),
                    tool: "work".into(),
                    result: None,
                    files: Vec::new(),
                },
            )
            .unwrap_err(),
        node_a.clear_cell("r").unwrap_err(),
    ];
    for err in &refused {
        assert_eq!(err.kind(), "fenced", "{err}");
        let text = err.to_string();
        assert!(text.contains("\"r\"") && text.contains("node-a"), "{text}");
        assert!(text.contains(&format!("token {}", lease_a.token)), "{text}");
    }
    // Even an id a already knows is not answered from a's side (the fence comes first).
    assert_eq!(node_a.push_backlog("r", &m).unwrap_err().kind(), "fenced");

    // The cell is exactly what b wrote.
    let cell = store.load_cell("r").unwrap().unwrap();
    assert_eq!(cell.messages, from_b);
    assert_eq!(cell.backlog.len(), 1);
    assert_eq!(cell.backlog[0].content, "for b");
    assert!(cell.journal.is_empty());
    // Reads through a's store still work (it can see what it lost).
    assert_eq!(node_a.load_cell("r").unwrap().unwrap().messages, from_b);

    // b hands over (SIGTERM): its own writes stop, and a may take the resident back.
    assert!(store.release(&lease_b).unwrap());
    assert_eq!(
        node_b
            .commit_step("r", &from_b, &[row], 0)
            .unwrap_err()
            .kind(),
        "fenced"
    );
    let again = store
        .acquire("r", "node-a", LONG)
        .unwrap()
        .expect("released");
    node_a.hold(&again);
    node_a.commit_step("r", &from_b, &[row], 0).unwrap();
    assert!(store.load_cell("r").unwrap().unwrap().backlog.is_empty());
}

/// A node's name is one process's while its heartbeat lasts: a second process started with the
/// same `--node` is refused (it took the first one's leases for its own, in turn, for as long
/// as both ran), one that restarts after its predecessor died takes the name once the old
/// heartbeat expires, and one that leaves removes only its own heartbeat.
#[test]
fn a_node_name_beats_for_one_process_at_a_time() {
    let store = store();
    assert!(store.beat("node-b", "first", LONG).unwrap());
    assert!(
        !store.beat("node-b", "second", LONG).unwrap(),
        "the name is taken"
    );
    assert!(
        store.beat("node-b", "first", LONG).unwrap(),
        "its own renewal"
    );
    assert_eq!(store.live_nodes().unwrap(), ["node-b"]);
    store.leave("node-b", "second").unwrap();
    assert_eq!(
        store.live_nodes().unwrap(),
        ["node-b"],
        "another process's leaving removes nothing"
    );
    store.leave("node-b", "first").unwrap();
    assert!(store.live_nodes().unwrap().is_empty());
    assert!(store.beat("node-b", "second", LONG).unwrap(), "left: free");

    // A heartbeat that expired (its process died without leaving) frees the name.
    assert!(store.beat("node-c", "dead", Duration::ZERO).unwrap());
    assert!(store.beat("node-c", "restarted", LONG).unwrap());
    assert!(!store.beat("node-c", "dead", LONG).unwrap(), "taken since");
}
