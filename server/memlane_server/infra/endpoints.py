"""Where the services outside the process are, and which of them are this machine: S3-compatible object
storage from the AWS variables, and the one rule for "local only" decisions on host names.

**Loopback** (``is_loopback_host``): whether a host name is this machine's loopback, the one rule for
"local only" decisions on names (plain-http object storage, the viewer's Host header).

**Object storage** (``s3_endpoint``, ``lance_storage_options``, ``arrow_filesystem``). Where S3-compatible
object storage is, from the usual AWS environment variables, turned into the options of the two clients
that use it: LanceDB (the LTM table, Rust ``object_store``) and pyarrow (the Parquet archive, the AWS C++
SDK).

Both SDKs read the variables themselves, but not the same ones (the service-specific endpoint, plain HTTP):
reading them once here makes both clients talk to the same endpoint. Credentials are left to the SDKs' own
chains (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, profiles, instance roles)
and never copied into options, which may end up in a log.

- ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``: an S3-compatible server (MinIO, Ceph, moto...);
  unset: AWS itself.
- ``AWS_REGION``, else ``AWS_DEFAULT_REGION``.
- Plain ``http://`` endpoints are allowed on loopback only, unless ``AWS_ALLOW_HTTP=true``: a typo must
  not send credentials and users' memories over the network in clear.
"""

from __future__ import annotations

import ipaddress
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow.fs as pafs

# Loopback: the one rule for local-only decisions on host names.


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (``127.x.x.x``, ``::1``); a bare host, no port or brackets."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Object storage.

_TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True, slots=True)
class S3Endpoint:
    url: str  # "" = AWS's own endpoint for the region
    region: str  # "" = the SDK's default
    allow_http: bool


def is_s3(uri: str) -> bool:
    return uri.startswith(("s3://", "s3a://"))


def s3_endpoint(env: Mapping[str, str] | None = None) -> S3Endpoint:
    """The endpoint the environment names; ``ValueError`` for plain HTTP to a non-loopback host without
    ``AWS_ALLOW_HTTP=true``."""
    env = os.environ if env is None else env
    url = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or ""
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or ""
    allow_http = False
    if url:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError("AWS_ENDPOINT_URL(_S3) must be an http:// or https:// URL")
        if parsed.scheme == "http":
            allow_http = is_loopback_host(parsed.hostname) or env.get("AWS_ALLOW_HTTP", "").lower() in _TRUE
            if not allow_http:
                raise ValueError(
                    "AWS_ENDPOINT_URL(_S3) is plain http:// to a host that is not loopback: use https://,"
                    " or set AWS_ALLOW_HTTP=true if the network is trusted"
                )
    return S3Endpoint(url, region, allow_http)


def lance_storage_options(uri: str, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """``storage_options`` for ``lancedb.connect_async(uri)``; None for a local directory."""
    if not is_s3(uri):
        return None
    ep = s3_endpoint(env)
    options: dict[str, str] = {}
    if ep.url:
        options["aws_endpoint"] = ep.url
    if ep.region:
        options["region"] = ep.region
    if ep.allow_http:
        options["allow_http"] = "true"
    return options


def arrow_filesystem(uri: str, env: Mapping[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and root path for ``uri``: a local directory, ``file://``, ``s3://`` (the
    endpoint above) or any other scheme pyarrow opens itself (``gs://``...)."""
    if is_s3(uri):
        ep = s3_endpoint(env)
        kwargs: dict[str, str] = {}
        if ep.url:
            parsed = urllib.parse.urlsplit(ep.url)
            kwargs["endpoint_override"] = parsed.netloc + parsed.path.rstrip("/")
            kwargs["scheme"] = parsed.scheme
        if ep.region:
            kwargs["region"] = ep.region
        root = uri.split("://", 1)[1]
        return pafs.S3FileSystem(**kwargs), root.rstrip("/")
    fs, root = pafs.FileSystem.from_uri(uri)
    return fs, root
