//! The old path of the inference middleware, which is now [`crate::infer`]. Only the breaker's
//! state is still named here, by the store; once it names [`crate::infer::breaker`], this file
//! and its `mod` line go.

pub use crate::infer::breaker::{BreakerState, BreakerStatus};
