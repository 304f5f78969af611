//! Several nodes sharing one program's residents: state in PostgreSQL, mail over NATS JetStream
//! (`colony serve --cluster nats://HOST:4222 --store postgres://...` on each node, the same
//! program files everywhere).
//!
//! A [`Cluster`] is one program's [`Placement`] on one node. Each resident that keeps its
//! conversation runs on one node at a time, the holder of its lease in PostgreSQL
//! ([`crate::store::postgres::leases`]); every cell write goes through a [`FencedStore`], so a
//! node that lost a lease (paused past it, cut off) cannot write after another took over.
//!
//! Every [`ClusterOptions::lease`]`/3` a round (`Shared::round`): the node beats its heart in
//! `colony_nodes`, renews the leases it holds (a lost one retires its resident here), and, by
//! rendezvous hashing over the live nodes ([`rendezvous`]), claims the residents that should
//! run here and whose lease is free or expired, and hands over, once at rest, the ones that
//! should run on another live node (a node that joins gets its share); a resident that the
//! node it hashes to does not have (programs that differ) is run by a node that has it once it
//! has gone unowned for a few rounds. A node stopped with
//! SIGTERM releases everything once its turns have finished ([`Placement::ended`]); one that
//! died is taken over once its leases expire.
//!
//! Mail to a resident not running here is published to its subject ([`bus`]); the node that
//! holds its lease reads it through the resident's durable consumer and acks it once it is in
//! the saved backlog.

pub mod bus;
pub mod rendezvous;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::residents::{Delivered, Lifecycle, Mail, MailError, Placement};
use crate::store::postgres::{FencedStore, Lease, PostgresStore};
use crate::store::{Store, StoreResult, off_worker::off_worker};
use bus::{Bus, Taken};

/// How long a lease (and a node's heartbeat) lasts unless renewed: a node that dies is taken
/// over this long after its last round.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
/// The shortest lease: renewed every third of it, over a database's round trips.
pub const MIN_LEASE: Duration = Duration::from_millis(300);
/// The longest lease: how long a node that dies leaves its residents unserved, and its name
/// taken (a lease of 300 days held both that long).
pub const MAX_LEASE: Duration = Duration::from_secs(600);

/// How a node joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The NATS server (`nats://HOST:4222`), with JetStream enabled.
    pub nats: String,
    /// This node's name: unique in the cluster.
    pub node: String,
    /// How long a lease lasts unless renewed.
    pub lease: Duration,
}

impl ClusterOptions {
    /// A node name for this process when none is given: the host's name and the process id.
    pub fn default_node() -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "node".into());
        format!("{host}-{}", std::process::id())
    }
}

/// Why a node could not join its cluster, and whether joining again later may work (as
/// `serve::host::Unstarted` says it of a start): a server that cannot be reached, or a name
/// another process holds, may; a NATS address that does not parse, or credentials refused, not.
#[derive(Debug)]
pub struct JoinError {
    pub message: String,
    pub again: bool,
}

impl From<String> for JoinError {
    /// A failure that may pass.
    fn from(message: String) -> JoinError {
        JoinError {
            message,
            again: true,
        }
    }
}

impl std::fmt::Display for JoinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// One program's placement on one node of a cluster.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Shared>,
}

struct Shared {
    node: String,
    /// This process among any given the same node name ([`PostgresStore::beat`]).
    instance: String,
    /// Another process took the node's name while this one's heartbeat had expired.
    displaced: std::sync::atomic::AtomicBool,
    ttl: Duration,
    pg: Arc<PostgresStore>,
    fenced: Arc<FencedStore>,
    bus: Bus,
    handle: Handle,
    lifecycle: OnceLock<Lifecycle>,
    state: Mutex<Placing>,
    /// Told at the program's end: the rounds stop.
    ended: Notify,
    /// For the ids of mail sent without one (a redelivery must find it accepted).
    sent: AtomicU64,
}

#[derive(Default)]
struct Placing {
    /// The leases held, by resident.
    held: HashMap<String, Lease>,
    /// The consumer reading each held resident's mail.
    consumers: HashMap<String, AbortHandle>,
    /// Who runs what, as of the last round (unexpired leases only).
    owners: HashMap<String, String>,
    /// For each resident placed on another node, how many rounds in a row it had no owner.
    unowned: HashMap<String, u32>,
    /// Residents run here because the node they belong on did not take them: not handed over
    /// (that node would not take them either).
    adopted: std::collections::HashSet<String>,
    rounds: Option<AbortHandle>,
    over: bool,
}

impl Cluster {
    /// Joins the cluster for the program whose state is in `pg` (its tables in a schema of
    /// their own; `program` names its stream): connects to NATS on `handle`'s runtime. The
    /// store the program must be given is [`Cluster::store`].
    pub fn join(
        options: &ClusterOptions,
        pg: Arc<PostgresStore>,
        program: &str,
        handle: &Handle,
    ) -> Result<Cluster, JoinError> {
        if options.node.is_empty() || options.node.contains('\0') {
            return Err(JoinError {
                message: format!("the node name {:?} is not usable", options.node),
                again: false,
            });
        }
        // The mail stream is the program's in this database: another cluster on the same NATS
        // server with a program of the same name (staging beside production) has its own.
        let identity = off_worker(|| pg.identity())
            .map_err(|e| format!("cannot read the program's identity in the store: {e}"))?;
        let stream = {
            use sha2::{Digest, Sha256};
            let digest = Sha256::digest(identity.as_bytes());
            let short: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
            format!("{program}_{short}")
        };
        let bus = off_worker(|| {
            let _enter = handle.enter();
            futures::executor::block_on(Bus::connect(&options.nats, &stream))
        })?;
        let ttl = options.lease.clamp(MIN_LEASE, MAX_LEASE);
        let instance = instance();
        off_worker(|| take_name(&pg, &options.node, &instance, ttl))?;
        let fenced = Arc::new(FencedStore::new(pg.clone(), &options.node));
        Ok(Cluster {
            inner: Arc::new(Shared {
                node: options.node.clone(),
                instance,
                displaced: Default::default(),
                ttl,
                pg,
                fenced,
                bus,
                handle: handle.clone(),
                lifecycle: OnceLock::new(),
                state: Mutex::new(Placing::default()),
                ended: Notify::new(),
                sent: AtomicU64::new(0),
            }),
        })
    }

    /// The store the program's residents write through: fenced by this node's leases.
    pub fn store(&self) -> Arc<dyn Store> {
        self.inner.fenced.clone()
    }

    /// The placement to lend the program.
    pub fn placement(&self) -> Arc<dyn Placement> {
        Arc::new(self.clone())
    }
}

/// How many rounds in a row (each a third of a lease) a resident that belongs on another
/// node may go without an owner before a node that has it runs it: the node it belongs on
/// claims it in its first round after the lease is free, so this is only reached when that
/// node has no such resident.
const UNCLAIMED_ROUNDS: u32 = 4;

/// A name for this process among any that share its node name: its id and start time.
fn instance() -> String {
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{}-{at:x}", std::process::id())
}

/// Takes the name `node` for this process, when no live node has it. One that has it is
/// another process running as `node` (two would take each other's leases for their own in
/// turn), or one that ended without leaving (SIGKILL, a lost machine; restarted by systemd),
/// whose heartbeat expires within a lease: refused either way, saying so, and `colony serve`
/// starts the program again a little later (it waited here, and answered no request meanwhile).
fn take_name(pg: &PostgresStore, node: &str, instance: &str, ttl: Duration) -> Result<(), String> {
    match pg.beat(node, instance, ttl) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "another node named {node:?} is running (its heartbeat in the store is current; one \
             that ended without leaving expires within {:.1}s, and the start is tried again): \
             give each node its own --node",
            ttl.as_secs_f64()
        )),
        Err(e) => Err(format!("cannot join the cluster as node {node:?}: {e}")),
    }
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, Placing> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One round: heartbeat, renewals, claims and handovers (blocking: the store's calls).
    fn round(self: &Arc<Self>, lifecycle: &Lifecycle) -> StoreResult<()> {
        let pg = &self.pg;
        if self.displaced.load(Ordering::Relaxed) {
            return Ok(());
        }
        if !pg.beat(&self.node, &self.instance, self.ttl)? {
            // Its heartbeat expired (it was paused) and another process took the name: the
            // leases are that process's now. This one lets its residents go and its program
            // stops (its API says so, `/readyz` with it), for good: placing again once the
            // other left would take the name back from under whoever has it then.
            self.displaced.store(true, Ordering::Relaxed);
            let why = format!(
                "another process joined as node {:?} while this one's heartbeat had expired",
                self.node
            );
            tracing::error!(node = %self.node, "{why}: its residents let go, its program stopped");
            let held: Vec<String> = self.state().held.keys().cloned().collect();
            for name in held {
                self.let_go(lifecycle, &name, false);
            }
            lifecycle.stop(why);
            return Ok(());
        }
        let live = pg.live_nodes()?;
        let now = pg.now_ms()?;
        let leases: HashMap<String, Lease> = pg
            .leases()?
            .into_iter()
            .map(|l| (l.name.clone(), l))
            .collect();
        self.state().owners = leases
            .values()
            .filter(|l| l.expires_at_ms > now)
            .map(|l| (l.name.clone(), l.owner.clone()))
            .collect();
        for (name, here) in lifecycle.placed() {
            if self.state().over {
                return Ok(());
            }
            // A node stopping (SIGTERM's grace) keeps the leases of what it runs until its
            // turns end and it leaves: renewals stopped with the stop, another node took a
            // resident over mid-turn and ran that turn again, while this one's result was
            // refused. It claims and hands over nothing meanwhile.
            let stopping = lifecycle.stopping();
            let want = rendezvous::owner(&name, &live);
            if here {
                let Some(lease) = self.state().held.get(&name).cloned() else {
                    continue;
                };
                match pg.renew(&lease, self.ttl)? {
                    Some(renewed) => {
                        self.state().held.insert(name.clone(), renewed);
                    }
                    None => {
                        tracing::warn!(ai = %name, node = %self.node, "its lease was lost: it no longer runs here");
                        self.let_go(lifecycle, &name, false);
                        continue;
                    }
                }
                if stopping {
                    continue;
                }
                let adopted = self.state().adopted.contains(&name);
                if want.is_some_and(|w| w != self.node) && !adopted && lifecycle.at_rest(&name) {
                    tracing::info!(ai = %name, to = want.unwrap_or(""), "handed over");
                    self.let_go(lifecycle, &name, true);
                }
            } else if !stopping {
                let free = leases
                    .get(&name)
                    .is_none_or(|l| l.owner == self.node || l.expires_at_ms <= now);
                let unowned = {
                    let mut st = self.state();
                    let rounds = st.unowned.entry(name.clone()).or_default();
                    *rounds = if free { *rounds + 1 } else { 0 };
                    *rounds
                };
                if free && want == Some(self.node.as_str()) {
                    self.claim(lifecycle, &name)?;
                } else if free && unowned >= UNCLAIMED_ROUNDS {
                    // The node it belongs on does not run it: that node's program has no such
                    // resident (a program file that differs, say mid-deploy). Mail to it would
                    // be accepted and never served.
                    tracing::warn!(
                        ai = %name,
                        to = want.unwrap_or(""),
                        "no node took it for {unowned} rounds: it runs here (do all nodes run \
                         the same program file?)"
                    );
                    if self.claim(lifecycle, &name)? {
                        self.state().adopted.insert(name.clone());
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes `name`'s lease and runs it here: whether it does.
    fn claim(self: &Arc<Self>, lifecycle: &Lifecycle, name: &str) -> StoreResult<bool> {
        let Some(lease) = self.pg.acquire(name, &self.node, self.ttl)? else {
            return Ok(false);
        };
        self.fenced.hold(&lease);
        self.state().held.insert(name.to_string(), lease.clone());
        match lifecycle.claim(name) {
            Ok(_) => {
                tracing::info!(ai = %name, node = %self.node, token = lease.token, "claimed");
                self.read_mail(lifecycle, name);
                Ok(true)
            }
            Err(e) => {
                tracing::error!(ai = %name, "cannot start it here: {e}");
                self.state().held.remove(name);
                self.fenced.forget(name);
                let _ = self.pg.release(&lease);
                Ok(false)
            }
        }
    }

    /// Ends `name` here: its mail is no longer read, it is retired, and its lease, with
    /// `release`, is handed back at once.
    fn let_go(&self, lifecycle: &Lifecycle, name: &str, release: bool) {
        let (lease, consumer) = {
            let mut st = self.state();
            st.adopted.remove(name);
            (st.held.remove(name), st.consumers.remove(name))
        };
        if let Some(c) = consumer {
            c.abort();
        }
        lifecycle.retire(name);
        self.fenced.forget(name);
        if release
            && let Some(lease) = lease
            && let Err(e) = self.pg.release(&lease)
        {
            tracing::warn!(ai = %name, "cannot release its lease (it expires by itself): {e}");
        }
    }

    /// Starts reading `name`'s mail from its consumer into its mailbox.
    fn read_mail(self: &Arc<Self>, lifecycle: &Lifecycle, name: &str) {
        let shared = self.clone();
        let route = lifecycle.route().clone();
        let name = name.to_string();
        let key = name.clone();
        let task = self.handle.spawn(async move {
            loop {
                let take = |mut mail: Mail| {
                    let route = route.clone();
                    let pg = shared.pg.clone();
                    async move {
                        let kept = tokio::task::spawn_blocking(move || {
                            if let Err(e) = pg.fill_files(&mut mail.files) {
                                tracing::warn!(to = %mail.to, "cannot read its files: {e}");
                                return Err(MailError::NotSaved);
                            }
                            let files = route.core().files();
                            mail.files.iter().for_each(|f| files.remember(f));
                            route.mail_here(mail)
                        })
                        .await;
                        match kept {
                            Ok(Ok(())) => Taken::Kept,
                            Ok(Err(MailError::NoRecipient)) => Taken::NotHere,
                            Ok(Err(MailError::MailboxFull | MailError::NotSaved)) | Err(_) => {
                                Taken::Later
                            }
                            Ok(Err(e)) => {
                                tracing::warn!("mail refused: {}", e.as_str());
                                Taken::Refused
                            }
                        }
                    }
                };
                match shared.bus.consume(&name, take).await {
                    Ok(()) if route.resident(&name).is_none() => return,
                    Ok(()) => {}
                    Err(e) => tracing::warn!(ai = %name, "reading its mail again: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        if let Some(old) = self.state().consumers.insert(key, task.abort_handle()) {
            old.abort();
        }
    }
}

impl Placement for Cluster {
    fn node(&self) -> &str {
        &self.inner.node
    }

    fn start(&self, lifecycle: Lifecycle) {
        let shared = self.inner.clone();
        if shared.lifecycle.set(lifecycle.clone()).is_err() {
            return;
        }
        let every = shared.ttl / 3;
        let task = shared.handle.clone().spawn(async move {
            loop {
                let (s, l) = (shared.clone(), lifecycle.clone());
                let done = tokio::task::spawn_blocking(move || s.round(&l)).await;
                match done {
                    Ok(Err(e)) => tracing::warn!("placement round: {e}"),
                    Err(e) => tracing::error!("placement round: {e}"),
                    Ok(Ok(())) => {}
                }
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = shared.ended.notified() => return,
                }
            }
        });
        self.inner.state().rounds = Some(task.abort_handle());
    }

    fn ended(&self) {
        let shared = &self.inner;
        let (held, consumers, rounds) = {
            let mut st = shared.state();
            st.over = true;
            (
                std::mem::take(&mut st.held),
                std::mem::take(&mut st.consumers),
                st.rounds.take(),
            )
        };
        shared.ended.notify_one();
        if let Some(r) = rounds {
            r.abort();
        }
        for c in consumers.values() {
            c.abort();
        }
        off_worker(|| {
            for lease in held.values() {
                shared.fenced.forget(&lease.name);
                if let Err(e) = shared.pg.release(lease) {
                    tracing::warn!(ai = %lease.name, "cannot release its lease: {e}");
                }
            }
            if let Err(e) = shared.pg.leave(&shared.node, &shared.instance) {
                tracing::warn!(node = %shared.node, "cannot leave the cluster: {e}");
            }
        });
        tracing::info!(node = %shared.node, released = held.len(), "left the cluster");
    }

    fn forward(&self, mut mail: Mail) -> Result<Delivered, MailError> {
        let shared = &self.inner;
        let Some(lifecycle) = shared.lifecycle.get() else {
            return Err(MailError::NoRecipient);
        };
        let Some(max_hop) = lifecycle.placed_max_hop(&mail.to) else {
            return Err(MailError::NoRecipient);
        };
        if mail.hop > max_hop {
            return Err(MailError::HopLimit);
        }
        if mail.id.is_none() {
            // A redelivery after a crash must find it among the accepted ids.
            let n = shared.sent.fetch_add(1, Ordering::Relaxed);
            let at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            mail.id = Some(format!("colony:{}:{at:x}:{n}", shared.node));
        }
        off_worker(|| {
            if let Err(e) = shared.pg.put_files(&mail.files) {
                tracing::error!(to = %mail.to, "mail not accepted: cannot keep its files: {e}");
                return Err(MailError::NotSaved);
            }
            let _enter = shared.handle.enter();
            futures::executor::block_on(shared.bus.publish(&mail))
        })
    }

    fn node_of(&self, name: &str) -> Option<String> {
        self.inner.state().owners.get(name).cloned()
    }
}
