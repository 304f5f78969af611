//! `colony audit FILE.lua`: the log of a program's tool calls.

use super::Failure;
use super::state::Target;
use crate::store::AuditFilter;

/// Print the log of a program's tool calls.
#[derive(clap::Args)]
#[command(
    long_about = "Print the log of a program's tool calls, oldest first, as aligned columns: \
        when the call finished (ISO 8601, UTC), the resident whose turn made it (`script` for a \
        script's own turn), the tool, the outcome, the duration in milliseconds, and the first \
        12 hex digits of the SHA-256 of its arguments (the arguments themselves are not kept), \
        and for a call that did not go well what the model was told (its first 500 characters, \
        keys redacted, line breaks shown as \\n). Prints nothing when no call matches.\n\n\
        Opens the program's state directory the way the program does, with its lock: while the \
        program runs this refuses, naming the process that holds it, and while this runs the \
        program cannot start."
)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// Only the calls made in this resident's turns.
    #[arg(long, value_name = "NAME")]
    resident: Option<String>,
    /// Only the calls of this tool.
    #[arg(long, value_name = "TOOL")]
    tool: Option<String>,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let state = args.target.open("audit")?;
    let filter = AuditFilter {
        resident: args.resident,
        tool: args.tool,
    };
    let entries = state
        .dyn_store()
        .audit_log(&filter)
        .map_err(|e| Failure::run(format!("colony audit: {e}")))?;
    if entries.is_empty() {
        // Said on stderr, stdout left empty for a pipe: nothing at all read as a command that
        // did not work.
        let which = match (&filter.resident, &filter.tool) {
            (None, None) => String::new(),
            (r, t) => format!(
                " matching{}{}",
                r.as_ref()
                    .map(|r| format!(" --resident {r}"))
                    .unwrap_or_default(),
                t.as_ref()
                    .map(|t| format!(" --tool {t}"))
                    .unwrap_or_default()
            ),
        };
        eprintln!(
            "colony audit: no tool calls logged{which} in {}",
            state.place()
        );
        return Ok(());
    }
    let mut rows = vec![[
        "TIME".to_string(),
        "RESIDENT".to_string(),
        "TOOL".to_string(),
        "OUTCOME".to_string(),
        "MS".to_string(),
        "ARGS".to_string(),
        "MESSAGE".to_string(),
    ]];
    for e in entries {
        rows.push([
            iso_utc(e.at_ms),
            e.resident,
            e.tool,
            e.outcome,
            format!("{:.1}", e.duration_ms),
            e.args_hash.chars().take(12).collect(),
            e.message.unwrap_or_default().replace('\n', "\\n"),
        ]);
    }
    super::table::print(&rows, [false, false, false, false, true, false, false]);
    Ok(())
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn iso_utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::iso_utc;

    #[test]
    fn iso_utc_formats_epoch_milliseconds() {
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso_utc(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(iso_utc(4_107_542_399_999), "2100-02-28T23:59:59.999Z");
    }
}
