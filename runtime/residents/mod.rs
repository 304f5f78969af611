//! Hosting AIs as residents (DESIGN §1, §5).
//!
//! - [`route`]: the table of addressable AIs, the nursery their tasks run in, the stop and the
//!   shutdown grace, and settling (idle or blocked, nothing to bring mail). What an embedding
//!   application drives.
//! - [`resident`]: one resident's loop (mailbox ▸ backlog ▸ `take_turn` ▸ deliver), the outage
//!   path and the blocked state, and where replies go ([`resident::Deliver`]).
//! - [`mail`]: mail, provenance, the mailbox (which is also the held backlog).
//! - [`persist`]: what a resident writes to the store as its turns go (conversation, journal,
//!   audit), in the order that makes a restart safe.
//! - [`supervision`]: restart policies and the intensity limit, as in OTP.
//! - [`middleware`]: serving one inference step ([`middleware::Infer`]) and the layers that wrap
//!   it: `with_context` ([`middleware::Context`]) ▸ `with_breaker` ([`middleware::Breaker`]) ▸
//!   `with_retries` ([`middleware::Retries`]).
//!
//! The Lua side (`ai.route`, `ai.spawn`, `ai.mail`, `ai.watch`, sources) is in
//! [`crate::lua::residents`].

pub mod lifecycle;
pub mod mail;
pub mod middleware;
pub mod persist;
pub mod resident;
pub mod route;
pub mod supervision;

pub use lifecycle::{HireError, Lifecycle, Source, Watch, WatchError, WatchOptions};
pub use mail::{Mail, MailError, Mailbox, Provenance};
pub use resident::{Deliver, Delivery, DeliveryKind, Resident, ResidentInfo, ResidentSpec};
pub use route::{Listener, Route, RouteEvent, Settled, SpawnError};
pub use supervision::{Restart, RestartPolicy};
