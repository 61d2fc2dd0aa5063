"""The cost of tracing: ``Memlane.context()`` (AssembleContext with long-term memory: recall, embedding,
Redis) through an in-process sidecar, tracing off, then on, in one run.

Off: no SDK installed (the sidecar is built before it is; the client finds none). On: the SDK installed
as ``configure_tracing`` installs it (a batch processor), the spans encoded as the OTLP exporter encodes
them (and then dropped, so no collector is needed), each call under an agent's span, as an agent's turn
would be. The global provider can be installed only once per process, so the two run one after the other.

    python benchmarks/bench_tracing.py --redis-url redis://127.0.0.1:6379 [-n 300]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import memlane
from memlane_server.background import SidecarThread
from memlane_server.config import build_settings


class EncodingExporter(SpanExporter):
    """Encodes each batch as OTLP protobuf (the exporter's own work) and drops it."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        encode_spans(spans).SerializeToString()
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def measure(url: str, n: int, data: str, agent: trace.Tracer | None) -> float:
    settings = build_settings(
        flags={
            "listen": "127.0.0.1:0",
            "admin_listen": "",
            "redis_url": url,
            "key_prefix": f"bt{uuid.uuid4().hex[:8]}",
            "data_dir": data,
            "worker_processes": 0,
        },
        env={},
    )
    user, sid = f"u-{uuid.uuid4().hex[:6]}", f"chat-{uuid.uuid4().hex[:8]}"
    with SidecarThread(settings) as srv, memlane.Memlane(srv.target, agent_id="bench") as m:
        for i in range(20):
            m.remember(user, f"User's parcel {3300 + i} waits at depot {i}.")
        m.add(user, sid, [{"role": "user", "content": "Hello"}])
        samples = []
        for i in range(n + 50):
            t0 = time.perf_counter()
            if agent is None:
                m.context(sid, f"Where is parcel {3300 + i % 20}?")
            else:
                with agent.start_as_current_span("agent-turn"):
                    m.context(sid, f"Where is parcel {3300 + i % 20}?")
            if i >= 50:  # warm-up
                samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("-n", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as off_dir, tempfile.TemporaryDirectory() as on_dir:
        off = measure(args.redis_url, args.n, off_dir, None)
        exporter = EncodingExporter()
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        on = measure(args.redis_url, args.n, on_dir, provider.get_tracer("agent"))
        provider.shutdown()
    print(f"Memlane.context, tracing off: p50 {off:.2f} ms")
    print(
        f"Memlane.context, tracing on:  p50 {on:.2f} ms ({exporter.spans / (args.n + 50):.0f} spans a call)"
    )
    print(f"on / off: {on / off:.2f}")


if __name__ == "__main__":
    main()
