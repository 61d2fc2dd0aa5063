"""Structured logs: one JSON object per line (or plain text for a terminal)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

_STD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """For a person at a terminal: time, level, logger, message, then the structured fields as k=v."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [f"{k}={v!r}" for k, v in record.__dict__.items() if k not in _STD and not k.startswith("_")]
        return f"{line}  {' '.join(extras)}" if extras else line


def configure(level: str, fmt: str) -> None:
    """``fmt``: json, text, or auto (text when stderr is a terminal, JSON otherwise)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "auto":
        fmt = "text" if sys.stderr.isatty() else "json"
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
