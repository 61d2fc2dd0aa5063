"""One ``/metrics`` for a sidecar of several processes: the serving process's own metrics, then each
worker process's, every worker sample labelled ``worker="<n>"``, families of the same name merged (a
scrape target must not repeat a family).

The workers serve their metrics on loopback ports of their own (``worker_pool.py``); the serving process
reads them when it is scraped, so a sidecar is still one scrape target with every metric it had as one
process: session end, promotion, extraction and embedding figures come from the workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


class _Families:
    """What ``generate_latest`` reads: anything with ``collect()``."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge(own: bytes, workers: Iterable[tuple[str, bytes]]) -> bytes:
    """``own`` (text exposition) with each worker's, its samples labelled ``worker``; a worker whose
    text does not parse is left out (its label shows in no sample, and the scrape still succeeds)."""
    merged: dict[str, Metric] = {}
    for family in text_string_to_metric_families(own.decode()):
        merged[family.name] = family
    for name, text in workers:
        try:
            families = list(text_string_to_metric_families(text.decode()))
        except ValueError:
            continue
        for family in families:
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(family.name, family.documentation, family.type)
            target.samples += [
                Sample(s.name, {**s.labels, "worker": name}, s.value, s.timestamp, s.exemplar)
                for s in family.samples
            ]
    return bytes(generate_latest(_Families(merged.values())))
