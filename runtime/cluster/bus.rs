//! Mail between nodes over NATS JetStream.
//!
//! One stream per program (`COLONY_MAIL_<program>`, the program's schema and its identity in
//! the store: two clusters may share a NATS server; work-queue retention, on disk), one subject
//! per resident (`colony.<program>.mail.<hash of the name>`: a name may hold characters a
//! subject cannot), and one durable pull consumer per resident, which only the node holding
//! its lease reads. A mail is published with `Nats-Msg-Id` = its resident's hash and its id
//! (an id is unique per resident, not across them), so JetStream keeps one copy of a mail sent
//! twice within its duplicate window; the sender's `ai.mail` answers once
//! JetStream has acknowledged it (it is on the server's disk). The owner acks a mail only once
//! it is in the resident's saved backlog; a mail delivered again after a crash finds its id
//! among the cell's accepted ids and is served once.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer, stream};
use futures::StreamExt;
use sha2::{Digest, Sha256};

use crate::residents::{Delivered, Mail, MailError};

/// How long a publish waits for JetStream's acknowledgement.
const PUBLISH_PATIENCE: Duration = Duration::from_secs(10);
/// How often the client pings the NATS server.
const PING_INTERVAL: Duration = Duration::from_secs(5);
/// How long a delivered mail may go unacknowledged before JetStream delivers it again (its
/// owner died with it in hand).
const ACK_WAIT: Duration = Duration::from_secs(10);
/// How long a mail the owner could not take yet (its mailbox full, the store unreachable)
/// waits before it is delivered again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A program's mail stream on one NATS server.
#[derive(Clone)]
pub struct Bus {
    js: jetstream::Context,
    stream: String,
    program: String,
    /// The server's address without credentials, for messages.
    shown: String,
}

/// What became of one delivered mail.
pub enum Taken {
    /// In the resident's saved backlog (or a repeat of one that is): ack it.
    Kept,
    /// Not now (mailbox full, store unreachable): deliver it again a little later.
    Later,
    /// The resident no longer runs here: deliver it again to whoever claims it.
    NotHere,
    /// Refused for good (a hop past its limit, a message that is not mail).
    Refused,
}

impl Bus {
    /// Connects to the NATS server at `url` and makes sure `program`'s stream exists.
    pub async fn connect(url: &str, program: &str) -> Result<Bus, super::JoinError> {
        use async_nats::ConnectErrorKind;
        let shown = shown(url);
        // Losing the NATS server (and finding it again) is said at WARN, as losing the database
        // is: it was said at INFO by the client alone, while mail to residents on other nodes
        // was refused.
        let told = shown.clone();
        let lost = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (address, login) = login(url);
        let mut options = async_nats::ConnectOptions::new();
        options = match login {
            Login::None => options,
            Login::Token(token) => options.token(token),
            Login::User(user, pass) => options.user_and_password(user, pass),
        };
        let client = options
            .name(format!("colony {program}"))
            // A server lost without a word (a partition, a machine gone) is noticed within two
            // pings, not the client's default of minutes: mail meant for it is refused at once
            // from then on, not handed to the client's buffer.
            .ping_interval(PING_INTERVAL)
            .event_callback(move |event| {
                let (told, lost) = (told.clone(), lost.clone());
                async move {
                    use std::sync::atomic::Ordering;
                    match event {
                        async_nats::Event::Disconnected => {
                            lost.store(true, Ordering::Relaxed);
                            tracing::warn!(
                                "lost the NATS server at {told}: mail to residents on other \
                                 nodes is refused until it is back"
                            );
                        }
                        async_nats::Event::Connected if lost.swap(false, Ordering::Relaxed) => {
                            tracing::warn!("reached the NATS server at {told} again");
                        }
                        _ => {}
                    }
                }
            })
            .connect(address.as_str())
            .await
            .map_err(|e| super::JoinError {
                // An address that does not parse, or credentials refused, stay so.
                again: !matches!(
                    e.kind(),
                    ConnectErrorKind::ServerParse
                        | ConnectErrorKind::Authentication
                        | ConnectErrorKind::AuthorizationViolation
                ),
                message: format!("cannot reach the NATS server at {shown}: {e}"),
            })?;
        let bus = Bus {
            js: jetstream::new(client),
            stream: format!("COLONY_MAIL_{program}"),
            program: program.to_string(),
            shown,
        };
        bus.open_stream().await.map_err(|e| {
            super::JoinError::from(format!("{e} (is JetStream enabled, `nats-server -js`?)"))
        })?;
        Ok(bus)
    }

    /// The program's stream, made if the server does not have it: at the start, and whenever
    /// it is found gone. A NATS server that came back without its data (a lost disk, a fresh
    /// server behind the same address) had no stream, and mail between nodes was refused until
    /// a program restarted.
    async fn open_stream(&self) -> Result<stream::Stream, String> {
        self.js
            .get_or_create_stream(stream::Config {
                name: self.stream.clone(),
                subjects: vec![format!("colony.{}.mail.*", self.program)],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .map_err(|e| {
                format!(
                    "{}: cannot open the stream {}: {e}",
                    self.shown, self.stream
                )
            })
    }

    fn subject(&self, name: &str) -> String {
        format!("colony.{}.mail.{}", self.program, token(name))
    }

    /// Sends `mail` (which has an id) to its resident's subject; `Ok` once JetStream has it.
    /// Publishes `mail` to its resident's subject: whether JetStream took it as new or as a
    /// repeat of an id it holds (its window: two minutes).
    pub async fn publish(&self, mail: &Mail) -> Result<Delivered, MailError> {
        let body = match serde_json::to_vec(mail) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(to = %mail.to, "mail not sent: cannot write it as JSON: {e}");
                return Err(MailError::NotSaved);
            }
        };
        // Known to be away: refused at once. Handed to the client, the mail waited out the
        // publish's patience, was answered as not accepted, and was sent all the same from
        // the client's buffer once the server was back (served, and served again when its
        // sender sent it once more without an id). One handed over as the link fails, before
        // the client knows, may still arrive so: `not_saved` says it may have been kept, as it
        // does of a store that went away as it saved, and its id makes sending it again safe.
        let state = self.js.client().connection_state();
        if state != async_nats::connection::State::Connected {
            tracing::error!(
                to = %mail.to,
                "mail not accepted: the NATS server at {} is not reachable now",
                self.shown
            );
            return Err(MailError::NotSaved);
        }
        let mut message = jetstream::message::PublishMessage::build().payload(body.into());
        if let Some(id) = &mail.id {
            // An id names a mail to one resident: the same id to another is another mail.
            message = message.message_id(format!("{}/{id}", token(&mail.to)));
        }
        let send = |message: jetstream::message::PublishMessage| async {
            self.js
                .send_publish(self.subject(&mail.to), message)
                .await?
                .await
        };
        let sent = async {
            match send(message.clone()).await {
                Err(e) if e.kind() == jetstream::context::PublishErrorKind::StreamNotFound => {
                    tracing::warn!(
                        "the stream {} is gone from the NATS server at {} (a server that came \
                         back without its data?): making it again",
                        self.stream,
                        self.shown
                    );
                    self.open_stream().await?;
                    send(message).await.map_err(|e| e.to_string())
                }
                other => other.map_err(|e| e.to_string()),
            }
        };
        match tokio::time::timeout(PUBLISH_PATIENCE, sent).await {
            // A repeat through a node that does not run the resident was `duplicate: false`.
            Ok(Ok(ack)) if ack.duplicate => Ok(Delivered::Repeated),
            Ok(Ok(_)) => Ok(Delivered::New),
            Ok(Err(e)) => {
                tracing::error!(to = %mail.to, "mail not accepted: {}: {e}", self.shown);
                Err(MailError::NotSaved)
            }
            Err(_) => {
                tracing::error!(
                    to = %mail.to,
                    "mail not accepted: {} did not acknowledge it within {} s",
                    self.shown,
                    PUBLISH_PATIENCE.as_secs()
                );
                Err(MailError::NotSaved)
            }
        }
    }

    /// Reads `name`'s mail until `take` answers [`Taken::NotHere`] or the connection fails
    /// (the caller reads again), handing each to `take` in order and acking what it kept.
    pub async fn consume<F, Fut>(&self, name: &str, mut take: F) -> Result<(), String>
    where
        F: FnMut(Mail) -> Fut,
        Fut: std::future::Future<Output = Taken>,
    {
        let durable = format!("r{}", token(name));
        let stream = self.open_stream().await?;
        let consumer: consumer::PullConsumer = stream
            .get_or_create_consumer(
                &durable,
                consumer::pull::Config {
                    durable_name: Some(durable.clone()),
                    filter_subject: self.subject(name),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: ACK_WAIT,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| format!("{}: cannot open the consumer of {name:?}: {e}", self.shown))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| format!("{}: cannot read the mail of {name:?}: {e}", self.shown))?;
        while let Some(message) = messages.next().await {
            let message = message.map_err(|e| format!("{}: {e}", self.shown))?;
            let taken = match serde_json::from_slice::<Mail>(&message.payload) {
                Ok(mail) if mail.to == name => take(mail).await,
                Ok(mail) => {
                    tracing::error!(to = %mail.to, "mail on the subject of {name:?}: dropped");
                    Taken::Refused
                }
                Err(e) => {
                    tracing::error!(ai = %name, "a message that is not mail: dropped: {e}");
                    Taken::Refused
                }
            };
            let acked = match taken {
                Taken::Kept => message.double_ack().await,
                Taken::Later => message.ack_with(AckKind::Nak(Some(RETRY_AFTER))).await,
                Taken::NotHere => {
                    let _ = message.ack_with(AckKind::Nak(None)).await;
                    return Ok(());
                }
                Taken::Refused => message.ack_with(AckKind::Term).await,
            };
            if let Err(e) = acked {
                tracing::warn!(ai = %name, "{}: cannot acknowledge a mail: {e}", self.shown);
            }
        }
        Ok(())
    }
}

/// A resident's name as one subject token: the first 16 bytes of its SHA-256, in hex.
fn token(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// The credentials a NATS URL carries (`nats://user:pass@host`, `nats://token@host`).
#[derive(Debug, PartialEq)]
enum Login {
    None,
    Token(String),
    User(String, String),
}

/// `url` without its credentials, and them: the NATS client reads none from the URL (a server
/// that asks for a password refused the node), and prints the URL it is given in its debug
/// log at every connection attempt. A URL that does not parse is passed on as it is, for the
/// client to refuse.
fn login(url: &str) -> (String, Login) {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return (url.to_string(), Login::None);
    };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let user = decode(parsed.username());
    let login = match parsed.password().map(decode) {
        Some(pass) => Login::User(user, pass),
        None if !user.is_empty() => Login::Token(user),
        None => return (url.to_string(), Login::None),
    };
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    (parsed.to_string(), login)
}

/// `url` as messages show it: its password `***`, whether or not the rest parses (one with a
/// port that is not a number was shown whole, password and all).
pub fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(_) => url.to_string(),
        Err(_) => {
            let Some(start) = url.find("://").map(|i| i + 3) else {
                return url.to_string();
            };
            let end = url[start..].find('/').map_or(url.len(), |i| start + i);
            let Some(at) = url[start..end].rfind('@').map(|i| start + i) else {
                return url.to_string();
            };
            match url[start..at].find(':').map(|i| start + i) {
                Some(colon) => format!("{}:***{}", &url[..colon], &url[at..]),
                None => url.to_string(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_credentials_leave_the_url() {
        assert_eq!(
            login("nats://colony:Nats%40PW@127.0.0.1:4222"),
            (
                "nats://127.0.0.1:4222".to_string(),
                Login::User("colony".into(), "Nats@PW".into())
            )
        );
        assert_eq!(
            login("tls://s3cr3t-token@nats.example:4222"),
            (
                "tls://nats.example:4222".to_string(),
                Login::Token("s3cr3t-token".into())
            )
        );
        assert_eq!(
            login("nats://127.0.0.1:4222"),
            ("nats://127.0.0.1:4222".to_string(), Login::None)
        );
    }

    #[test]
    fn a_password_is_never_shown_even_in_a_url_that_does_not_parse() {
        assert_eq!(
            shown("nats://user:NatsPW77@127.0.0.1:4222"),
            "nats://user:***@127.0.0.1:4222"
        );
        assert_eq!(
            shown("nats://user:NatsPW77@127.0.0.1:notaport"),
            "nats://user:***@127.0.0.1:notaport"
        );
        assert_eq!(
            shown("http://user:NatsPW77@host/x"),
            "http://user:***@host/x"
        );
        assert_eq!(shown("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
    }

    #[test]
    fn a_token_is_a_subject_token_whatever_the_name() {
        for name in ["desk", "a.b", "with space", "*", ">", "ünï"] {
            let t = token(name);
            assert_eq!(t.len(), 32);
            assert!(t.chars().all(|c| c.is_ascii_hexdigit()), "{t}");
        }
        assert_ne!(token("a"), token("b"));
    }

    #[test]
    fn a_password_is_not_shown() {
        assert_eq!(
            shown("nats://colony:secret@127.0.0.1:4222"),
            "nats://colony:***@127.0.0.1:4222"
        );
        assert_eq!(shown("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
    }
}
