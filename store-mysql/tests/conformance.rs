//! The whole watukuy conformance suite on MySQL / MariaDB: every case in its own database (see
//! `common::MySqlHarness`), against `WATUKUY_TEST_MYSQL_URL`; ignored while it is unset
//! (docs/testing.md).

mod common;

use common::MySqlHarness;

watukuy_conformance::store_tests!(MySqlHarness, #[watukuy_testenv::requires(mysql)]);
