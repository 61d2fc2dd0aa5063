"""Evaluation harnesses that drive a real sidecar through the public client.

``locomo.run(path, json_out=...)``: evidence recall on a LoCoMo-format file against BM25 and
vector-only baselines (``memlane eval locomo --data PATH``). The product never imports this package.
"""

from .locomo import Report, run

__all__ = ["Report", "run"]
