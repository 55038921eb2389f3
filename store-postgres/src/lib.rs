//! The PostgreSQL (sqlx): many instances on one database store for watukuy.
//!
//! This crate is a skeleton: the store arrives with issue 6. Until then it exports nothing.
