"""One ``/metrics`` for a sidecar of several processes (observability/metrics.py ``merge``): each worker's
samples labelled with its name, families of one name merged into one, a worker whose text does not parse
left out. Pure text in, text out: no server."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from memlane_server.observability.metrics import merge

OWN = b"""# HELP memlane_jobs_total Jobs done.
# TYPE memlane_jobs_total counter
memlane_jobs_total{kind="end"} 3.0
"""
WORKER = b"""# HELP memlane_jobs_total Jobs done.
# TYPE memlane_jobs_total counter
memlane_jobs_total{kind="end"} 5.0
# HELP memlane_embed_seconds Embedding time.
# TYPE memlane_embed_seconds gauge
memlane_embed_seconds 0.25
"""


def _samples(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {
        f.name: [(dict(s.labels), s.value) for s in f.samples]
        for f in text_string_to_metric_families(text.decode())
    }


def test_worker_samples_are_labelled_and_families_merged() -> None:
    text = merge(OWN, [("0", WORKER)])
    assert text.count(b"# TYPE memlane_jobs_total counter") == 1  # one family, not two
    got = _samples(text)
    assert sorted(got["memlane_jobs"], key=str) == sorted(
        [({"kind": "end"}, 3.0), ({"kind": "end", "worker": "0"}, 5.0)], key=str
    )
    assert got["memlane_embed_seconds"] == [({"worker": "0"}, 0.25)]


def test_a_worker_whose_text_does_not_parse_is_left_out() -> None:
    text = merge(OWN, [("0", b"not { a metric"), ("1", WORKER)])
    workers = {labels.get("worker") for samples in _samples(text).values() for labels, _ in samples}
    assert workers == {None, "1"}


def test_without_workers_the_own_metrics_come_back_unchanged() -> None:
    assert _samples(merge(OWN, [])) == _samples(OWN)
