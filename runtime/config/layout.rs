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

use toml_edit::{DocumentMut, Item, TableLike};

/// `file` (the file's text) with the change from `before` to `after` (both serialised
/// configs) applied, or `None` when one of them does not parse as TOML.
pub fn patched(file: &str, before: &str, after: &str) -> Option<String> {
    let mut file: DocumentMut = file.parse().ok()?;
    let before: DocumentMut = before.parse().ok()?;
    let after: DocumentMut = after.parse().ok()?;
    patch(file.as_table_mut(), before.as_table(), after.as_table());
    Some(file.to_string())
}

fn patch(file: &mut dyn TableLike, before: &dyn TableLike, after: &dyn TableLike) {
    let gone: Vec<String> = before
        .iter()
        .filter(|(k, _)| !after.contains_key(k))
        .map(|(k, _)| k.to_string())
        .collect();
    for key in gone {
        file.remove(&key);
    }
    for (key, new) in after.iter() {
        let old = before.get(key);
        match (old.and_then(Item::as_table_like), new.as_table_like()) {
            // A table on every side: only what changed inside it is touched.
            (Some(old), Some(new_table)) => {
                match file.get_mut(key).and_then(Item::as_table_like_mut) {
                    Some(inside) => patch(inside, old, new_table),
                    None => {
                        file.insert(key, spaced(new.clone()));
                    }
                }
            }
            // Both serialised by the same writer: the same text is the same value.
            _ if old.is_some_and(|o| same(o, new)) && file.contains_key(key) => {}
            _ => {
                written(file, key, new);
            }
        }
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
        assert!(out.starts_with(FILE), "{out}");
        assert!(
            out.ends_with("\n\n[use.fast]\nprovider = \"groq\"\n"),
            "{out}"
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
    fn a_changed_inline_table_stays_inline() {
        let after = BEFORE.replace("Bearer t", "Bearer u");
        let out = patched(FILE, BEFORE, &after).unwrap();
        assert!(
            out.contains("headers = { Authorization = \"Bearer u\" }   # inline, as I like it"),
            "{out}"
        );
    }
}
