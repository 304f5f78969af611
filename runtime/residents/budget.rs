//! Budgets: how many tokens, or how much money, a resident (or the whole program) may spend in
//! a window (`budget = { tokens = 200000, cost = 5, per = "day" }`).
//!
//! What each turn used is added to the store (space [`SPACE`], one key per resident and UTC
//! hour), so a restart does not reset it and `colony usage` can print it. Before a turn the
//! resident sums its window; over its own budget or the program's, it is blocked with kind
//! `budget` until the window resets (its mail held, nothing lost). A turn that starts under the
//! budget runs to its end: a budget bounds what is started, not a call in flight.
//!
//! A cost is in the currency of the price table ([`super::budget_prices`]); a model without a
//! price adds its tokens as `unpriced`, and a cost budget says so instead of guessing.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, Duration as Span, NaiveDate, TimeZone, Timelike, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::{Store, StoreResult};
use crate::vocab::Usage;

/// The store space usage is kept in: `<resident>/<YYYY-MM-DDTHH>` (UTC) → [`Spent`].
pub const SPACE: &str = "colony/usage";

/// How long a budget's window is. Windows are aligned: an hour from :00, a day from 00:00 UTC,
/// a month from its first day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Hour,
    Day,
    Month,
}

impl Window {
    pub fn parse(text: &str) -> Result<Window, String> {
        match text {
            "hour" => Ok(Window::Hour),
            "day" => Ok(Window::Day),
            "month" => Ok(Window::Month),
            other => Err(format!(
                "per = {other:?} is not a window: say \"hour\", \"day\" or \"month\""
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Window::Hour => "hour",
            Window::Day => "day",
            Window::Month => "month",
        }
    }

    /// The window holding `at`: its start and the start of the next one.
    pub fn bounds(self, at: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        let day = Utc.from_utc_datetime(&at.date_naive().and_hms_opt(0, 0, 0).expect("midnight"));
        match self {
            Window::Hour => {
                let start = day + Span::hours(i64::from(at.hour()));
                (start, start + Span::hours(1))
            }
            Window::Day => (day, day + Span::days(1)),
            Window::Month => {
                let first = |y: i32, m: u32| {
                    let d = NaiveDate::from_ymd_opt(y, m, 1).expect("the first of a month");
                    Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight"))
                };
                let (y, m) = (at.year(), at.month());
                let next = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (first(y, m), first(next.0, next.1))
            }
        }
    }
}

/// One budget: at most `tokens` (input, cached input included, and output) and at most `cost` (in the
/// price table's currency) per window.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub tokens: Option<u64>,
    pub cost: Option<f64>,
    pub per: Window,
}

/// The budgets a resident's turns are held to: its own and its program's (`ai.route`'s, summed
/// over every resident).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Budgets {
    pub own: Option<Budget>,
    pub program: Option<Budget>,
}

impl Budgets {
    pub fn is_empty(&self) -> bool {
        self.own.is_none() && self.program.is_none()
    }

    /// Whether either budget counts money.
    pub fn in_cost(&self) -> bool {
        [&self.own, &self.program]
            .into_iter()
            .flatten()
            .any(|b| b.cost.is_some())
    }

    /// Whether either budget counts tokens.
    pub fn in_tokens(&self) -> bool {
        [&self.own, &self.program]
            .into_iter()
            .flatten()
            .any(|b| b.tokens.is_some())
    }
}

/// What was used in one bucket (or summed over several).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    #[serde(default)]
    pub input: u64,
    #[serde(default)]
    pub output: u64,
    #[serde(default)]
    pub cache_read: u64,
    #[serde(default)]
    pub cache_write: u64,
    /// In the price table's currency.
    #[serde(default)]
    pub cost: f64,
    /// Tokens of models the price table has no price for (not in `cost`).
    #[serde(default)]
    pub unpriced: u64,
    #[serde(default)]
    pub turns: u64,
}

impl Spent {
    /// Every token used: `input` counts the cache's tokens already ([`crate::vocab::Usage`]).
    pub fn tokens(&self) -> u64 {
        self.input + self.output
    }

    pub fn add(&mut self, other: &Spent) {
        self.input += other.input;
        self.output += other.output;
        self.cache_read += other.cache_read;
        self.cache_write += other.cache_write;
        self.cost += other.cost;
        self.unpriced += other.unpriced;
        self.turns += other.turns;
    }

    /// One turn's usage, at `cost` (`None`: the model has no price).
    pub fn of(usage: &Usage, cost: Option<f64>) -> Spent {
        let tokens = usage.input + usage.output;
        Spent {
            input: usage.input,
            output: usage.output,
            cache_read: usage.cache_read,
            cache_write: usage.cache_write,
            cost: cost.unwrap_or(0.0),
            unpriced: if cost.is_none() { tokens } else { 0 },
            turns: 1,
        }
    }
}

fn hour_key(resident: &str, at: DateTime<Utc>) -> String {
    format!("{resident}/{}", at.format("%Y-%m-%dT%H"))
}

/// The bucket a key names: its resident and its hour's start.
fn parse_key(key: &str) -> Option<(&str, DateTime<Utc>)> {
    let (resident, hour) = key.rsplit_once('/')?;
    let at = chrono::NaiveDateTime::parse_from_str(&format!("{hour}:00"), "%Y-%m-%dT%H:%M").ok()?;
    Some((resident, Utc.from_utc_datetime(&at)))
}

/// Adds one turn's use to `resident`'s bucket for the hour of `at`, in one atomic update.
pub fn record(
    store: &dyn Store,
    resident: &str,
    at: DateTime<Utc>,
    spent: &Spent,
) -> StoreResult<()> {
    if spent.tokens() == 0 && spent.cost == 0.0 && spent.turns == 0 {
        return Ok(());
    }
    store
        .update(SPACE, &hour_key(resident, at), &mut |old| {
            // A value that is not a bucket (written by hand) is counted from zero, not trusted.
            let mut sum: Spent = old
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default();
            sum.add(spent);
            serde_json::to_value(&sum)
                .map(Some)
                .map_err(|e| e.to_string())
        })
        .map(|_| ())
}

/// Every bucket kept: resident → hour → what was used, in order.
pub fn buckets(store: &dyn Store) -> StoreResult<BTreeMap<String, BTreeMap<DateTime<Utc>, Spent>>> {
    let mut out: BTreeMap<String, BTreeMap<DateTime<Utc>, Spent>> = BTreeMap::new();
    for key in store.list(SPACE, "")? {
        let Some((resident, at)) = parse_key(&key) else {
            continue;
        };
        let spent = store
            .get(SPACE, &key)?
            .and_then(|v: Value| serde_json::from_value::<Spent>(v).ok())
            .unwrap_or_default();
        out.entry(resident.to_string())
            .or_default()
            .insert(at, spent);
    }
    Ok(out)
}

/// What `resident` (or every resident, for `None`) used in the window of `per` holding `at`.
pub fn spent_in(
    store: &dyn Store,
    resident: Option<&str>,
    per: Window,
    at: DateTime<Utc>,
) -> StoreResult<Spent> {
    let (start, end) = per.bounds(at);
    let prefix = resident.map(|r| format!("{r}/")).unwrap_or_default();
    let mut sum = Spent::default();
    for key in store.list(SPACE, &prefix)? {
        let Some((_, hour)) = parse_key(&key) else {
            continue;
        };
        if hour < start || hour >= end {
            continue;
        }
        if let Some(spent) = store
            .get(SPACE, &key)?
            .and_then(|v| serde_json::from_value::<Spent>(v).ok())
        {
            sum.add(&spent);
        }
    }
    Ok(sum)
}

/// A budget spent: why, and when its window resets.
#[derive(Debug, Clone, PartialEq)]
pub struct Over {
    pub message: String,
    pub resets_at: DateTime<Utc>,
}

/// Whether `resident` may start a turn at `at` under `budgets`: `Some` names the budget it is
/// over (its own first) and when it resets.
pub fn over(
    store: &dyn Store,
    resident: &str,
    budgets: &Budgets,
    currency: &str,
    at: DateTime<Utc>,
) -> StoreResult<Option<Over>> {
    let checks = [
        (budgets.own.as_ref(), Some(resident), "its budget"),
        (budgets.program.as_ref(), None, "the program's budget"),
    ];
    for (budget, whose, what) in checks {
        let Some(budget) = budget else { continue };
        let spent = spent_in(store, whose, budget.per, at)?;
        let (_, resets_at) = budget.per.bounds(at);
        let per = budget.per.as_str();
        let resets = resets_at.format("%Y-%m-%dT%H:%M:%SZ");
        if let Some(limit) = budget.tokens
            && spent.tokens() >= limit
        {
            return Ok(Some(Over {
                message: format!(
                    "over {what} of {limit} tokens per {per} ({} used); it resets at {resets}",
                    spent.tokens()
                ),
                resets_at,
            }));
        }
        if let Some(limit) = budget.cost
            && spent.cost >= limit
        {
            return Ok(Some(Over {
                message: format!(
                    "over {what} of {limit} {currency} per {per} ({:.6} {currency} spent); it \
                     resets at {resets}",
                    spent.cost
                ),
                resets_at,
            }));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn windows_are_aligned_and_the_month_rolls_over_the_year() {
        let t = at("2026-12-31T23:59:59Z");
        assert_eq!(
            Window::Hour.bounds(t),
            (at("2026-12-31T23:00:00Z"), at("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            Window::Day.bounds(t),
            (at("2026-12-31T00:00:00Z"), at("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            Window::Month.bounds(t),
            (at("2026-12-01T00:00:00Z"), at("2027-01-01T00:00:00Z"))
        );
        assert!(Window::parse("week").unwrap_err().contains("\"week\""));
    }

    #[test]
    fn usage_adds_up_per_window_and_the_budget_names_its_reset() {
        let store = MemoryStore::new();
        let usage = Usage {
            input: 10,
            output: 5,
            ..Usage::default()
        };
        record(
            &store,
            "a",
            at("2026-12-01T09:10:00Z"),
            &Spent::of(&usage, Some(0.5)),
        )
        .unwrap();
        record(
            &store,
            "a",
            at("2026-12-01T10:10:00Z"),
            &Spent::of(&usage, None),
        )
        .unwrap();
        record(
            &store,
            "b",
            at("2026-12-01T10:20:00Z"),
            &Spent::of(&usage, Some(1.0)),
        )
        .unwrap();
        // Yesterday's does not count today.
        record(
            &store,
            "a",
            at("2026-11-30T23:59:00Z"),
            &Spent::of(&usage, Some(9.0)),
        )
        .unwrap();
        let now = at("2026-12-01T11:00:00Z");
        let day = spent_in(&store, Some("a"), Window::Day, now).unwrap();
        assert_eq!(
            (day.tokens(), day.cost, day.unpriced, day.turns),
            (30, 0.5, 15, 2)
        );
        let hour = spent_in(&store, Some("a"), Window::Hour, at("2026-12-01T10:59:00Z")).unwrap();
        assert_eq!(hour.tokens(), 15);
        let all = spent_in(&store, None, Window::Day, now).unwrap();
        assert_eq!((all.tokens(), all.cost), (45, 1.5));

        let own = Budgets {
            own: Some(Budget {
                tokens: Some(30),
                cost: None,
                per: Window::Day,
            }),
            program: None,
        };
        let o = over(&store, "a", &own, "USD", now).unwrap().unwrap();
        assert_eq!(
            o.message,
            "over its budget of 30 tokens per day (30 used); it resets at 2026-12-02T00:00:00Z"
        );
        assert_eq!(over(&store, "b", &own, "USD", now).unwrap(), None);
        let program = Budgets {
            own: None,
            program: Some(Budget {
                tokens: None,
                cost: Some(1.5),
                per: Window::Day,
            }),
        };
        let o = over(&store, "b", &program, "USD", now).unwrap().unwrap();
        assert!(
            o.message
                .starts_with("over the program's budget of 1.5 USD per day"),
            "{}",
            o.message
        );
    }
}
