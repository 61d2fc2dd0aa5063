"""AssembleContext latency on a 200-message session (no LTM), as a ratio to a bare grpc.aio echo.

Not a test: it prints figures. Both servers run in this process on the same kind of event-loop thread,
and the echo is measured in the same run, so the ratio is stable across machines.

    /work/venv/bin/python benchmarks/bench_assemble.py [--n 2000] [--redis-url redis://127.0.0.1:6379/0]

Target: p50 <= 3x echo.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid

import grpc
import redis

import memlane
from memlane import Message, Role
from memlane_server.background import SidecarThread
from memlane_server.config import build_settings

ECHO_METHOD = "/bench.Echo/Echo"


def _identity(b: bytes) -> bytes:
    return b


async def _echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def start_echo() -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(
                _echo, request_deserializer=_identity, response_serializer=_identity
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


async def measure(n: int, target: str, echo_target: str, session_id: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"echo": [], "assemble": []}
    async with memlane.AsyncClient(target, timeout=10) as client:
        channel = grpc.aio.insecure_channel(echo_target)
        echo = channel.unary_unary(ECHO_METHOD, request_serializer=_identity, response_deserializer=_identity)
        payload = b"x" * 64
        for _ in range(200):  # warm-up both paths
            await echo(payload)
            async for _item in client.assemble_context(session_id=session_id, user_input="next?"):
                pass
        # Interleave so both see the same machine conditions.
        for _ in range(n):
            t0 = time.perf_counter()
            await echo(payload)
            t1 = time.perf_counter()
            async for _item in client.assemble_context(session_id=session_id, user_input="next?"):
                pass
            t2 = time.perf_counter()
            out["echo"].append(t1 - t0)
            out["assemble"].append(t2 - t1)
        await channel.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--messages", type=int, default=200)
    args = ap.parse_args()
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        settings = build_settings(
            flags={
                "listen": "127.0.0.1:0",
                "admin_listen": "",
                "redis_url": args.redis_url,
                "key_prefix": prefix,
                "data_dir": tmp,
                "ltm_enabled": False,
            },
            env={},
        )
        sidecar = SidecarThread(settings).start()
        echo_server, echo_target = asyncio.run_coroutine_threadsafe(start_echo(), sidecar.loop).result(10)
        try:
            with memlane.Client(sidecar.target) as c:
                sid = c.create_session(user_id="bench", model="gpt-4o").session.session_id
                msgs = [
                    Message(
                        role=Role.ROLE_USER if i % 2 else Role.ROLE_ASSISTANT,
                        content=f"Message {i}: a typical chat turn of about forty tokens, mentioning "
                        f"order ORD-{1000 + i} and asking whether the delivery date can still move.",
                    )
                    for i in range(args.messages)
                ]
                c.append_messages(session_id=sid, messages=msgs)
            res = asyncio.run(measure(args.n, sidecar.target, echo_target, sid))
        finally:
            asyncio.run_coroutine_threadsafe(echo_server.stop(0), sidecar.loop).result(10)
            sidecar.stop()
            r = redis.Redis.from_url(args.redis_url)
            keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                r.delete(*keys)
            r.close()
    e50, e99 = pct(res["echo"], 0.5), pct(res["echo"], 0.99)
    a50, a99 = pct(res["assemble"], 0.5), pct(res["assemble"], 0.99)
    print(f"n={args.n} messages={args.messages} (no LTM, hybrid, gpt-4o window; 5 blocks + stats streamed)")
    for name, p50, p99 in (("echo", e50, e99), ("assemble", a50, a99)):
        mean = statistics.mean(res[name])
        print(f"{name:<9} p50 {p50 * 1e3:.3f} ms  p99 {p99 * 1e3:.3f} ms  mean {mean * 1e3:.3f} ms")
    print(f"ratio     p50 {a50 / e50:.2f}x  p99 {a99 / e99:.2f}x  (target p50 <= 3x)")


if __name__ == "__main__":
    main()
