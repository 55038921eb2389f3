//! The watukuy command line (issue 11; not implemented yet).

fn main() {}
