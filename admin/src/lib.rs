//! The watukuy admin page (issue 11; not implemented yet).
