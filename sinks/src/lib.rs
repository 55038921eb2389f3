//! Sinks for watukuy events (issue 10; not implemented yet).
