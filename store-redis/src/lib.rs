//! The Redis (one Lua script per fenced write) and the Redis budget store store for watukuy.
//!
//! This crate is a skeleton: the store arrives with issue 7. Until then it exports nothing.
