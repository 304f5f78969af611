//! Tool names as the model sees them: `<server>__<tool>`, with anything outside
//! `[A-Za-z0-9_-]` turned into `_` (the set every provider accepts). A name over 64 characters,
//! or one that clashes with a name already taken, is left out and reported.

/// The longest name every provider accepts.
pub const MAX_NAME: usize = 64;

pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub fn namespaced(server: &str, tool: &str) -> String {
    format!("{}__{}", sanitize(server), sanitize(tool))
}

/// Why `name` cannot name a server whose tools are offered as `NAME__tool`, if it cannot:
/// letters, digits, `-` and `_`, without `__` (`x` with a tool `y__echo` and `x__y` with `echo`
/// named theirs alike) and not ending in `_` (`a` with `_echo` and `a_` with `echo` both made
/// `a___echo`, and one hid the other).
pub fn server_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("it is empty");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Some("use letters, digits, '-' and '_'");
    }
    if name.contains("__") {
        return Some("it holds \"__\", which joins it to its tools' names (NAME__tool)");
    }
    if name.ends_with('_') {
        return Some(
            "it ends in '_', which its tools' names (NAME__tool) would run into another's",
        );
    }
    None
}

/// Why a tool was left out.
#[derive(Debug, Clone, PartialEq)]
pub enum Dropped {
    TooLong,
    Clash,
}

/// The tools kept, as `(namespaced, original)`, and those left out with why.
pub type Assigned = (Vec<(String, String)>, Vec<(String, Dropped)>);

/// Assigns names to `tools` of `server`, skipping those in `taken` (which grows). Returns
/// `(namespaced, original)` pairs kept and the originals dropped.
pub fn assign(
    server: &str,
    tools: &[String],
    taken: &mut std::collections::HashSet<String>,
) -> Assigned {
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for tool in tools {
        let name = namespaced(server, tool);
        if name.chars().count() > MAX_NAME {
            dropped.push((tool.clone(), Dropped::TooLong));
        } else if !taken.insert(name.clone()) {
            dropped.push((tool.clone(), Dropped::Clash));
        } else {
            kept.push((name, tool.clone()));
        }
    }
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_server_name_cannot_run_into_another_servers_tools() {
        for good in ["time", "a_b", "a-b", "_a", "x9"] {
            assert_eq!(server_name_problem(good), None, "{good}");
        }
        for bad in ["", "a b", "a/b", "a__b", "a_", "a___"] {
            assert!(server_name_problem(bad).is_some(), "{bad}");
        }
        // Why `a_` is refused: it and `a` name tools alike.
        assert_eq!(namespaced("a", "_echo"), namespaced("a_", "echo"));
    }

    #[test]
    fn names_are_namespaced_sanitised_and_checked() {
        assert_eq!(namespaced("docs", "search.v2"), "docs__search_v2");
        assert_eq!(namespaced("my server", "a/b"), "my_server__a_b");
        let mut taken = HashSet::new();
        let long = "x".repeat(70);
        let tools = vec![
            "a.b".to_string(),
            "a_b".to_string(),
            long.clone(),
            "ok-1".to_string(),
        ];
        let (kept, dropped) = assign("s", &tools, &mut taken);
        assert_eq!(
            kept,
            vec![
                ("s__a_b".to_string(), "a.b".to_string()),
                ("s__ok-1".to_string(), "ok-1".to_string())
            ]
        );
        assert_eq!(
            dropped,
            vec![
                ("a_b".to_string(), Dropped::Clash),
                (long, Dropped::TooLong)
            ]
        );
    }
}
