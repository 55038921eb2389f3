//! The whole watukuy conformance suite on Redis: every case under its own key prefix (see
//! `common::RedisHarness`), against `WATUKUY_TEST_REDIS_URL`.

mod common;

use common::RedisHarness;

watukuy_conformance::store_tests!(
    RedisHarness,
    #[watukuy_testenv::requires(redis, or_cfg(feature = "testcontainers"))]
);
