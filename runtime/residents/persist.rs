//! What a resident writes down as its turns go: the audit log for every resident, and for one
//! with `persist_conversation` its cell (`ARCHITECTURE.md`, "The store's guarantees"): the conversation after each step, the
//! journal of the step's calls, the backlog of accepted mail.
//!
//! The order of writes is what makes a restart safe:
//! 1. `ai.mail` answers `true` only after the mail is in the backlog on disk;
//! 2. a step's model reply is committed (with the served mail moved from the backlog into the
//!    conversation, in the same transaction) before any of its calls run;
//! 3. a step's calls are journaled as started before any of them runs (when that cannot be
//!    written none runs: the turn waits as one whose step could not be saved, or, without the
//!    lease in a cluster, each is answered "not run"), then each as finished with its result;
//! 4. the step's results are committed (and the journal cleared) before the next model call.
//!
//! So a restart finds either a transcript ending in a reply (the turn was done), or one ending in
//! calls with the journal saying which finished (their results are reused; one that started and
//! did not finish is answered "interrupted by a restart" unless its tool is idempotent), or one
//! ending in results (the next model call was not made yet).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::infer::breaker::{BreakerState, BreakerStore};
use crate::store::audit_batch::AuditBatch;
use crate::store::{AuditEntry, JournalEntry, Store, StoreError};
use crate::turn::{EventKind, NotStarted, Recorded, ToolEvent, TurnHooks};
use crate::vocab::{FileRef, Message, ToolCall, ToolResult, Usage};

/// The hooks of one resident's turn.
pub struct ResidentHooks {
    pub store: Arc<dyn Store>,
    pub name: String,
    /// Whether the conversation is kept (`persist_conversation`); the audit log is kept anyway.
    pub persist: bool,
    /// The journal found at a restart: it answers only the calls of the step it was written
    /// for (the first commit clears it, as it clears the saved journal).
    journal: std::sync::Mutex<Vec<JournalEntry>>,
    /// The backlog rows this turn serves ([`crate::residents::Mail::saved`]), removed at its
    /// first commit that lands. A commit repeated after one whose answer was lost (it landed)
    /// names rows already gone: nothing else is removed.
    served: std::sync::Mutex<Vec<i64>>,
    /// Where audit lines with nothing else to write wait to share a transaction (a script's
    /// own turns, [`ResidentHooks::batched`]); `None`: each is written as its call ends.
    batch: Option<Arc<AuditBatch>>,
    /// The last batch a line of this turn went into (0: none).
    queued: AtomicU64,
    /// What this turn's model calls spent, and how many there were ([`TurnHooks::spent`]): what
    /// a turn cut before its end spent is recorded from this ([`ResidentHooks::take_spent`]).
    spent: std::sync::Mutex<(Usage, u32)>,
}

impl ResidentHooks {
    pub fn new(
        store: Arc<dyn Store>,
        name: &str,
        persist: bool,
        journal: Vec<JournalEntry>,
        served: Vec<i64>,
    ) -> ResidentHooks {
        ResidentHooks {
            store,
            name: name.to_string(),
            persist,
            journal: std::sync::Mutex::new(journal),
            served: std::sync::Mutex::new(served),
            batch: None,
            queued: AtomicU64::new(0),
            spent: std::sync::Mutex::new((Usage::default(), 0)),
        }
    }

    /// What this turn's model calls have spent so far, and how many they were; taken, so it is
    /// recorded once.
    pub fn take_spent(&self) -> (Usage, u32) {
        std::mem::take(&mut *self.spent.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Audit lines queued in `batch` and waited for ([`TurnHooks::settled`]) instead of each
    /// written on its own; a conversation that is kept still writes each with its journal entry.
    pub fn batched(mut self, batch: Arc<AuditBatch>) -> ResidentHooks {
        self.batch = Some(batch);
        self
    }

    /// The batch holding this turn's last line, while it is not written.
    fn unwritten(&self) -> Option<(&Arc<AuditBatch>, u64)> {
        let batch = self.batch.as_ref()?;
        let n = self.queued.load(Ordering::Acquire);
        (n > 0 && !batch.is_written(n)).then_some((batch, n))
    }

    fn commit(&self, messages: &[Message]) -> Result<(), String> {
        self.journal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        if !self.persist {
            return Ok(());
        }
        // Discarded arrivals are still in the backlog on disk until the turn that reports them
        // commits, so nothing is counted apart: `dropped` stays 0.
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        match self.store.commit_step(&self.name, messages, &served, 0) {
            Ok(()) => {
                served.clear();
                Ok(())
            }
            Err(e) => {
                tracing::error!(ai = %self.name, "cannot save the conversation: {e}");
                Err(format!("cannot save the conversation: {e}"))
            }
        }
    }
}

impl ResidentHooks {
    /// The backlog rows this turn served whose removal has not landed (no commit of the turn
    /// succeeded since it began): the next turn's commit must remove them.
    pub fn unserved(&self) -> Vec<i64> {
        self.served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Saves the conversation outside a step (the undelivered-text line).
    pub fn save(&self, messages: &[Message]) {
        // Logged by `commit`; the next step's commit writes the whole conversation again.
        let _ = self.commit(messages);
    }
}

impl TurnHooks for ResidentHooks {
    fn turn_begins(&self) {
        self.store.prepare_writes();
    }

    fn spent(&self, usage: &Usage) {
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        spent.0.add(usage);
        spent.1 += 1;
    }

    fn inferred(&self, messages: &[Message]) -> Result<(), String> {
        self.commit(messages)
    }

    fn recorded(&self, call_id: &str) -> Recorded {
        let journal = self.journal.lock().unwrap_or_else(|e| e.into_inner());
        match journal.iter().find(|e| e.call_id == call_id) {
            Some(JournalEntry {
                result: Some(r),
                files,
                ..
            }) => Recorded::Finished(r.clone(), files.clone()),
            Some(_) => Recorded::Started,
            None => Recorded::Nothing,
        }
    }

    fn starting(&self, calls: &[&ToolCall]) -> Result<(), NotStarted> {
        if !self.persist {
            return Ok(());
        }
        for call in calls {
            let entry = JournalEntry {
                call_id: call.id.clone(),
                tool: call.name.clone(),
                result: None,
                files: Vec::new(),
            };
            if let Err(e) = self.store.journal(&self.name, &entry) {
                tracing::error!(ai = %self.name, call = %call.id, "cannot journal a call: not run: {e}");
                return Err(match e {
                    StoreError::Fenced(_) => {
                        NotStarted::Refused(format!("not run: cannot journal the call: {e}"))
                    }
                    _ => NotStarted::Unsaved(format!("cannot journal the step's calls: {e}")),
                });
            }
        }
        Ok(())
    }

    fn finished(&self, call: &ToolCall, result: &ToolResult, files: &[FileRef], event: &ToolEvent) {
        // The audit line and the journal entry together (one fsync): a call the journal records
        // as finished is always audited (a restart reuses its result without running or
        // auditing it again).
        let audit = audit_entry(&self.name, call, event);
        if let Some(batch) = self.batch.as_ref().filter(|_| !self.persist) {
            self.queued.fetch_max(batch.add(audit), Ordering::AcqRel);
            return;
        }
        let journal = self.persist.then(|| JournalEntry {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            result: Some(result.clone()),
            files: files.to_vec(),
        });
        if let Err(e) = self.store.finish_call(&self.name, &audit, journal.as_ref()) {
            // A full disk failed every call: one line each filled the log it could not save.
            static SAID: crate::said::SaidEvery = crate::said::SaidEvery::new();
            if let Some(unsaid) = SAID.say() {
                let also = crate::said::also(unsaid);
                tracing::error!(ai = %self.name, "cannot write the audit log and journal of a call: {e}{also}");
            }
        }
    }

    fn settled(&self) -> Option<futures::future::BoxFuture<'static, ()>> {
        let (batch, n) = self.unwritten()?;
        let batch = batch.clone();
        Some(Box::pin(async move { batch.written(n).await }))
    }

    fn step_done(&self, messages: &[Message]) -> Result<(), String> {
        self.commit(messages)
    }
}

impl Drop for ResidentHooks {
    /// A turn dropped while its line waited (cancelled mid-call) leaves no line unwritten.
    fn drop(&mut self) {
        if let Some((batch, _)) = self.unwritten() {
            batch.flush();
        }
    }
}

/// A breaker's state kept in the store (`ai/breaker` for the route's, `ai/breaker/<name>` for a
/// resident's own), so an open breaker stays open with its probe schedule across a restart.
pub struct StoreBreaker {
    pub store: Arc<dyn Store>,
    pub key: String,
}

impl BreakerStore for StoreBreaker {
    fn load(&self) -> Option<BreakerState> {
        match self.store.breaker(&self.key) {
            Ok(state) => state,
            Err(e) => {
                tracing::error!(key = %self.key, "cannot read the breaker state: {e}");
                None
            }
        }
    }

    fn save(&self, state: &BreakerState) {
        if let Err(e) = self.store.save_breaker(&self.key, state) {
            tracing::error!(key = %self.key, "cannot save the breaker state: {e}");
        }
    }
}

/// The audit line of one finished call.
pub fn audit_entry(resident: &str, call: &ToolCall, event: &ToolEvent) -> AuditEntry {
    let at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let hash = Sha256::digest(call.arguments.as_bytes());
    AuditEntry {
        at_ms,
        resident: resident.to_string(),
        tool: call.name.clone(),
        // One formatting pass (a `format!` per byte cost a tool call 10 K instructions).
        args_hash: format!("{hash:x}"),
        duration_ms: event.duration.as_secs_f64() * 1000.0,
        outcome: event.kind.as_str().to_string(),
        message: (event.kind != EventKind::Ok).then(|| crate::secrets::redact(&event.outcome)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_hash_is_the_arguments_sha256_in_lowercase_hex() {
        let call = ToolCall {
            id: "call_1".into(),
            name: "add".into(),
            arguments: "abc".into(),
            opaque: None,
        };
        let event = ToolEvent {
            step: 1,
            call_id: "call_1".into(),
            name: "add".into(),
            kind: EventKind::Ok,
            outcome: "5".into(),
            duration: std::time::Duration::from_millis(2),
        };
        // SHA-256("abc"), FIPS 180-2's first example.
        assert_eq!(
            audit_entry("script", &call, &event).args_hash,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
