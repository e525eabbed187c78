"""Benchmark how the workers produce their outputs: aiokafka's ``send`` per record against
:func:`workers.service.runtime.send_batched` (one ``send_batch`` per topic partition), the
producer's CPU per record until every record is acknowledged.

Why: the score worker sends one scores record per event; py-spy put ``producer.send`` (a
coroutine, a pure-Python murmur2, the accumulator's lookup and a future per record) at ~6% of
the worker's CPU.  Both ways build the same batches (the producer's builder and batch size),
so only the Python around them differs.

Workload: ``--records`` records of ``--value-bytes`` bytes (a score record is ~1-2 KB), keyed
as scores are (distinct tweet ids), to a ``--partitions`` topic on Apache Kafka (one KRaft node,
started here), an idempotent producer with ``acks=all`` as the workers' (linger 5 ms, batches up to
1 MB).  Rounds alternate the two ways (the machine is shared and noisy: compare within a run).

    python -m bench.bench_produce
    python -m bench.bench_produce --records 50000 --rounds 5 --out /tmp/produce.md
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from aiokafka import AIOKafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from bench.results import bench_command, cpu_model, publish
from workers.dev.kafka_cluster import KafkaCluster
from workers.service.runtime import Produced, send_batched


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def per_record(producer: AIOKafkaProducer, records: Sequence[Produced]) -> None:
    acks = [await producer.send(topic, value=value, key=key) for topic, key, value in records]
    await asyncio.gather(*acks)


async def batched(producer: AIOKafkaProducer, records: Sequence[Produced]) -> None:
    acks = await send_batched(producer, records)
    await asyncio.gather(*acks)  # type: ignore[arg-type]  # no errors expected here


WAYS: dict[str, Callable[[AIOKafkaProducer, Sequence[Produced]], object]] = {
    "send per record (before)": per_record,
    "send_batched (after)": batched,
}


async def measure(bootstrap: str, topic: str, args: argparse.Namespace) -> dict[str, list[float]]:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        max_batch_size=1 << 20,
        max_request_size=1 << 20,
    )
    await producer.start()
    try:
        value = b'{"pad": "' + b"x" * max(0, args.value_bytes - 11) + b'"}'
        await (await producer.send(topic, value=value, key=b"warm-up"))
        cpu: dict[str, list[float]] = {way: [] for way in WAYS}
        for n in range(args.rounds):
            order = list(WAYS) if n % 2 == 0 else list(reversed(WAYS))
            for way in order:
                records = [(topic, f"{n}-{way[:4]}-{i}".encode(), value) for i in range(args.records)]
                started = cpu_s()
                await WAYS[way](producer, records)  # type: ignore[misc]
                cpu[way].append((cpu_s() - started) / args.records * 1e6)
        return cpu
    finally:
        await producer.stop()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=20_000, help="records per round and way")
    p.add_argument("--value-bytes", type=int, default=1500)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    topic = f"bench-produce-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    with KafkaCluster(nodes=1, data_dir=tempfile.mkdtemp(prefix="bench-produce-")) as kafka:
        admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        try:
            admin.create_topics([NewTopic(topic, args.partitions, 1)])
        finally:
            admin.close()
        cpu = asyncio.run(measure(kafka.bootstrap, topic, args))
    before, after = (statistics.median(cpu[way]) for way in WAYS)
    lines = [
        "## Outputs sent in batches (bench/bench_produce.py)",
        "",
        f"Command: `{bench_command('bench_produce', argv)}`. Machine: {cpu_model()}; Apache Kafka "
        f"(one KRaft node) on the same machine; {args.records:,} records of {args.value_bytes:,} bytes "
        f"per round and way, {args.partitions} partitions ({time.monotonic() - started:.0f} s in all).",
        "",
        "| way | producer CPU µs per record (median) | per round |",
        "|---|---:|---|",
        *(
            f"| {way} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |"
            for way, values in cpu.items()
        ),
        "",
        f"send_batched takes {before / after:.2f}x less of the producer's CPU per record.",
    ]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
