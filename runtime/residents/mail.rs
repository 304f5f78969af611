//! Mail and the mailbox a resident reads it from.
//!
//! A mailbox is a queue behind a mutex plus a [`Notify`]: an idle resident costs one empty
//! `VecDeque` (no allocation) and a few words, which matters when a program hires a hundred
//! thousand of them. The queue is also the resident's backlog: while the model cannot be called
//! (the outage path, `ARCHITECTURE.md`) arrivals stay in it, bounded to the newest [`HELD`], and the count
//! of older ones the bound discarded is kept beside them for the dropped marker.
//!
//! A mailbox has a capacity ([`CAPACITY`] waiting mails unless the resident is hired with its
//! own): past it a post is refused with [`MailError::MailboxFull`], so a resident slower than its
//! senders pushes back on them instead of growing without limit. The refusals are counted.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::vocab::{FileRef, Message, Part};

/// How many arrivals a resident holds while its model cannot be called, and the most one turn
/// serves at once.
pub const HELD: usize = 24;

/// How many waiting mails a mailbox takes unless its resident is hired with another capacity.
pub const CAPACITY: usize = 10_000;

/// One report posted to a resident.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Mail {
    pub to: String,
    /// Who or what sent it (a person, a clock, another AI): the label of the user turn.
    pub source: String,
    pub content: String,
    /// How many relays it has passed through: 0 for a person or a clock.
    pub hop: u32,
    /// Attached files, by reference (a store keeps their bytes beside the backlog).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "files_or_paths"
    )]
    pub files: Vec<FileRef>,
    /// The sender's name for this mail. A resident that keeps its conversation accepts an id
    /// once: posting it again (a sender that restarted before it recorded the first answer)
    /// answers `true` without a second copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The row it was saved as in its recipient's kept backlog, once saved
    /// ([`crate::store::Store::push_backlog`]): the commit of the turn that serves it removes
    /// that row and no other. Removing "the first N rows" went wrong whenever the saved backlog
    /// and the queue differed (a save that committed but whose answer was lost, when the store
    /// went away, left a row no queue held): each later turn removed the row before its own,
    /// and a takeover served the one left again. Where the mail is kept, not what it says: it
    /// is not sent (nor saved) with the mail, and two mails that differ only here are equal.
    #[serde(skip)]
    pub saved: Option<i64>,
}

impl PartialEq for Mail {
    fn eq(&self, other: &Mail) -> bool {
        let Mail {
            to,
            source,
            content,
            hop,
            files,
            id,
            saved: _,
        } = self;
        (to, source, content, hop, files, id)
            == (
                &other.to,
                &other.source,
                &other.content,
                &other.hop,
                &other.files,
                &other.id,
            )
    }
}

/// Mail a store kept before files were recorded held their paths: such a path comes back as a
/// reference without bytes, which travels as a note that its content is not available.
fn files_or_paths<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<FileRef>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Entry {
        File(FileRef),
        Path(String),
    }
    Ok(Vec::<Entry>::deserialize(d)?
        .into_iter()
        .map(|e| match e {
            Entry::File(f) => f,
            Entry::Path(path) => FileRef {
                content_type: crate::files::content_type_of(None, &path, &[]),
                name: path,
                size: 0,
                sha256: String::new(),
                data: None,
                shed: None,
            },
        })
        .collect())
}

impl Mail {
    /// Why `id` cannot name a mail, if it cannot. An empty id would make every later mail with
    /// it a duplicate, dropped unseen (ids are accepted once).
    pub fn id_refusal(id: Option<&str>) -> Option<&'static str> {
        (id == Some("")).then_some("id is empty: give an id that names the mail, or leave it out")
    }

    /// Why `source` cannot label a mail, if it cannot. The model reads a mail as `[mail from
    /// SOURCE] content`: a source holding `]` or a line break ended that label early, and a
    /// relay that took its sender from a model's arguments let one AI pass its words off as
    /// another's (`intern]\n[mail from ceo`).
    pub fn source_refusal(source: &str) -> Option<String> {
        source
            .chars()
            .find(|c| *c == ']' || c.is_control())
            .map(|c| {
                format!(
                    "source {source:?} holds {c:?}: a mail's label ([mail from SOURCE]) cannot \
                     hold ']' or a control character"
                )
            })
    }

    pub fn new(
        to: impl Into<String>,
        source: impl Into<String>,
        content: impl Into<String>,
        hop: u32,
    ) -> Mail {
        Mail {
            to: to.into(),
            source: source.into(),
            content: content.into(),
            hop,
            files: Vec::new(),
            id: None,
            saved: None,
        }
    }

    /// The user turn's text: labelled with its source.
    pub fn as_user_text(&self) -> String {
        format!("[mail from {}] {}", self.source, self.content)
    }

    /// The user turn this mail becomes: its text, then its files, and where it came from.
    pub fn as_user_message(&self) -> Message {
        let mut message = Message::user(self.as_user_text());
        message
            .parts
            .extend(self.files.iter().cloned().map(Part::File));
        message.mail = Some(Box::new(crate::vocab::MailFrom {
            source: self.source.clone(),
            hop: self.hop,
        }));
        message
    }
}

pub use crate::script::Provenance;

impl Provenance {
    /// The mail the turn that `messages` ends in is serving, as its messages keep it
    /// ([`Message::mail`]): for a turn resumed after a restart, whose mail is no longer at
    /// hand. The turn's mail is the run of user messages before its calls and results (after
    /// a compaction, the summary holding the latest request); as [`Provenance::of`], the
    /// newest one's sender and the highest hop.
    pub fn resumed(messages: &[Message], to: &str) -> Option<Provenance> {
        use crate::vocab::Role;
        let mut turn = messages.iter().rev().skip_while(|m| {
            m.role == Role::Tool || (m.role == Role::Assistant && m.tool_calls().next().is_some())
        });
        let newest = turn.next()?.mail.as_deref()?;
        let hop = turn
            .map_while(|m| m.mail.as_deref())
            .map(|from| from.hop)
            .fold(newest.hop, u32::max);
        Some(Provenance {
            origin: newest.source.clone(),
            hop,
            to: to.to_string(),
        })
    }

    /// For a turn serving several arrivals: the newest one's sender and the highest hop, so a
    /// relay chain cannot shorten itself by being batched.
    pub fn of(batch: &[Mail]) -> Option<Provenance> {
        let last = batch.last()?;
        Some(Provenance {
            origin: last.source.clone(),
            hop: batch.iter().map(|m| m.hop).max().unwrap_or(0),
            to: last.to.clone(),
        })
    }
}

/// What became of a mail that was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// Queued for its recipient.
    New,
    /// Its id was one the recipient's store had accepted before (a sender's retry, across a
    /// restart): acknowledged, not queued again.
    Repeated,
}

/// Why a mail was not posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MailError {
    /// Nobody of that name is registered (or the watch is not up, or it has died).
    #[error("no_recipient")]
    NoRecipient,
    /// The hop count passed the recipient's `max_hop`.
    #[error("hop_limit")]
    HopLimit,
    /// The recipient keeps its conversation and the mail could not be saved: not accepted.
    #[error("not_saved")]
    NotSaved,
    /// The recipient's mailbox holds as many waiting mails as its capacity: not accepted (an
    /// HTTP front answers 429). Sending again once it has served some succeeds.
    #[error("mailbox_full")]
    MailboxFull,
}

impl MailError {
    pub fn as_str(self) -> &'static str {
        match self {
            MailError::NoRecipient => "no_recipient",
            MailError::HopLimit => "hop_limit",
            MailError::NotSaved => "not_saved",
            MailError::MailboxFull => "mailbox_full",
        }
    }
}

/// A resident's incoming mail.
pub struct Mailbox {
    inbox: Mutex<Inbox>,
    notify: Notify,
    /// The most mails that may wait at once.
    capacity: usize,
}

impl Default for Mailbox {
    fn default() -> Mailbox {
        Mailbox::with_capacity(CAPACITY)
    }
}

#[derive(Default)]
struct Inbox {
    queue: VecDeque<Mail>,
    /// Older arrivals the bound discarded during this outage.
    dropped: u64,
    /// Set while the model cannot be called: the queue keeps only the newest [`HELD`].
    holding: bool,
    /// A resident that keeps its conversation never drops: each mail it accepted is saved and
    /// will be served (the capacity bounds the queue). Holding dropped the older ones here and
    /// from the saved backlog, which a crash at the same moment would have kept.
    keeps_all: bool,
    closed: bool,
    /// Posts refused because the mailbox was full, since it was made.
    refused: u64,
    /// Mails that reached the conversation, since it was made.
    served: u64,
    /// A save failed, perhaps after it committed (the store went away as it answered): the
    /// saved backlog may hold a row no queue does ([`Mailbox::resync`]).
    unsure: bool,
    /// Senders awaiting a reply (an MCP call to an exported resident): holding never drops
    /// their mail, whose caller was left waiting for its deadline, never told.
    awaited: Vec<String>,
}

impl Inbox {
    fn trim(&mut self) {
        if self.holding && !self.keeps_all {
            while self.queue.len() > HELD {
                let awaited = &self.awaited;
                let Some(oldest) = self.queue.iter().position(|m| !awaited.contains(&m.source))
                else {
                    break;
                };
                self.queue.remove(oldest);
                self.dropped += 1;
            }
        }
    }
}

/// A batch of arrivals taken for one turn, and what the bound discarded before them.
#[derive(Debug, Default)]
pub struct Batch {
    pub mail: Vec<Mail>,
    pub dropped: u64,
}

impl Mailbox {
    pub fn new() -> Mailbox {
        Mailbox::default()
    }

    /// A mailbox that refuses a post while `capacity` mails are waiting (at least one is).
    pub fn with_capacity(capacity: usize) -> Mailbox {
        Mailbox {
            inbox: Mutex::new(Inbox::default()),
            notify: Notify::new(),
            capacity: capacity.max(1),
        }
    }

    /// [`Mailbox::with_capacity`] for a resident that keeps its conversation: nothing it
    /// accepted is dropped while its model cannot be called.
    pub fn keeping_all(capacity: usize) -> Mailbox {
        let mailbox = Mailbox::with_capacity(capacity);
        mailbox.lock().keeps_all = true;
        mailbox
    }

    /// The most mails that may wait at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Refuses (and counts) a post to a full mailbox.
    fn check_room(&self, inbox: &mut Inbox) -> Result<(), MailError> {
        if inbox.queue.len() >= self.capacity {
            inbox.refused += 1;
            return Err(MailError::MailboxFull);
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Posts `mail`; at most once: a closed mailbox refuses it, and so does a full one.
    pub fn post(&self, mail: Mail) -> Result<(), MailError> {
        {
            let mut inbox = self.lock();
            if inbox.closed {
                return Err(MailError::NoRecipient);
            }
            self.check_room(&mut inbox)?;
            inbox.queue.push_back(mail);
            inbox.trim();
        }
        self.notify.notify_one();
        Ok(())
    }

    /// Puts back mail accepted before a restart (the saved backlog), oldest first.
    pub fn restore(&self, mail: Vec<Mail>) {
        self.lock().queue.extend(mail);
    }

    /// Posts `mail` after `save` has written it down, both under the mailbox's lock, so the order
    /// of the saved backlog is the order of the queue. `save` answers the row the mail was saved
    /// as (kept with it, [`Mail::saved`]), or `None` for a repeated id, acknowledged and not
    /// queued again. A full mailbox refuses before `save` runs, so nothing is written for a
    /// mail that is not accepted.
    pub fn post_saved<E>(
        &self,
        mut mail: Mail,
        save: impl FnOnce(&Mail) -> Result<Option<i64>, E>,
    ) -> Result<Result<Delivered, MailError>, E> {
        {
            let mut inbox = self.lock();
            if inbox.closed {
                return Ok(Err(MailError::NoRecipient));
            }
            if let Err(e) = self.check_room(&mut inbox) {
                return Ok(Err(e));
            }
            let Some(row) = save(&mail)? else {
                return Ok(Ok(Delivered::Repeated));
            };
            mail.saved = Some(row);
            inbox.queue.push_back(mail);
            inbox.trim();
        }
        self.notify.notify_one();
        Ok(Ok(Delivered::New))
    }

    /// A save for this mailbox failed in a way that may have kept the mail all the same: the
    /// resident compares the saved backlog with its queue when next between turns.
    pub fn unsure(&self) {
        self.lock().unsure = true;
        self.notify.notify_one();
    }

    /// Whether [`Mailbox::unsure`] was said and no [`Mailbox::resync`] has settled it since.
    pub fn is_unsure(&self) -> bool {
        self.lock().unsure
    }

    /// Queues the mail of the saved backlog (`load`) that the queue does not hold and that is
    /// not among `unserved` (rows of mail already in the conversation whose removal has not
    /// landed): mail whose save committed though its sender was told it was not saved (or,
    /// from another node, was told so and sent it again, answered as a repeat), which would
    /// otherwise wait for the next restart or takeover. Called between turns, so no other mail
    /// is in flight; the lock is held across the read, as [`Mailbox::post_saved`] holds it
    /// across its save, so a mail being posted is not taken for a lost one. The number queued.
    pub fn resync<E>(
        &self,
        load: impl FnOnce() -> Result<Vec<Mail>, E>,
        unserved: &[i64],
    ) -> Result<usize, E> {
        let mut inbox = self.lock();
        if !inbox.unsure {
            return Ok(0);
        }
        let saved = load()?;
        inbox.unsure = false;
        let held: std::collections::HashSet<i64> =
            inbox.queue.iter().filter_map(|m| m.saved).collect();
        let lost: Vec<Mail> = saved
            .into_iter()
            .filter(|m| {
                m.saved
                    .is_some_and(|row| !held.contains(&row) && !unserved.contains(&row))
            })
            .collect();
        let found = lost.len();
        for mail in lost {
            // In the order of the rows, as they were saved.
            let at = inbox
                .queue
                .iter()
                .position(|m| m.saved.is_some_and(|row| Some(row) > mail.saved))
                .unwrap_or(inbox.queue.len());
            inbox.queue.insert(at, mail);
        }
        drop(inbox);
        if found > 0 {
            self.notify.notify_one();
        }
        Ok(found)
    }

    /// Takes up to [`HELD`] arrivals, oldest first, with the dropped count.
    pub fn take(&self) -> Batch {
        let mut inbox = self.lock();
        let n = inbox.queue.len().min(HELD);
        Batch {
            mail: inbox.queue.drain(..n).collect(),
            dropped: inbox.dropped,
        }
    }

    /// [`Mailbox::take`], but a mail `alone` picks is served in a turn of its own: the batch
    /// is that mail when it comes first, else what waits before it. (A caller waiting for the
    /// reply to its mail gets the reply to that mail, not to others served with it.)
    pub fn take_apart(&self, alone: impl Fn(&Mail) -> bool) -> Batch {
        let mut inbox = self.lock();
        let waiting = inbox.queue.len().min(HELD);
        let n = match inbox.queue.iter().take(waiting).position(alone) {
            Some(0) => 1,
            Some(at) => at,
            None => waiting,
        };
        Batch {
            mail: inbox.queue.drain(..n).collect(),
            dropped: inbox.dropped,
        }
    }

    /// Mail from `source` has a caller awaiting its reply: never dropped while held.
    pub fn awaited(&self, source: &str) {
        self.lock().awaited.push(source.to_string());
    }

    /// Mail from `source` no longer has a caller (answered, or it gave up): the mail of it still
    /// waiting and not saved is taken out (a call cancelled or timed out was served later all
    /// the same, at a model's cost, into a conversation its caller had left); how many.
    pub fn unawaited(&self, source: &str) -> usize {
        let mut inbox = self.lock();
        inbox.awaited.retain(|s| s != source);
        let before = inbox.queue.len();
        inbox
            .queue
            .retain(|m| m.source != source || m.saved.is_some());
        before - inbox.queue.len()
    }

    /// Puts back a batch whose turn could not be served, ahead of what arrived since, and holds
    /// from now on: only the newest [`HELD`] stay.
    pub fn put_back(&self, batch: Batch) {
        let mut inbox = self.lock();
        for m in batch.mail.into_iter().rev() {
            inbox.queue.push_front(m);
        }
        inbox.holding = true;
        inbox.trim();
    }

    /// Puts back a batch whose turn cannot be served until the resident's settings change (it
    /// is blocked), ahead of what arrived since. Nothing is discarded: a blocked resident loses
    /// no mail, however long it waits.
    pub fn keep(&self, batch: Batch) {
        let mut inbox = self.lock();
        for m in batch.mail.into_iter().rev() {
            inbox.queue.push_front(m);
        }
        inbox.holding = false;
    }

    /// The batch is in the conversation now (its dropped count reported with it). `recovered`:
    /// its turn succeeded, so the outage (if any) is over and the bound lifts; a turn that failed
    /// after a step ran keeps holding.
    pub fn served(&self, batch: &Batch, recovered: bool) {
        let mut inbox = self.lock();
        if recovered {
            inbox.holding = false;
        }
        inbox.dropped = inbox.dropped.saturating_sub(batch.dropped);
        inbox.served += batch.mail.len() as u64;
    }

    /// Arrivals waiting.
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Older arrivals discarded by the bound in the current outage.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Posts refused because the mailbox was full.
    pub fn refused(&self) -> u64 {
        self.lock().refused
    }

    /// Mails that reached the conversation (a turn served them).
    pub fn served_count(&self) -> u64 {
        self.lock().served
    }

    /// Refuses all later mail.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_one();
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Waits until something is posted (or the mailbox is woken).
    pub async fn notified(&self) {
        self.notify.notified().await
    }

    /// Wakes the resident without mail (to see a stop).
    pub fn wake(&self) {
        self.notify.notify_one();
    }
}

/// The one-line marker a turn after an outage reads before the held arrivals.
pub fn dropped_marker(dropped: u64) -> String {
    let noun = if dropped == 1 { "message" } else { "messages" };
    format!(
        "[colony] {dropped} older {noun} arrived while the model could not be called and were \
         dropped; the newest {HELD} follow."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mail(n: usize) -> Mail {
        Mail::new("a", "t", format!("m{n}"), 0)
    }

    /// A turn resumed after a restart knows its mail's origin from its messages: the newest
    /// mail's sender, the highest hop of the batch, past the step's calls and results.
    #[test]
    fn a_resumed_turn_reads_its_provenance_from_its_messages() {
        use crate::vocab::{Part, Role, ToolCall};
        let from = |source: &str, hop: u32| Mail {
            hop,
            ..Mail::new("r", source, "x", hop)
        };
        let call = Message::new(
            Role::Assistant,
            vec![Part::ToolCall(ToolCall {
                id: "c1".into(),
                name: "t".into(),
                arguments: "{}".into(),
                opaque: None,
            })],
        );
        let messages = vec![
            from("old", 9).as_user_message(),
            Message::assistant("done before"),
            from("a", 3).as_user_message(),
            from("b", 1).as_user_message(),
            call,
        ];
        let p = Provenance::resumed(&messages, "r").expect("its mail");
        assert_eq!((p.origin.as_str(), p.hop, p.to.as_str()), ("b", 3, "r"));
        assert_eq!(
            Provenance::resumed(&[Message::user("a script's turn")], "r"),
            None
        );
    }

    /// After a failed save, the saved backlog's rows that neither the queue holds nor a turn
    /// served are queued, in the order of their rows; nothing is compared unless it was said.
    #[test]
    fn a_resync_queues_the_saved_mail_no_one_holds() {
        let saved = |n: usize| Mail {
            saved: Some(n as i64),
            ..mail(n)
        };
        let b = Mailbox::keeping_all(CAPACITY);
        let all = || Ok::<_, ()>(vec![saved(1), saved(2), saved(3), saved(4), saved(5)]);
        assert_eq!(b.resync(all, &[]), Ok(0), "not unsure: not compared");
        b.post_saved(mail(2), |_| Ok::<_, ()>(Some(2)))
            .unwrap()
            .unwrap();
        b.post_saved(mail(5), |_| Ok::<_, ()>(Some(5)))
            .unwrap()
            .unwrap();
        b.unsure();
        assert!(b.is_unsure());
        // 1 and 4 were kept though their senders were told otherwise; 3 is in the conversation
        // already (its removal has not landed).
        assert_eq!(
            b.resync(|| Err(()), &[3]),
            Err(()),
            "the store cannot be read"
        );
        assert!(b.is_unsure(), "tried again later");
        assert_eq!(b.resync(all, &[3]), Ok(2));
        assert!(!b.is_unsure());
        let queued: Vec<Option<i64>> = b.take().mail.iter().map(|m| m.saved).collect();
        assert_eq!(queued, [Some(1), Some(2), Some(4), Some(5)]);
    }

    /// Mail whose caller awaits its reply is not dropped while held (the caller waited out its
    /// deadline, never told), and a caller that gives up takes back its mail still waiting.
    #[test]
    fn holding_keeps_awaited_mail_and_a_caller_gone_takes_its_mail_back() {
        let b = Mailbox::new();
        b.awaited("caller");
        b.post(Mail::new("a", "caller", "asked", 0)).unwrap();
        b.put_back(Batch::default());
        for n in 1..30 {
            b.post(mail(n)).unwrap();
        }
        assert_eq!(b.len(), HELD);
        assert_eq!(b.dropped(), 6);
        assert_eq!(b.unawaited("caller"), 1);
        assert_eq!(b.len(), HELD - 1);
        let batch = b.take();
        assert!(
            batch.mail.iter().all(|m| m.source == "t"),
            "{:?}",
            batch.mail
        );
        // No longer awaited: held like any other.
        b.post(Mail::new("a", "caller", "again", 0)).unwrap();
        for n in 0..30 {
            b.post(mail(n)).unwrap();
        }
        assert!(b.take().mail.iter().all(|m| m.source == "t"));
    }

    #[test]
    fn holding_keeps_the_newest_and_counts_the_rest() {
        let b = Mailbox::new();
        b.post(mail(0)).unwrap();
        let batch = b.take();
        assert_eq!(batch.mail.len(), 1);
        b.put_back(batch);
        for n in 1..30 {
            b.post(mail(n)).unwrap();
        }
        assert_eq!(b.len(), HELD);
        assert_eq!(b.dropped(), 6);
        let batch = b.take();
        assert_eq!(batch.mail[0].content, "m6");
        assert_eq!(batch.dropped, 6);
        b.served(&batch, true);
        assert_eq!(b.dropped(), 0);
        // Not holding: nothing is discarded.
        for n in 0..30 {
            b.post(mail(n)).unwrap();
        }
        assert_eq!(b.len(), 30);
    }

    #[test]
    fn a_full_mailbox_refuses_until_one_is_served() {
        let b = Mailbox::with_capacity(3);
        for n in 0..3 {
            b.post(mail(n)).unwrap();
        }
        assert_eq!(b.post(mail(3)), Err(MailError::MailboxFull));
        assert_eq!(b.refused(), 1);
        let mut saved = 0;
        let refused = b.post_saved(mail(3), |_| {
            saved += 1;
            Ok::<_, ()>(Some(1))
        });
        assert_eq!(refused, Ok(Err(MailError::MailboxFull)));
        assert_eq!(saved, 0, "a refused mail is not saved");
        assert_eq!(b.refused(), 2);
        let batch = b.take();
        b.served(&batch, true);
        assert_eq!(b.served_count(), 3);
        b.post(mail(4)).unwrap();
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn closed_refuses() {
        let b = Mailbox::new();
        b.close();
        assert_eq!(b.post(mail(0)), Err(MailError::NoRecipient));
    }

    #[test]
    fn provenance_takes_the_highest_hop() {
        let mut a = mail(0);
        a.hop = 3;
        let mut b = mail(1);
        b.source = "z".into();
        let p = Provenance::of(&[a, b]).unwrap();
        assert_eq!((p.origin.as_str(), p.hop), ("z", 3));
    }
}

#[cfg(test)]
mod files_tests {
    use super::*;

    #[test]
    fn mail_stored_with_paths_still_loads() {
        let old = r#"{"to":"r","source":"t","content":"see","hop":0,"files":["notes/a.txt"]}"#;
        let mail: Mail = serde_json::from_str(old).unwrap();
        assert_eq!(mail.files[0].name, "notes/a.txt");
        assert_eq!(mail.files[0].content_type, "text/plain");
        assert!(mail.files[0].data.is_none());
        let text = crate::files::forms::missing(&mail.files[0]);
        assert!(text.contains("its content is not available"), "{text}");
    }
}
