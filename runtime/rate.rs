//! Rate limits: `"10/min"` as a token bucket (`governor`'s GCRA): up to 10 at once, then one
//! more every 6 s. A tool's `rate` turns a call over it into a `rate_limited` result the model can
//! wait on; the service uses the same limits per caller.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// A rate as written: `count` per `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    pub count: NonZeroU32,
    pub per: Duration,
}

impl Rate {
    /// `N/s`, `N/min`, `N/hour`, `N/day` (also `N/second`, `N/minute`, `N/h`, `N/d`, and a
    /// count of units: `N/30s`, `N/5min`).
    pub fn parse(text: &str) -> Result<Rate, String> {
        let bad =
            || format!("{text:?} is not a rate: say how many per what, as \"10/min\" or \"5/s\"");
        let (count, per) = text.trim().split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        let count = NonZeroU32::new(count)
            .ok_or_else(|| format!("{text:?}: a rate allows at least 1 call"))?;
        let per = per.trim();
        let digits = per.bytes().take_while(u8::is_ascii_digit).count();
        let (n, unit) = per.split_at(digits);
        let n: u64 = if n.is_empty() {
            1
        } else {
            n.parse().map_err(|_| bad())?
        };
        let unit = match unit.trim() {
            "s" | "sec" | "second" | "seconds" => 1,
            "m" | "min" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            _ => return Err(bad()),
        };
        let secs = n
            .checked_mul(unit)
            .filter(|&s| s > 0 && s <= 366 * 86_400)
            .ok_or_else(|| {
                format!("{text:?}: the period must be more than 0 and at most a year")
            })?;
        Ok(Rate {
            count,
            per: Duration::from_secs(secs),
        })
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.per.as_secs();
        let per = match secs {
            1 => "s".to_string(),
            60 => "min".to_string(),
            3600 => "hour".to_string(),
            86_400 => "day".to_string(),
            s => format!("{s}s"),
        };
        write!(f, "{}/{per}", self.count)
    }
}

/// A rate enforced: cheap to clone, shared by every holder (one bucket).
#[derive(Clone)]
pub struct RateLimit {
    rate: Rate,
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl std::fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RateLimit({})", self.rate)
    }
}

impl RateLimit {
    pub fn new(rate: Rate) -> RateLimit {
        let interval = rate.per / rate.count.get();
        let quota = Quota::with_period(interval.max(Duration::from_nanos(1)))
            .expect("a period above zero")
            .allow_burst(rate.count);
        RateLimit {
            rate,
            limiter: Arc::new(RateLimiter::direct(quota)),
        }
    }

    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Takes one from the bucket, or says how long until one is there.
    pub fn check(&self) -> Result<(), Duration> {
        self.limiter
            .check()
            .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }
}

/// `[rate]` in the config: limits the program does not set itself.
///
/// ```toml
/// [rate]
/// global = "600/min"     # every tool call of the process, together
/// caller = "60/min"      # each caller of `colony serve`'s API, by its token's name
/// [rate.tools]
/// lookup = "10/min"      # one tool, in every program and turn
/// [rate.callers]
/// token = "10/min"       # one caller
/// ```
///
/// The buckets are the process's ([`shared`]): a limit is the same one for every turn and
/// program that reads it, and a changed rate starts a fresh bucket.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tools: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub callers: std::collections::BTreeMap<String, String>,
}

impl RateConfig {
    /// Checks every rate reads; the error names the table and field.
    pub fn validate(&self) -> Result<(), String> {
        let named = |table: &str, k: &str, v: &str| {
            Rate::parse(v)
                .map(|_| ())
                .map_err(|e| format!("[{table}] {k} = {v:?}: {e}"))
        };
        for (k, v) in [("global", &self.global), ("caller", &self.caller)] {
            if let Some(v) = v {
                named("rate", k, v)?;
            }
        }
        for (k, v) in &self.tools {
            named("rate.tools", k, v)?;
        }
        for (k, v) in &self.callers {
            named("rate.callers", k, v)?;
        }
        Ok(())
    }

    /// Takes a call of `tool` from its bucket and the global one; `Err` is the `rate_limited`
    /// message the model reads.
    pub fn check_tool(&self, tool: &str) -> Result<(), String> {
        if let Some(text) = self.tools.get(tool)
            && let Ok(rate) = Rate::parse(text)
            && let Err(wait) = shared(&format!("tool\0{tool}"), rate).check()
        {
            return Err(format!(
                "rate_limited: {tool} allows {rate} calls (the config's [rate.tools]); try again \
                 in {:.1} s",
                wait.as_secs_f64().max(0.1)
            ));
        }
        if let Some(text) = &self.global
            && let Ok(rate) = Rate::parse(text)
            && let Err(wait) = shared("global", rate).check()
        {
            return Err(format!(
                "rate_limited: tool calls allow {rate} in all (the config's [rate] global); try \
                 again in {:.1} s",
                wait.as_secs_f64().max(0.1)
            ));
        }
        Ok(())
    }

    /// Takes a request of the caller `name` from its bucket: `Err` is how long until it may
    /// call again, with the rate.
    pub fn check_caller(&self, name: &str) -> Result<(), (Rate, Duration)> {
        let Some(rate) = self
            .callers
            .get(name)
            .or(self.caller.as_ref())
            .and_then(|t| Rate::parse(t).ok())
        else {
            return Ok(());
        };
        shared(&format!("caller\0{name}"), rate)
            .check()
            .map_err(|wait| (rate, wait))
    }
}

/// The process's bucket for `key` at `rate` (made on first use).
pub fn shared(key: &str, rate: Rate) -> RateLimit {
    static BUCKETS: std::sync::LazyLock<dashmap::DashMap<(String, Rate), RateLimit>> =
        std::sync::LazyLock::new(dashmap::DashMap::new);
    BUCKETS
        .entry((key.to_string(), rate))
        .or_insert_with(|| RateLimit::new(rate))
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_written_and_nonsense_is_named() {
        let r = Rate::parse("10/min").unwrap();
        assert_eq!((r.count.get(), r.per), (10, Duration::from_secs(60)));
        assert_eq!(r.to_string(), "10/min");
        assert_eq!(Rate::parse("5/s").unwrap().per, Duration::from_secs(1));
        assert_eq!(Rate::parse("3/30s").unwrap().to_string(), "3/30s");
        assert_eq!(Rate::parse("1000 / day").unwrap().to_string(), "1000/day");
        assert!(Rate::parse("0/min").unwrap_err().contains("at least 1"));
        assert!(Rate::parse("ten/min").unwrap_err().contains("not a rate"));
        assert!(
            Rate::parse("10/fortnight")
                .unwrap_err()
                .contains("not a rate")
        );
        assert!(Rate::parse("10/0s").unwrap_err().contains("more than 0"));
        assert!(Rate::parse("10").is_err());
    }

    #[test]
    fn the_eleventh_call_of_ten_a_minute_waits() {
        let limit = RateLimit::new(Rate::parse("10/min").unwrap());
        for _ in 0..10 {
            assert!(limit.check().is_ok());
        }
        let wait = limit.check().unwrap_err();
        assert!(
            !wait.is_zero() && wait <= Duration::from_secs(6),
            "{wait:?}"
        );
        // Clones share the bucket.
        assert!(limit.clone().check().is_err());
    }

    #[test]
    fn the_configs_limits_are_named_and_each_has_its_bucket() {
        let mut config = RateConfig::default();
        config
            .tools
            .insert("rate_test_lookup".into(), "2/min".into());
        assert!(config.check_tool("rate_test_lookup").is_ok());
        assert!(config.check_tool("rate_test_lookup").is_ok());
        let refused = config.check_tool("rate_test_lookup").unwrap_err();
        assert!(
            refused.starts_with("rate_limited: rate_test_lookup allows 2/min calls (the config's [rate.tools]); try again in "),
            "{refused}"
        );
        assert!(config.check_tool("rate_test_other").is_ok());
        config
            .callers
            .insert("rate_test_alice".into(), "1/hour".into());
        assert!(config.check_caller("rate_test_alice").is_ok());
        assert_eq!(
            config
                .check_caller("rate_test_alice")
                .unwrap_err()
                .0
                .to_string(),
            "1/hour"
        );
        assert!(config.check_caller("rate_test_bob").is_ok());
        config.tools.insert("x".into(), "often".into());
        assert!(
            config
                .validate()
                .unwrap_err()
                .starts_with("[rate.tools] x = \"often\": ")
        );
    }
}
