//! The whole watukuy conformance suite on PostgreSQL: every case in its own schema (see
//! `common::PgHarness`), against `WATUKUY_TEST_POSTGRES_URL`; ignored while it is unset
//! (docs/testing.md).

mod common;

use common::PgHarness;

watukuy_conformance::store_tests!(
    PgHarness,
    #[watukuy_testenv::requires(postgres, or_cfg(feature = "testcontainers"))]
);
