//! The replay provider: answers from a cassette instead of the network, for tests and offline demos.
//!
//! A cassette is JSONL, one exchange a line: `{"fingerprint", "request", "response"}` where
//! `request` is the neutral request (for a reader) and `response` the neutral [`Inferred`]. Lookups go
//! by fingerprint, a hash of the request with its object keys sorted and its model left out (the
//! same conversation replays whichever model the config names), so concurrent callers get their own
//! answers in any order. Identical requests take the recorded answers in order; once those are used
//! up the last one answers again, since the same question deserves the same reply.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::ProviderError;
use crate::secrets;
use crate::vocab::{InferRequest, Inferred};

#[derive(Serialize, Deserialize)]
struct Exchange {
    fingerprint: String,
    request: Value,
    response: Inferred,
}

/// The recorded answers to one fingerprint: those not yet given, and the last one given.
#[derive(Default)]
struct Answers {
    queue: VecDeque<Inferred>,
    last: Option<Inferred>,
}

/// A loaded cassette.
pub struct Cassette {
    path: PathBuf,
    answers: Mutex<HashMap<String, Answers>>,
    asked: AtomicUsize,
    models: Vec<String>,
}

/// Recursively sorts object keys so a fingerprint does not depend on the order a Lua table
/// happened to iterate in.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<_> = map.keys().collect();
            keys.sort();
            let mut out = serde_json::Map::new();
            for k in keys {
                out.insert(k.clone(), canonical(&map[k]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

fn request_value(req: &InferRequest) -> Value {
    let mut v = serde_json::to_value(req).expect("requests serialise");
    if let Value::Object(map) = &mut v {
        map.remove("model");
        // Where a resident's mail came from is kept with its message, never sent to a model:
        // not part of what a recording answered.
        if let Some(Value::Array(messages)) = map.get_mut("messages") {
            for m in messages.iter_mut().filter_map(Value::as_object_mut) {
                m.remove("mail");
            }
        }
    }
    canonical(&v)
}

/// The fingerprint of a request: 16 bytes of SHA-256 over its canonical JSON, in hex.
pub fn fingerprint(req: &InferRequest) -> String {
    let digest = Sha256::digest(request_value(req).to_string().as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// A short description of a request for error messages: what a person needs to find it.
fn describe(req: &InferRequest) -> String {
    let last = req
        .messages
        .iter()
        .rev()
        .map(|m| m.text())
        .find(|t| !t.is_empty())
        .unwrap_or_default();
    let mut short: String = last.chars().take(80).collect();
    if short.len() < last.len() {
        short.push_str("...");
    }
    let last = short;
    format!(
        "{} message(s), {} tool(s), last text {:?}",
        req.messages.len(),
        req.tools.len(),
        last
    )
}

impl Cassette {
    pub fn load(path: &Path) -> Result<Cassette, ProviderError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ProviderError::Config(format!("cannot read cassette {}: {e}", path.display()))
        })?;
        let mut answers: HashMap<String, Answers> = HashMap::new();
        let mut models = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let ex: Exchange = serde_json::from_str(line).map_err(|e| {
                ProviderError::Config(format!(
                    "{}:{}: not a cassette exchange: {e}",
                    path.display(),
                    n + 1
                ))
            })?;
            if let Some(m) = &ex.response.model
                && !models.contains(m)
            {
                models.push(m.clone());
            }
            answers
                .entry(ex.fingerprint)
                .or_default()
                .queue
                .push_back(ex.response);
        }
        Ok(Cassette {
            path: path.to_path_buf(),
            answers: Mutex::new(answers),
            asked: AtomicUsize::new(0),
            models,
        })
    }

    /// The recorded answer to `req`; streamed callers get its text as one delta.
    pub fn answer(
        &self,
        req: &InferRequest,
        on_text: Option<&mut (dyn FnMut(&str) + Send)>,
    ) -> Result<Inferred, ProviderError> {
        let step = self.asked.fetch_add(1, Ordering::SeqCst) + 1;
        let fp = fingerprint(req);
        let found = {
            let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
            answers.get_mut(&fp).and_then(|a| {
                if let Some(next) = a.queue.pop_front() {
                    a.last = Some(next);
                }
                a.last.clone()
            })
        };
        let inferred = found.ok_or_else(|| {
            ProviderError::CassetteMiss(format!(
                "cassette {} has no answer for request {step} (fingerprint {fp}: {})",
                self.path.display(),
                describe(req)
            ))
        })?;
        if let Some(on_text) = on_text {
            let text = inferred.text();
            if !text.is_empty() {
                on_text(&text);
            }
        }
        Ok(inferred)
    }

    pub fn models(&self) -> Vec<String> {
        self.models.clone()
    }
}

/// Writes a cassette from a live run, one exchange per successful call.
pub struct Recorder {
    file: Mutex<File>,
}

impl Recorder {
    pub fn create(path: &Path) -> Result<Recorder, ProviderError> {
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(path)
            .map_err(|e| {
                ProviderError::Config(format!("cannot write cassette {}: {e}", path.display()))
            })?;
        Ok(Recorder {
            file: Mutex::new(file),
        })
    }

    pub fn record(&self, req: &InferRequest, inferred: &Inferred) -> Result<(), ProviderError> {
        let ex = Exchange {
            fingerprint: fingerprint(req),
            request: request_value(req),
            response: inferred.clone(),
        };
        let line = secrets::redact(&serde_json::to_string(&ex).expect("exchanges serialise"));
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(file, "{line}")
            .and_then(|_| file.flush())
            .map_err(|e| ProviderError::Config(format!("cannot append to the cassette: {e}")))
    }
}
