"""Which S3 endpoint the AWS variables name, as LanceDB and pyarrow will be told (infra/endpoints.py)."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from memlane_server.infra.endpoints import arrow_filesystem, lance_storage_options, s3_endpoint


def test_the_service_specific_endpoint_wins_and_loopback_http_is_allowed() -> None:
    env = {
        "AWS_ENDPOINT_URL": "https://general.example",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_REGION": "us-east-1",
    }
    assert lance_storage_options("s3://b/ltm", env) == {
        "aws_endpoint": "http://127.0.0.1:9000",
        "region": "us-east-1",
        "allow_http": "true",
    }
    fs, root = arrow_filesystem("s3://b/archive/", env)
    assert isinstance(fs, pafs.S3FileSystem) and root == "b/archive"
    assert fs.region == "us-east-1"


def test_plain_http_off_loopback_needs_an_explicit_yes() -> None:
    env = {"AWS_ENDPOINT_URL": "http://minio.internal:9000"}
    with pytest.raises(ValueError, match="AWS_ALLOW_HTTP"):
        s3_endpoint(env)
    assert s3_endpoint({**env, "AWS_ALLOW_HTTP": "true"}).allow_http
    assert not s3_endpoint({"AWS_ENDPOINT_URL": "https://minio.internal"}).allow_http
    with pytest.raises(ValueError, match="http"):
        s3_endpoint({"AWS_ENDPOINT_URL": "minio.internal:9000"})


def test_local_paths_and_aws_itself_get_no_overrides(tmp_path: object) -> None:
    assert lance_storage_options("/var/lib/memlane/ltm", {"AWS_ENDPOINT_URL": "http://127.0.0.1:1"}) is None
    assert lance_storage_options("s3://b/ltm", {}) == {}
    fs, _ = arrow_filesystem(f"file://{tmp_path}", {})
    assert isinstance(fs, pafs.LocalFileSystem)
