//! The SQLite (rusqlite): the embedded default for one host store for watukuy.
//!
//! This crate is a skeleton: the store arrives with issue 5. Until then it exports nothing.
