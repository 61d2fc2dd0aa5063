"""The memory viewer: server-rendered HTML on the admin port (``/viewer/``), off unless ``viewer_enabled``.

What a developer asks when an agent misbehaves: which sessions a user has and their status, a session's
transcript, what the model saw on each turn (the blocks of the assembled context with provenance, token
counts and the memories injected), the user's long-term memories (delete one), and wiping the user.
It reads through the sidecar's own gRPC API, so it sees exactly what the API shows, under the same
access policy.
"""

from .access import ViewerAccess
from .app import PREFIX, Viewer, viewer_for

__all__ = ["PREFIX", "Viewer", "ViewerAccess", "viewer_for"]
