//! `colony usage FILE.lua`: what a program's residents used and spent, per resident and day.

use super::Failure;
use super::state::Target;
use crate::residents::budget::{self, Spent};
use crate::residents::budget_prices::DEFAULT_CURRENCY;

/// Print the tokens and cost of a program's residents, per resident and UTC day.
#[derive(clap::Args)]
#[command(
    long_about = "Print what a program's residents used, per resident and UTC day, as aligned \
        columns: input, output and cache tokens, the turns, and the cost in the price table's \
        currency (the config's [prices], else the prices shipped for the catalogue's default \
        models). Tokens of a model without a price are shown as unpriced, not guessed. The \
        figures are the ones the residents' budgets are held to, kept in the program's store, \
        so a restart does not reset them. Prints nothing when nothing was used.\n\n\
        Opens the program's state directory the way the program does, with its lock: while the \
        program runs this refuses, naming the process that holds it, and while this runs the \
        program cannot start."
)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// Only this resident.
    #[arg(long, value_name = "NAME")]
    resident: Option<String>,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let state = args.target.open("usage")?;
    let buckets = budget::buckets(&*state.dyn_store())
        .map_err(|e| Failure::run(format!("colony usage: {e}")))?;
    let currency = crate::config::Config::load()
        .ok()
        .and_then(|c| c.prices)
        .map(|p| p.currency().to_string())
        .unwrap_or_else(|| DEFAULT_CURRENCY.to_string());
    let mut rows = vec![
        [
            "RESIDENT", "DAY", "INPUT", "OUTPUT", "CACHE", "TURNS", "COST",
        ]
        .map(String::from),
    ];
    for (resident, hours) in buckets {
        if args.resident.as_ref().is_some_and(|r| *r != resident) {
            continue;
        }
        let mut days: std::collections::BTreeMap<String, Spent> = Default::default();
        for (hour, spent) in hours {
            let day = days.entry(hour.format("%Y-%m-%d").to_string()).or_default();
            *day = sum(day, &spent);
        }
        for (day, s) in days {
            // Nothing priced is not a cost of 0: "0.000000 USD (+15 tokens unpriced)" read as
            // free.
            let cost = match (s.unpriced, s.tokens()) {
                // Turns whose server reported no tokens cost something nobody counted.
                (0, 0) if s.turns > 0 => "no usage reported".to_string(),
                (0, _) => format!("{:.6} {currency}", s.cost),
                (unpriced, all) if unpriced >= all => format!("unpriced ({unpriced} tokens)"),
                (unpriced, _) => format!("{:.6} {currency} (+{unpriced} tokens unpriced)", s.cost),
            };
            rows.push([
                resident.clone(),
                day,
                s.input.to_string(),
                s.output.to_string(),
                (s.cache_read + s.cache_write).to_string(),
                s.turns.to_string(),
                cost,
            ]);
        }
    }
    if rows.len() == 1 {
        return Ok(());
    }
    super::table::print(&rows, [false, false, true, true, true, true, false]);
    Ok(())
}

fn sum(a: &Spent, b: &Spent) -> Spent {
    Spent {
        input: a.input + b.input,
        output: a.output + b.output,
        cache_read: a.cache_read + b.cache_read,
        cache_write: a.cache_write + b.cache_write,
        cost: a.cost + b.cost,
        unpriced: a.unpriced + b.unpriced,
        turns: a.turns + b.turns,
    }
}
