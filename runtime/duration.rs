//! The one reading of every duration colony is given: config timeouts, `timeout =` and `*_ms`
//! options from Lua, `ai.sleep`, MCP deadlines, `--max-time`.
//!
//! A duration arrives as a float (seconds or milliseconds) or as text (`90`, `1.5s`, `250ms`,
//! `2m`, `1h30m`). `std`'s constructors panic on a negative, NaN or infinite float and overflow
//! far below `1e300`, so nothing else in colony builds a `Duration` from a number it was handed:
//! it calls [`seconds`], [`millis`] or [`parse`], which refuse such values with a message that
//! says why. The longest duration accepted is [`MAX`] (one year): a longer wait is a mistake,
//! not a plan, and there is no "forever" (`math.huge`): leave the option out for its default.

use std::time::Duration;

/// The longest duration colony accepts anywhere: 365 days.
pub const MAX: Duration = Duration::from_secs(365 * 24 * 3600);

/// Why a number is not a duration. Its text is a sentence fragment naming the value and the
/// rule; callers prefix the option's name (`timeout: ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{0} is negative; a duration is 0 or more")]
    Negative(String),
    #[error("NaN is not a duration")]
    NotANumber,
    #[error("{0} is longer than the maximum of 365 days (31536000 s)")]
    TooLong(String),
    #[error(
        "{0:?} is not a duration (write seconds, or a number with d, h, m, s or ms: 90, 1.5s, 250ms, 2m, 1h30m, 30d)"
    )]
    Unreadable(String),
}

/// `value` seconds as a duration.
pub fn seconds(value: f64) -> Result<Duration, DurationError> {
    from_f64(value, 1.0, "s")
}

/// `value` milliseconds as a duration.
pub fn millis(value: f64) -> Result<Duration, DurationError> {
    from_f64(value, 1000.0, "ms")
}

/// A number a user wrote, as a message shows it: `1e300`, not three hundred digits, and `nan`
/// as Lua prints it, not Rust's `NaN`.
pub fn number_text(value: f64) -> String {
    if value.is_nan() {
        "nan".into()
    } else if value.is_infinite() {
        format!("{}inf", if value < 0.0 { "-" } else { "" })
    } else if value.abs() >= 1e15 {
        format!("{value:e}")
    } else {
        format!("{value}")
    }
}

fn from_f64(value: f64, per_second: f64, unit: &str) -> Result<Duration, DurationError> {
    let shown = || {
        if value.is_infinite() {
            number_text(value)
        } else {
            format!("{} {unit}", number_text(value))
        }
    };
    if value.is_nan() {
        return Err(DurationError::NotANumber);
    }
    if value < 0.0 {
        return Err(DurationError::Negative(shown()));
    }
    let secs = value / per_second;
    if !secs.is_finite() || secs > MAX.as_secs_f64() {
        return Err(DurationError::TooLong(shown()));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A duration written as text: a bare number of seconds (`90`, `1.5`), or numbers each with a
/// unit (`250ms`, `1.5s`, `2m`, `1h30m`, `6m0s`, `30d`), as command-line options and providers
/// write them.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    match text.trim().parse::<f64>() {
        // `inf` and `nan` parse as floats; they are refused by `seconds` with their own reason.
        Ok(plain) => seconds(plain),
        Err(_) => with_units(text),
    }
}

/// A duration whose every number carries its unit (`47s`, `0.5s`, `84ms`, `6m0s`, `1h2m3s`), as
/// providers write them in messages and `retryDelay`; a bare number is unreadable here.
pub fn with_units(text: &str) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    let unreadable = || DurationError::Unreadable(text.to_string());
    if trimmed.is_empty() {
        return Err(unreadable());
    }
    let mut total = 0.0f64;
    let mut number = String::new();
    let mut chars = trimmed.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let value: f64 = number.parse().map_err(|_| unreadable())?;
        number.clear();
        let unit = match c {
            'd' => 86_400.0,
            'h' => 3600.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                0.001
            }
            'm' => 60.0,
            's' => 1.0,
            _ => return Err(unreadable()),
        };
        total += value * unit;
    }
    if !number.is_empty() {
        return Err(unreadable());
    }
    if total > MAX.as_secs_f64() {
        return Err(DurationError::TooLong(trimmed.to_string()));
    }
    seconds(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_range_are_durations() {
        assert_eq!(seconds(1.5), Ok(Duration::from_millis(1500)));
        assert_eq!(seconds(0.0), Ok(Duration::ZERO));
        assert_eq!(millis(250.0), Ok(Duration::from_millis(250)));
        assert_eq!(seconds(MAX.as_secs_f64()), Ok(MAX));
    }

    #[test]
    fn negative_nan_and_absurd_values_are_refused_with_a_reason() {
        assert_eq!(
            seconds(-1.0).unwrap_err().to_string(),
            "-1 s is negative; a duration is 0 or more"
        );
        assert_eq!(seconds(f64::NAN), Err(DurationError::NotANumber));
        assert_eq!(
            seconds(f64::INFINITY).unwrap_err().to_string(),
            "inf is longer than the maximum of 365 days (31536000 s)"
        );
        assert!(matches!(seconds(1e300), Err(DurationError::TooLong(_))));
        assert!(matches!(millis(1e300), Err(DurationError::TooLong(_))));
        assert!(matches!(
            seconds(f64::NEG_INFINITY),
            Err(DurationError::Negative(_))
        ));
    }

    #[test]
    fn text_with_units() {
        assert_eq!(parse("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("6m0s"), Ok(Duration::from_secs(360)));
        assert!(matches!(parse("soon"), Err(DurationError::Unreadable(_))));
        assert!(matches!(parse(""), Err(DurationError::Unreadable(_))));
        assert!(matches!(parse("inf"), Err(DurationError::TooLong(_))));
        assert!(matches!(parse("-5"), Err(DurationError::Negative(_))));
        assert!(matches!(parse("9999999h"), Err(DurationError::TooLong(_))));
    }
}
