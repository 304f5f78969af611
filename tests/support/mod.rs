//! Helpers shared by the integration tests (`mod support;`) and the benches
//! (`#[path = "../tests/support/mod.rs"] mod support;`). Every binary uses a subset, hence the
//! `dead_code` allowance; nothing here depends on test-only macros.
#![allow(dead_code, unused_imports)]

pub mod fake;
pub mod script;
