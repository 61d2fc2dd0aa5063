"""Putting the viewer on a sidecar's admin port."""

from __future__ import annotations

import logging

from ..access.policy import PolicyFile
from ..config import AccessSettings
from ..observability.http_endpoint import HttpEndpoint
from .access import ViewerAccess
from .app import PREFIX, Viewer

log = logging.getLogger(__name__)


def viewer_for(
    admin: HttpEndpoint, addresses: list[str], settings: AccessSettings, policy: PolicyFile
) -> Viewer | None:
    """Mounts the viewer under ``/viewer/``. It reads through the sidecar's own gRPC API: over its Unix
    socket if it has one, else over loopback TCP (a TLS-only TCP listener needs a Unix socket for it)."""
    local = [a for a in addresses if a.startswith("unix:")]
    if not local and not settings.tls_cert_file:
        local = [f"127.0.0.1:{a.rsplit(':', 1)[1]}" for a in addresses]
    if not local:
        log.warning("memory viewer disabled: with TLS it needs a unix: listen address to call the API")
        return None
    viewer = Viewer(ViewerAccess(policy, auth_required=settings.auth_required), local[0])
    admin.mount(PREFIX + "/", viewer)
    return viewer
