"""Who is calling, and what they may see: identity, the policy file, and the visibility rule that every
read and write path consults. Imports nothing from the domain."""

from .identity import UNRESTRICTED, Caller, CallerRole, current_caller
from .policy import AccessPolicy, PolicyError, PolicyFile

__all__ = [
    "UNRESTRICTED",
    "AccessPolicy",
    "Caller",
    "CallerRole",
    "PolicyError",
    "PolicyFile",
    "current_caller",
]
