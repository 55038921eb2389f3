//! The whole watukuy conformance suite on PostgreSQL: every case in its own schema (see
//! `common::PgHarness`), against `WATUKUY_TEST_POSTGRES_URL`.

mod common;

use common::PgHarness;

watukuy_conformance::store_tests!(PgHarness);
