"""The cost of tracing: ``Memlane.context()`` (AssembleContext with long-term memory: recall, embedding,
Redis) through an in-process sidecar, in one run:

- **off**: no SDK installed (the first sidecar is built before it is; the client finds none);
- then the SDK installed as ``configure_tracing`` installs it (a batch processor), the spans encoded as the
  OTLP exporter encodes them and dropped (no collector needed), with a parent-based sampler that drops
  root spans, and on a second sidecar, in alternating rounds (the machine's load drifts):
  **unsampled** (no agent span: every span is dropped at its start, as with a sampler that keeps none) and
  **on** (each call under a sampled agent's span, as an agent's turn would be: every span recorded).

The global provider can be installed only once per process, hence the order.

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
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased

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


def _sidecar(url: str, data: str) -> SidecarThread:
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
    return SidecarThread(settings)  # started by `with`


def _session(m: memlane.Memlane) -> str:
    user, sid = f"u-{uuid.uuid4().hex[:6]}", f"chat-{uuid.uuid4().hex[:8]}"
    for i in range(20):
        m.remember(user, f"User's parcel {3300 + i} waits at depot {i}.")
    m.add(user, sid, [{"role": "user", "content": "Hello"}])
    return sid


def _round(m: memlane.Memlane, sid: str, n: int, agent: trace.Tracer | None) -> list[float]:
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        if agent is None:
            m.context(sid, f"Where is parcel {3300 + i % 20}?")
        else:
            with agent.start_as_current_span("agent-turn"):
                m.context(sid, f"Where is parcel {3300 + i % 20}?")
        samples.append(time.perf_counter() - t0)
    return samples


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("-n", type=int, default=300)
    args = ap.parse_args()
    rounds = max(1, args.n // 50)
    with tempfile.TemporaryDirectory() as off_dir, tempfile.TemporaryDirectory() as on_dir:
        srv = _sidecar(args.redis_url, off_dir)
        with srv, memlane.Memlane(srv.target, agent_id="bench") as m:
            sid = _session(m)
            _round(m, sid, 50, None)  # warm-up
            off = _round(m, sid, args.n, None)
        exporter = EncodingExporter()
        provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        agent = TracerProvider(sampler=ALWAYS_ON).get_tracer("agent")  # the agent samples its turns
        srv = _sidecar(args.redis_url, on_dir)
        unsampled: list[float] = []
        on: list[float] = []
        with srv, memlane.Memlane(srv.target, agent_id="bench") as m:
            sid = _session(m)
            _round(m, sid, 50, agent)  # warm-up
            for _ in range(rounds):
                unsampled += _round(m, sid, args.n // rounds, None)
                on += _round(m, sid, args.n // rounds, agent)
        provider.shutdown()
    p50 = {
        name: statistics.median(v) * 1000 for name, v in (("off", off), ("unsampled", unsampled), ("on", on))
    }
    spans = exporter.spans / (len(on) + 50)
    off_ms, unsampled_ms, on_ms = p50["off"], p50["unsampled"], p50["on"]
    print(f"Memlane.context p50: off {off_ms:.2f} ms, unsampled {unsampled_ms:.2f} ms, on {on_ms:.2f} ms")
    print(f"on / unsampled (interleaved): {on_ms / unsampled_ms:.2f}; on / off: {on_ms / off_ms:.2f}")
    print(f"spans a traced call: {spans:.0f}")


if __name__ == "__main__":
    main()
