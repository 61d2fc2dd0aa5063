"""A real S3-compatible server for tests: ``scripts/s3-server`` (moto's S3 over HTTP on loopback) in its
own process, and the AWS environment that points memlane (LanceDB and pyarrow) at it.

Import the fixture into a test module (``from tests.s3 import s3``) so pytest registers it there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]  # no stubs installed; only the tests list objects with it
import pytest

from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "memlane-test"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


class S3Server:
    """``scripts/s3-server`` on a free loopback port, with one bucket."""

    def __init__(self, workdir: Path, *, write_lock: bool = True) -> None:
        ready = workdir / f"s3-ready-{uuid.uuid4().hex[:8]}"
        args = [sys.executable, str(ROOT / "scripts" / "s3-server"), "--bucket", BUCKET]
        args += ["--ready-file", str(ready)] + ([] if write_lock else ["--no-write-lock"])
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: ready.exists() or self.proc.poll() is not None, timeout=60)
        except AssertionError:
            self.proc.kill()
            raise
        if self.proc.poll() is not None:
            raise RuntimeError(f"scripts/s3-server exited: {self.proc.communicate()[1][-2000:]}")
        self.endpoint = ready.read_text()
        self.env = {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=CREDENTIALS["AWS_REGION"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def uri(self, *parts: str) -> str:
        return "/".join([f"s3://{BUCKET}", *parts])

    def keys(self, prefix: str = "") -> list[str]:
        out: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return out

    def holders(self, prefix: str, needle: bytes) -> list[str]:
        """Every object under ``prefix`` whose raw bytes contain ``needle``."""
        return [
            k
            for k in self.keys(prefix)
            if needle in self.client.get_object(Bucket=BUCKET, Key=k)["Body"].read()
        ]

    def stop(self) -> dict[str, Any]:
        """Stops the server; returns its commit counts (see scripts/s3-server)."""
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        stats = [line for line in out.splitlines() if line.startswith("STATS ")]
        return json.loads(stats[-1][6:]) if stats else {}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The server, with the AWS variables set in this process for the module (sidecars run in-process,
    and the S3 clients inside LanceDB and pyarrow read them from the environment)."""
    server = S3Server(tmp_path_factory.mktemp("s3"))
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
