"""Start-up: third-party modules the sidecar never uses, kept from loading until something touches them.

``lancedb`` imports ``lance_namespace``, which imports ``lance_namespace_urllib3_client`` for its model
classes; that package's ``__init__`` also imports every REST API class of the namespace service, and each
builds pydantic validators for all its methods at import: about 5 s of a 2-core pod's start-up, for a
client memlane never calls (it opens local or object-store tables, not a REST namespace). The package is
registered without running its ``__init__`` (its submodules, such as the models, import as usual); the
first attribute read from the package itself runs it in full, so nothing can observe the difference.

``onnxruntime`` is deferred the same way: a worker process of ``memlane serve`` embeds through the serving
process's model (embedding/remote.py) and never touches it, which keeps its library (about 20 MB) out of
the worker's memory; the serving process runs it in full when it loads the model.
"""

from __future__ import annotations

import importlib.util
import sys
import types

_DEFERRED = ("lance_namespace_urllib3_client", "onnxruntime")


class _Deferred(types.ModuleType):
    def __getattr__(self, attr: str) -> object:
        if attr.startswith("__"):
            raise AttributeError(attr)
        spec = self.__spec__
        assert spec is not None and spec.loader is not None
        self.__class__ = types.ModuleType  # type: ignore[assignment]  # from now on an ordinary module
        spec.loader.exec_module(self)
        return getattr(self, attr)


def defer_unused_packages() -> None:
    """Call before importing the server (``app``); a no-op for packages already imported or absent."""
    for name in _DEFERRED:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _Deferred
        sys.modules[name] = module
