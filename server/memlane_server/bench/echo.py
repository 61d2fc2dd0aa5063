"""The baseline: a bare grpc.aio unary echo server (raw bytes, no interceptors, no protobuf).

Run as ``python -m memlane_server.bench.echo PORTFILE``; it writes its port to PORTFILE and serves until
killed, so it runs in its own process exactly like the sidecar it is compared with.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc

METHOD = "/bench.Echo/Echo"


async def _echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def serve(port_file: Path) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await asyncio.to_thread(port_file.write_text, str(port))
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1])))
