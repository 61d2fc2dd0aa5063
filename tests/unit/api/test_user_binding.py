"""Every RPC names its user in a way ``api.interceptor.UserBinding`` reads, so a call bound to an end
user is held to that user everywhere: a new RPC whose request names no user (or names it some other
way) fails here."""

from __future__ import annotations

from google.protobuf import message_factory

from memlane.v1 import admin_pb2, checkpoint_pb2, context_pb2, memory_pb2, procedure_pb2, session_service_pb2
from memlane_server.api.interceptor import AGENT_RPCS, OPERATOR_RPCS, UNBOUND_ONLY, user_scoped

MODULES = (admin_pb2, checkpoint_pb2, context_pb2, memory_pb2, procedure_pb2, session_service_pb2)


def test_every_rpc_request_names_its_user() -> None:
    methods = [
        method
        for module in MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]
    assert len(methods) >= 24  # every service was found (24 RPCs when this was written)
    requests = {m.full_name: message_factory.GetMessageClass(m.input_type)() for m in methods}
    unbound = [
        name
        for name, request in requests.items()
        if not user_scoped(request) and request.DESCRIPTOR.name not in UNBOUND_ONLY
    ]
    # Operator RPCs name no user: they are admin-only (an end user's token never reaches them).
    # Procedure RPCs name no user either: procedures belong to agents (see api/interceptor.py).
    assert sorted(unbound) == sorted(OPERATOR_RPCS | AGENT_RPCS)
