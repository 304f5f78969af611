//! Hosting AIs as residents (`ARCHITECTURE.md`: "A running program", "The life of a mail").
//!
//! - [`lifecycle`]: a running program: residents hired before the watch, the watch and its
//!   states, the sources, the stop and its first reason, the grace, signals, the servers kept for
//!   the program's life. What `colony run`, an embedding application and a script drive.
//! - [`route`]: the table of addressable AIs, the nursery their tasks run in, the stop and the
//!   shutdown grace, and settling (idle or blocked, nothing to bring mail).
//! - [`resident`]: one resident's loop (mailbox ▸ backlog ▸ `take_turn` ▸ deliver), the outage
//!   path and the blocked state, and where replies go ([`resident::Deliver`]).
//! - [`mail`]: mail, provenance, the mailbox (which is also the held backlog).
//! - [`persist`]: what a resident writes to the store as its turns go (conversation, journal,
//!   audit), in the order that makes a restart safe.
//! - [`placement`]: where residents run when several nodes share a program (a cluster).
//! - [`breakers`]: where each breaker of the program's model calls stands, for a host's view.
//! - [`observe`]: what residents do, for an observer outside the program (turns, route events).
//! - [`budget`]: tokens and cost per resident and per program in a window, kept in the store;
//!   over it a resident is blocked with kind `budget` until the window resets. The prices are
//!   [`budget_prices`].
//! - [`supervision`]: restart policies and the intensity limit, as in OTP.
//! - The inference middleware the residents' turns go through is [`crate::infer`].
//!
//! A script reaches these through its host's translations (`ai.spawn`, `ai.mail`, `ai.watch`
//! ...); the residents reach the script only through [`crate::script::Script`].

pub mod breakers;
pub mod budget;
pub mod budget_prices;
pub mod lifecycle;
pub mod mail;
pub mod observe;
pub mod persist;
pub mod placement;
pub mod resident;
pub mod retention;
pub mod route;
pub mod supervision;

pub use lifecycle::{
    HireError, Lifecycle, ScriptEnd, Source, Watch, WatchError, WatchOptions, WeakLifecycle,
};
pub use mail::{Delivered, Mail, MailError, Mailbox, Provenance};
pub use observe::{Observation, Observer, TurnReport};
pub use placement::Placement;
pub use resident::{Deliver, Delivery, DeliveryKind, Resident, ResidentInfo, ResidentSpec};
pub use route::{Listener, Route, RouteEvent, Settled, SpawnError};
pub use supervision::{Restart, RestartPolicy};
