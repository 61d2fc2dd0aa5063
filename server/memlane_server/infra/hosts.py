"""Whether a host name is this machine's loopback: the one rule for "local only" decisions on names
(plain-http object storage, the viewer's Host header)."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (``127.x.x.x``, ``::1``); a bare host, no port or brackets."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
