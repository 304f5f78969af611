//! The Lua host (being written).
