//! The HTTP helper for watukuy pollers (issue 10; not implemented yet).
