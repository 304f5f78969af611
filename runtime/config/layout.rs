//! Writing a changed config back into the file a person wrote, keeping what they wrote.
//!
//! `colony config set`, `colony mcp add` and the wizard change a [`super::Config`] and save it.
//! Serialised afresh, the file would lose its comments, its order, its inline tables and the
//! settings written out at their default value. So the change is applied to the file's own
//! document (`toml_edit`) as a three-way merge: what the file says now (`file`), the config as
//! it was read from it (`before`, serialised) and the config to save (`after`, serialised).
//! Only what differs between `before` and `after` is touched: a key gone from `after` is
//! removed, a key new or changed in `after` is written; everything else, written as the person
//! wrote it, stays.

use toml_edit::{DocumentMut, Item, Table, TableLike};

/// `file` (the file's text) with the change from `before` to `after` (both serialised
/// configs) applied, or `None` when one of them does not parse as TOML.
pub fn patched(file: &str, before: &str, after: &str) -> Option<String> {
    let mut file: DocumentMut = file.parse().ok()?;
    let before: DocumentMut = before.parse().ok()?;
    let after: DocumentMut = after.parse().ok()?;
    // The file's own headers, by place and path, before the patch: a table the patch writes
    // anew carries a place from `after`'s text, not this file's.
    let mut headers = Vec::new();
    own_headers(file.as_table(), &mut Vec::new(), &mut headers);
    headers.sort();
    let mut left = Vec::new();
    let mut fresh = Vec::new();
    patch(
        file.as_table_mut(),
        before.as_table(),
        after.as_table(),
        &mut left,
        (&mut Vec::new(), &mut fresh),
    );
    place(file.as_table_mut(), &fresh);
    // The last first: comments of two tables removed in a row keep their order.
    left.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
    for (removed, text) in left {
        let next = headers
            .iter()
            .filter(|(at, _)| *at > removed)
            .find_map(|(_, path)| {
                table_at(file.as_table_mut(), path)
                    .is_some()
                    .then_some(path)
            });
        match next.and_then(|path| table_at(file.as_table_mut(), path)) {
            Some(table) => {
                let own = table
                    .decor()
                    .prefix()
                    .and_then(|p| p.as_str())
                    .unwrap_or("");
                let prefix = format!("{text}{own}");
                table.decor_mut().set_prefix(prefix);
            }
            None => {
                let trailing = file.trailing().as_str().unwrap_or("").to_string();
                file.set_trailing(format!("{trailing}{text}"));
            }
        }
    }
    Some(file.to_string())
}

/// Comments a removed table leaves, with the place it had: those above its own, set apart
/// from them by a blank line. The file's header comment is written into the first table's
/// prefix, and `config unset` of that table took the header with it.
type Left = (isize, String);

/// Where `patch` is (the path of `file`), and the paths of the tables it wrote anew.
type Written<'a> = (&'a mut Vec<String>, &'a mut Vec<Vec<String>>);

fn patch(
    file: &mut dyn TableLike,
    before: &dyn TableLike,
    after: &dyn TableLike,
    left: &mut Vec<Left>,
    (path, fresh): Written,
) {
    let gone: Vec<String> = before
        .iter()
        .filter(|(k, _)| !after.contains_key(k))
        .map(|(k, _)| k.to_string())
        .collect();
    for key in gone {
        if let Some(Item::Table(t)) = file.get(&key)
            && let Some((at, prefix)) = first_header(t)
            && let Some(cut) = paragraph_end(&prefix)
        {
            left.push((at, prefix[..cut].to_string()));
        }
        file.remove(&key);
    }
    for (key, new) in after.iter() {
        let old = before.get(key);
        match (old.and_then(Item::as_table_like), new.as_table_like()) {
            // A table on every side: only what changed inside it is touched.
            (Some(old), Some(new_table)) => {
                match file.get_mut(key).and_then(Item::as_table_like_mut) {
                    Some(inside) => {
                        path.push(key.to_string());
                        patch(inside, old, new_table, left, (&mut *path, &mut *fresh));
                        path.pop();
                    }
                    None => {
                        file.insert(key, spaced(new.clone()));
                        written_anew(path, key, new, fresh);
                    }
                }
            }
            // Both serialised by the same writer: the same text is the same value.
            _ if old.is_some_and(|o| same(o, new)) && file.contains_key(key) => {}
            _ => {
                written(file, key, new);
                written_anew(path, key, new, fresh);
            }
        }
    }
}

/// Where the last paragraph before a header's own comment ends: after the line ending before
/// the last blank line (`\n\n`, or `\r\n\r\n` in a file written on Windows).
fn paragraph_end(prefix: &str) -> Option<usize> {
    let unix = prefix.rfind("\n\n").map(|i| i + 1);
    let windows = prefix.rfind("\r\n\r\n").map(|i| i + 2);
    unix.into_iter().chain(windows).max()
}

/// The place and prefix of the first header written in `table` (itself, or the first of the
/// tables in it when it has no header of its own: `[use]` above `[use.code]`).
fn first_header(table: &Table) -> Option<(isize, String)> {
    let own = (!table.is_implicit())
        .then(|| table.position())
        .flatten()
        .map(|at| {
            let prefix = table.decor().prefix().and_then(|p| p.as_str());
            (at, prefix.unwrap_or("").to_string())
        });
    let inner = table.iter().filter_map(|(_, item)| match item {
        Item::Table(t) => first_header(t),
        _ => None,
    });
    own.into_iter().chain(inner).min_by_key(|(at, _)| *at)
}

/// The place and path of every header written in `table` (the file as read).
fn own_headers(table: &Table, path: &mut Vec<String>, out: &mut Vec<(isize, Vec<String>)>) {
    if !table.is_implicit()
        && let Some(at) = table.position()
    {
        out.push((at, path.clone()));
    }
    for (key, item) in table.iter() {
        if let Item::Table(t) = item {
            path.push(key.to_string());
            own_headers(t, path, out);
            path.pop();
        }
    }
}

/// The table at `path`, if there is one still.
fn table_at<'a>(table: &'a mut Table, path: &[String]) -> Option<&'a mut Table> {
    match path.split_first() {
        None => Some(table),
        Some((key, rest)) => match table.get_mut(key)? {
            Item::Table(t) => table_at(t, rest),
            _ => None,
        },
    }
}

/// Writes `new` under `key`, keeping the key's place and, for a value, the comment around it.
fn written(file: &mut dyn TableLike, key: &str, new: &Item) {
    match (file.get_mut(key), new) {
        (Some(Item::Value(v)), Item::Value(n)) => {
            let decor = v.decor().clone();
            *v = n.clone();
            *v.decor_mut() = decor;
        }
        _ => {
            file.insert(key, spaced(new.clone()));
        }
    }
}

/// `item` with a blank line before each table header in it, as the serialiser writes them.
fn spaced(mut item: Item) -> Item {
    if let Item::Table(t) = &mut item {
        t.decor_mut().set_prefix("\n");
        for (_, inner) in t.iter_mut() {
            *inner = spaced(std::mem::take(inner));
        }
    }
    item
}

/// Records the tables `new`, written under `key` at `path`, holds: [`place`] places them.
fn written_anew(path: &mut Vec<String>, key: &str, new: &Item, fresh: &mut Vec<Vec<String>>) {
    path.push(key.to_string());
    tables_in(new, path, fresh);
    path.pop();
}

/// The paths of the tables in `item` (at `path`), itself first.
fn tables_in(item: &Item, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Item::Table(t) = item {
        out.push(path.clone());
        for (key, inner) in t.iter() {
            path.push(key.to_string());
            tables_in(inner, path, out);
            path.pop();
        }
    }
}

/// Gives each table written anew (`fresh`, in the order written) its place: right after the
/// last table of the file that shares the most of its path (`[use.fast]` after the last
/// `[use.*]`, `[mcp.desk]` after `[mcp.docs.headers]`), else at the end. They carried the place
/// they had in the serialised config, which fell among the file's own anywhere.
fn place(root: &mut Table, fresh: &[Vec<String>]) {
    let mut placed: Vec<(isize, Vec<String>)> = Vec::new();
    each_table(root, &mut Vec::new(), &mut |t, path| {
        if let Some(at) = t.position()
            && !t.is_implicit()
            && !path.is_empty()
            && !fresh.iter().any(|f| f.as_slice() == path)
        {
            placed.push((at, path.to_vec()));
        }
    });
    for (n, new) in fresh.iter().enumerate() {
        let shared = |path: &[String]| path.iter().zip(new).take_while(|(a, b)| a == b).count();
        let best = placed.iter().map(|(_, p)| shared(p)).max().unwrap_or(0);
        let anchor = placed
            .iter()
            .filter(|(_, p)| shared(p) == best)
            .map(|(at, _)| *at)
            .max()
            .unwrap_or(-1);
        let later = &fresh[n + 1..];
        each_table(root, &mut Vec::new(), &mut |t, path| {
            if path == new.as_slice() {
                t.set_position(anchor + 1);
            } else if let Some(at) = t.position()
                && at > anchor
                && !later.iter().any(|f| f.as_slice() == path)
            {
                t.set_position(at + 1);
            }
        });
        for (at, _) in placed.iter_mut() {
            if *at > anchor {
                *at += 1;
            }
        }
        placed.push((anchor + 1, new.clone()));
    }
}

/// Calls `f` with every table under `table` (arrays of tables' too) and its path.
fn each_table(
    table: &mut Table,
    path: &mut Vec<String>,
    f: &mut impl FnMut(&mut Table, &[String]),
) {
    f(table, path);
    for (key, item) in table.iter_mut() {
        path.push(key.to_string());
        match item {
            Item::Table(t) => each_table(t, path, f),
            Item::ArrayOfTables(list) => {
                for t in list.iter_mut() {
                    each_table(t, path, f);
                }
            }
            _ => {}
        }
        path.pop();
    }
}

fn same(a: &Item, b: &Item) -> bool {
    match (a, b) {
        (Item::Value(a), Item::Value(b)) => {
            a.clone().decorated("", "").to_string() == b.clone().decorated("", "").to_string()
        }
        _ => a.to_string() == b.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::patched;

    const FILE: &str = r#"# My colony config.

[use.general]
provider = "anthropic"   # the default
max_tokens = 4096        # written out though it is the default

# Servers
[mcp.docs]
url = "https://docs.example/mcp"
headers = { Authorization = "Bearer t" }   # inline, as I like it
"#;

    const BEFORE: &str = r#"[use.general]
provider = "anthropic"

[mcp.docs]
url = "https://docs.example/mcp"

[mcp.docs.headers]
Authorization = "Bearer t"
"#;

    #[test]
    fn a_new_setting_leaves_every_comment_and_the_rest_as_written() {
        let after = format!("{BEFORE}\n[use.fast]\nprovider = \"groq\"\n");
        let out = patched(FILE, BEFORE, &after).unwrap();
        // The new table goes after the last of its kind ([use.*]), the rest as written.
        let (head, servers) = FILE.split_at(FILE.find("# Servers").unwrap());
        assert_eq!(
            out,
            format!("{head}[use.fast]\nprovider = \"groq\"\n\n{servers}")
        );
    }

    #[test]
    fn a_changed_value_keeps_its_comment_and_a_removed_table_goes() {
        let after = BEFORE
            .replace("\"anthropic\"", "\"openai\"")
            .replace(
                "[mcp.docs]\nurl = \"https://docs.example/mcp\"\n\n[mcp.docs.headers]\nAuthorization = \"Bearer t\"\n",
                "",
            );
        let out = patched(FILE, BEFORE, &after).unwrap();
        assert!(
            out.contains("provider = \"openai\"   # the default\n"),
            "{out}"
        );
        assert!(out.contains("max_tokens = 4096"), "{out}");
        assert!(!out.contains("docs"), "{out}");
    }

    #[test]
    fn a_removed_table_leaves_the_comments_above_its_own() {
        let file = "# my laptop config\n# keep keys out of git\n\n[use.code]\nprovider = \"openai\"\n\n# the general one\n[use.general]\nprovider = \"openai\"\n";
        let before = "[use.code]\nprovider = \"openai\"\n\n[use.general]\nprovider = \"openai\"\n";
        let only_general = "[use.general]\nprovider = \"openai\"\n";
        let out = patched(file, before, only_general).unwrap();
        assert_eq!(
            out,
            "# my laptop config\n# keep keys out of git\n\n# the general one\n[use.general]\nprovider = \"openai\"\n"
        );
        // The last table gone: the header stays, alone.
        let out = patched(&out, only_general, "").unwrap();
        assert_eq!(out, "# my laptop config\n# keep keys out of git\n");
        // Written on Windows: the same.
        let crlf = file.replace('\n', "\r\n");
        let out = patched(&crlf, before, only_general).unwrap();
        assert!(
            out.replace("\r\n", "\n")
                .starts_with("# my laptop config\n# keep keys out of git\n\n# the general one"),
            "{out:?}"
        );
        // Two tables removed in a row: their comments stay in their order.
        let three = "# one\n\n[use.a]\nmodel = \"1\"\n\n# two\n\n[use.b]\nmodel = \"2\"\n\n[use.c]\nmodel = \"3\"\n";
        let before3 =
            "[use.a]\nmodel = \"1\"\n\n[use.b]\nmodel = \"2\"\n\n[use.c]\nmodel = \"3\"\n";
        let out = patched(three, before3, "[use.c]\nmodel = \"3\"\n").unwrap();
        assert!(out.starts_with("# one\n\n# two\n"), "{out:?}");
        // The comment right above a table is its own and goes with it.
        let only_code = "[use.code]\nprovider = \"openai\"\n";
        let out = patched(file, before, only_code).unwrap();
        assert!(!out.contains("the general one"), "{out}");
        assert!(out.starts_with("# my laptop config\n"), "{out}");
    }

    /// A new table goes after the file's tables, not among another's (`colony mcp add` put
    /// `[mcp.desk]` between `[mcp.docs]` and `[mcp.docs.headers]`).
    #[test]
    fn a_new_table_goes_after_the_files_last() {
        let file = "[mcp.docs]\nurl = \"https://docs.example/mcp\"\n\n[mcp.docs.headers]\nAuthorization = \"Bearer t\"\n";
        let after = "[mcp.desk]\ncommand = \"colony\"\n\n[mcp.docs]\nurl = \"https://docs.example/mcp\"\n\n[mcp.docs.headers]\nAuthorization = \"Bearer t\"\n";
        let out = patched(file, file, after).unwrap();
        assert_eq!(out, format!("{file}\n[mcp.desk]\ncommand = \"colony\"\n"));
    }

    #[test]
    fn a_changed_inline_table_stays_inline() {
        let after = BEFORE.replace("Bearer t", "Bearer u");
        let out = patched(FILE, BEFORE, &after).unwrap();
        assert!(
            out.contains("headers = { Authorization = \"Bearer u\" }   # inline, as I like it"),
            "{out}"
        );
    }
}
