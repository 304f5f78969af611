//! The colony command (being written).
