//! The whole conformance suite on Redis Cluster: a cluster of 3 primaries and 3 replicas that
//! this test binary starts on spare loopback ports (`common::servers::Cluster`, shared by every
//! case, each case under its own key prefix), reached through `redis+cluster://` URLs. Also:
//! every key a script touches shares its slot, on the real cluster.

mod common;

use common::ClusterHarness;

watukuy_conformance::store_tests!(
    ClusterHarness,
    #[watukuy_testenv::requires(redis_server)]
);
