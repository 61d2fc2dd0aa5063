"""Process-level metrics on a sidecar's own registry: CPU, memory, file descriptors, garbage collection,
Python version and ``memlane_build_info``.

``_created`` series are turned off process-wide: they double the series count of every counter and
histogram, and Prometheus derives resets from the samples themselves.
"""

from __future__ import annotations

import platform

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from memlane import __version__

from ..build_info import commit


def new_registry(*, settings_summary: dict[str, str] | None = None) -> CollectorRegistry:
    """A registry with the process collectors and the build info registered on it (never the global one:
    tests run several sidecars in one process)."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    info = Info("memlane_build", "The memlane release this process runs.", registry=registry)
    info.info(
        {
            "version": __version__,
            "commit": commit(),  # "" when unknown (a wheel built without the Dockerfile's VCS_REF)
            "python": platform.python_version(),
            **(settings_summary or {}),
        }
    )
    return registry
