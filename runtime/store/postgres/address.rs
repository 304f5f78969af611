//! A PostgreSQL store's address: the `postgres://` URL a user gives (`[store] url`, `--store`),
//! parsed for the client, and shown in messages without its password.

use std::str::FromStr;
use std::time::Duration;

use super::super::{StoreError, StoreResult};

/// How long opening a connection may take when the URL does not say (`connect_timeout=`): an
/// address that drops packets fails within this instead of hanging the program's start.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The PostgreSQL schema a program's tables live in: `colony_<script stem>` (lowercase ASCII
/// letters, digits and `_`, the rest as `_`, at most 63 bytes), so several programs can share
/// one database, and every node running the same program file finds the same tables.
pub fn schema_for(script: &std::path::Path) -> String {
    let stem = script
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut name = String::from("colony_");
    name.extend(stem.chars().map(|c| match c.to_ascii_lowercase() {
        c @ ('a'..='z' | '0'..='9' | '_') => c,
        _ => '_',
    }));
    if name == "colony_" {
        name.push_str("script");
    }
    name.truncate(63);
    name
}

/// Whether `url` names a PostgreSQL store (`postgres://` or `postgresql://`).
pub fn is_postgres(url: &str) -> bool {
    let lower = url.trim_start().to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

/// `URL is not a PostgreSQL URL (...)`, the URL shown without its password: said alike by
/// every place that takes one (`--store`, `[store] url`, the store's own opening).
pub fn not_postgres(url: &str) -> String {
    format!(
        "{} is not a PostgreSQL URL (postgres://USER@HOST:PORT/DATABASE)",
        redact(url)
    )
}

/// The client's configuration for `url`, with a connect timeout when it sets none.
pub(super) fn config(url: &str, schema: Option<&str>) -> StoreResult<tokio_postgres::Config> {
    let shown = redact(url);
    if !is_postgres(url) {
        return Err(StoreError::Value(not_postgres(url)));
    }
    let mut config = tokio_postgres::Config::from_str(url.trim()).map_err(|e| {
        StoreError::Value(format!(
            "{shown} is not a PostgreSQL URL colony can use: {}",
            super::describe(&e)
        ))
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if let Some(schema) = schema {
        // Every connection resolves the store's tables in the program's schema.
        let options = match config.get_options() {
            Some(given) => format!("{given} -c search_path={schema}"),
            None => format!("-c search_path={schema}"),
        };
        config.options(&options);
    }
    if config.get_application_name().is_none() {
        config.application_name("colony");
    }
    Ok(config)
}

/// `url` as messages show it: its password (in the user part or a `password=` parameter)
/// removed. A text that does not parse as a URL is shown up to its `@` only when it has one
/// (whatever came before may hold a password).
pub fn redact(url: &str) -> String {
    let url = url.trim();
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            let _ = parsed.set_password(None);
            let kept: Vec<(String, String)> = parsed
                .query_pairs()
                .filter(|(k, _)| !k.eq_ignore_ascii_case("password"))
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            if kept.is_empty() {
                parsed.set_query(None);
            } else {
                parsed.query_pairs_mut().clear().extend_pairs(kept);
            }
            parsed.to_string()
        }
        Err(_) => match url.rsplit_once('@') {
            Some((_, host)) => format!("postgres://...@{host}"),
            None => url.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_drops_passwords_and_keeps_the_rest() {
        assert_eq!(
            redact("postgres://app:s3cret@db.example:5433/colony"),
            "postgres://app@db.example:5433/colony"
        );
        assert_eq!(
            redact("postgresql://app@db/colony?password=s3cret&sslmode=disable"),
            "postgresql://app@db/colony?sslmode=disable"
        );
        assert_eq!(redact("postgres://db/colony"), "postgres://db/colony");
        assert!(!redact("postgres://a:b c@@x/y").contains("b c"));
    }

    #[test]
    fn a_program_s_schema_is_its_file_stem() {
        use std::path::Path;
        assert_eq!(schema_for(Path::new("/x/watcher.lua")), "colony_watcher");
        assert_eq!(schema_for(Path::new("My Bot-2.lua")), "colony_my_bot_2");
        assert_eq!(schema_for(Path::new("été.lua")), "colony__t_");
        assert_eq!(schema_for(Path::new("")), "colony_script");
        assert_eq!(schema_for(Path::new(&"a".repeat(100))).len(), 63);
    }

    #[test]
    fn config_refuses_what_is_not_a_postgres_url() {
        let err = config("mysql://app:pw@db/x", None).unwrap_err();
        assert_eq!(err.kind(), "value_error");
        assert!(err.to_string().contains("mysql://app@db/x"), "{err}");
        assert!(!err.to_string().contains("pw"), "{err}");
        let err = config("postgres://app:pw@db:notaport/x", None).unwrap_err();
        assert!(!err.to_string().contains(":pw"), "{err}");
        let ok = config("postgres://app:pw@127.0.0.1:5432/x", Some("colony_w")).unwrap();
        assert_eq!(ok.get_options(), Some("-c search_path=colony_w"));
        assert_eq!(ok.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(ok.get_dbname(), Some("x"));
    }
}
