//! The sinks' test targets a build leaves out because their feature is off (`required-features`
//! in `Cargo.toml`), reported as *ignored* with the command that runs them, never as passed.
//! Each fails when run anyway (`--include-ignored`): the tests it stands for did not run.

#[cfg(not(feature = "webhook"))]
#[test]
#[ignore = "the webhook sink's tests (tests/webhook.rs, tests/engine.rs) need the `webhook` feature: cargo test -p watukuy-sinks --features webhook"]
fn webhook_tests_need_the_webhook_feature() {
    panic!("built without the `webhook` feature: tests/webhook.rs and tests/engine.rs did not run");
}

#[cfg(not(feature = "nats"))]
#[test]
#[ignore = "the NATS sink's tests (tests/nats.rs) need the `nats` feature: cargo test -p watukuy-sinks --features nats"]
fn nats_tests_need_the_nats_feature() {
    panic!("built without the `nats` feature: tests/nats.rs did not run");
}

#[cfg(not(feature = "rabbitmq"))]
#[test]
#[ignore = "the RabbitMQ sink's tests (tests/rabbit.rs) need the `rabbitmq` feature: cargo test -p watukuy-sinks --features rabbitmq"]
fn rabbitmq_tests_need_the_rabbitmq_feature() {
    panic!("built without the `rabbitmq` feature: tests/rabbit.rs did not run");
}

#[cfg(not(feature = "bullmq"))]
#[test]
#[ignore = "the BullMQ sink's tests (tests/bullmq.rs) need the `bullmq` feature: cargo test -p watukuy-sinks --features bullmq"]
fn bullmq_tests_need_the_bullmq_feature() {
    panic!("built without the `bullmq` feature: tests/bullmq.rs did not run");
}

#[cfg(not(feature = "sqs"))]
#[test]
#[ignore = "the SQS sink's tests (tests/sqs.rs) need the `sqs` feature: cargo test -p watukuy-sinks --features sqs"]
fn sqs_tests_need_the_sqs_feature() {
    panic!("built without the `sqs` feature: tests/sqs.rs did not run");
}

#[cfg(not(feature = "kafka"))]
#[test]
#[ignore = "the Kafka sink's tests (tests/kafka.rs) need the `kafka` feature: cargo test -p watukuy-sinks --features kafka"]
fn kafka_tests_need_the_kafka_feature() {
    panic!("built without the `kafka` feature: tests/kafka.rs did not run");
}
