"""Reads a whole topic back with kafka-python, a Kafka client independent of the sink's.

Usage: read.py <bootstrap host:port> <topic>

Reads every partition from its first offset to its end offset at the start, and prints one JSON
object per record, in each partition's offset order: partition, offset, key, value, headers
([name, value] pairs in record order), timestamp (ms), and the partition kafka-python's own
default partitioner picks for the key. Exits non-zero when the end is not reached in 20 seconds.
"""

import json
import sys
import time

from kafka import KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2


def keyed_partition(key, partitions):
    """The partition kafka-python's DefaultPartitioner picks for a key: its murmur2, positive,
    modulo the partition count (the Java client's rule)."""
    return partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]


def text(raw):
    return None if raw is None else raw.decode("utf-8")


def main():
    bootstrap, topic = sys.argv[1], sys.argv[2]
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    partitions = sorted(consumer.partitions_for_topic(topic) or [])
    if not partitions:
        print(f"topic {topic} has no partitions", file=sys.stderr)
        return 2
    assigned = [TopicPartition(topic, p) for p in partitions]
    consumer.assign(assigned)
    consumer.seek_to_beginning()
    ends = consumer.end_offsets(assigned)
    records = []
    deadline = time.monotonic() + 20
    while any(consumer.position(tp) < ends[tp] for tp in assigned):
        if time.monotonic() > deadline:
            print(f"did not reach the end offsets {ends} of {topic}", file=sys.stderr)
            return 1
        for batch in consumer.poll(timeout_ms=500).values():
            for message in batch:
                records.append(
                    {
                        "partition": message.partition,
                        "offset": message.offset,
                        "key": text(message.key),
                        "value": text(message.value),
                        "headers": [[name, text(value)] for name, value in message.headers],
                        "timestamp": message.timestamp,
                        "expected_partition": keyed_partition(message.key, partitions),
                    }
                )
    consumer.close()
    records.sort(key=lambda r: (r["partition"], r["offset"]))
    for record in records:
        print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
