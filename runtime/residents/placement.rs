//! Where a program's residents run when several nodes share them: the core's side of a
//! cluster (`crate::cluster` is the one that exists).
//!
//! Without a [`Placement`], every resident a program hires runs in this process. With one, a
//! resident that keeps its conversation is *placed*: the [`super::Lifecycle`] keeps it dormant
//! (shown as [`super::resident::State::Elsewhere`]) until the placement, holding its lease,
//! claims it here ([`super::Lifecycle::claim`]), and retires it again when the lease is handed
//! over or lost ([`super::Lifecycle::retire`]). Mail to a placed resident that is not here goes
//! to [`Placement::forward`], which answers once the node that runs it is sure to get it. A
//! resident that keeps nothing has no state to move: it runs on every node, as before.

use super::Lifecycle;
use super::mail::{Delivered, Mail, MailError};
use super::resident::ResidentSpec;

/// The placement of one program's residents over the nodes of a cluster.
pub trait Placement: Send + Sync {
    /// This node's name, as each resident running here shows it.
    fn node(&self) -> &str;

    /// Whether `spec` is placed (on one node at a time) instead of run here at once.
    fn places(&self, spec: &ResidentSpec) -> bool {
        spec.persist
    }

    /// The program's watch is up: placement starts driving `lifecycle` (claiming, handing
    /// over, taking over the residents of a node that is gone).
    fn start(&self, lifecycle: Lifecycle);

    /// The program's watch has ended and its turns have finished: what this node held is
    /// handed over at once (the other nodes need not wait for its leases to expire).
    fn ended(&self);

    /// Mail to the placed resident `mail.to`, which is not running here: `Ok` once the node
    /// that runs it (now or later) is sure to get it, [`Delivered::Repeated`] when the cluster
    /// held a mail of that id already.
    fn forward(&self, mail: Mail) -> Result<Delivered, MailError>;

    /// The node that runs the placed resident `name`, if one does.
    fn node_of(&self, name: &str) -> Option<String>;
}
