"""The gRPC server and who may call it: its interceptors and options, every servicer, binding the listen
addresses, and the access side the server checks each call against (the access policy file, reloaded in
the background; the authenticator over it; the TLS credentials of the listen addresses)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from memlane.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    checkpoint_pb2,
    checkpoint_pb2_grpc,
    context_pb2,
    context_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
    procedure_pb2,
    procedure_pb2_grpc,
    session_service_pb2,
    session_service_pb2_grpc,
)

from .. import telemetry
from ..access.authenticate import Authenticator
from ..access.policy import PolicyFile, UserTokenRules, load_jwks_file
from ..api.admin import AdminServicer
from ..api.admission import AdmissionInterceptor, parse_limits
from ..api.checkpoints import CheckpointServicer
from ..api.context import ContextServicer
from ..api.interceptor import BoundaryInterceptor, DurableStore, UserBinding
from ..api.memory_history import MemoryServicerWithHistory
from ..api.procedures import ProcedureServicer
from ..api.sessions import SessionServicer
from ..config import AccessSettings, ServerSettings
from ..context import ContextAssembler
from ..embedding.admission import EmbeddingAdmission
from ..errors import MemlaneError
from ..extraction import Extractor
from ..file_modes import share_socket
from ..infra.redis_pool import RedisClient
from ..infra.redis_pool import backend_fault as redis_fault
from ..ltm import MemoryService
from ..ltm.operations import MemorySnapshots
from ..ltm.redis_state import OnceMarks
from ..observability.domain import DomainMetrics
from ..observability.metrics import RpcMetrics
from ..pipelines.user_data import UserData, UserDirectory
from ..pipelines.user_import import UserImport
from ..sessions.edits import MessageEditor, MessageRemover
from ..sessions.leases import ErasureJournal
from .connections import ConnectionGate
from .lifecycle import SessionEnd
from .stores import Stores

log = logging.getLogger("memlane")


def new_server(
    s: ServerSettings,
    registry: CollectorRegistry,
    authenticator: Authenticator,
    stores: Stores,
    gate: ConnectionGate,
    *,
    durable: DurableStore | None = None,
    backend_fault: Callable[[BaseException], MemlaneError | None] = redis_fault,
) -> tuple[grpc.aio.Server, AdmissionInterceptor]:
    """The server with its interceptors (no servicer yet), and the admission gate ``stop`` drains.
    ``durable``: asked around every write; ``backend_fault``: what a store's error means to the caller
    (both ``BoundaryInterceptor``)."""
    metrics = RpcMetrics(registry)
    admission = AdmissionInterceptor(
        parse_limits(s.admission_limits), s.admission_max_queue, s.admission_max_wait_ms, metrics
    )
    server = grpc.aio.server(
        interceptors=[
            admission,  # outermost: a shed call costs nothing more
            BoundaryInterceptor(metrics, authenticator, UserBinding(stores.sessions), backend_fault, durable),
        ],
        options=[
            ("grpc.max_receive_message_length", s.max_receive_message_bytes),
            ("grpc.so_reuseport", 0),  # a second sidecar on the same port must fail, not share it
            ("grpc.keepalive_permit_without_calls", 1),
            *gate.options(),
        ],
    )
    return server, admission


@dataclass(frozen=True, slots=True)
class Served:
    """The parts the servicers serve."""

    redis: RedisClient
    stores: Stores
    end: SessionEnd
    context: ContextAssembler
    ltm: MemoryService | None
    extractor: Extractor | None
    metrics: DomainMetrics
    health: health.aio.HealthServicer
    user_data: UserData
    embedding_admission: EmbeddingAdmission


def user_data(
    redis: RedisClient, stores: Stores, context: ContextAssembler, ltm: MemoryService | None, end: SessionEnd
) -> UserData:
    """Per-user export and erasure over every store, with the erasure journal."""
    return UserData(
        stores.sessions,
        context.traces,
        ltm,
        end.archive,
        caches=[context.forget],
        history=stores.memory_history,
        procedures=stores.procedures,
        checkpoints=stores.checkpoints,
        journal=ErasureJournal(redis, stores.keys),
    )


def add_servicers(server: grpc.aio.Server, p: Served) -> list[str]:
    """Every servicer on ``server``, reflection included; returns the full names of the services it
    serves, the session and checkpoint services first (their health is reported by name)."""
    _add_session_services(server, p)
    _add_data_services(server, p)
    health_pb2_grpc.add_HealthServicer_to_server(p.health, server)
    services = [
        session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name,
        checkpoint_pb2.DESCRIPTOR.services_by_name["CheckpointService"].full_name,
        context_pb2.DESCRIPTOR.services_by_name["ContextService"].full_name,
        admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
        procedure_pb2.DESCRIPTOR.services_by_name["ProcedureService"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    ]
    if p.ltm is not None:
        services.append(memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name)
    reflection.enable_server_reflection(services, server)
    return services


def _add_session_services(server: grpc.aio.Server, p: Served) -> None:
    st, end = p.stores, p.end
    session_service_pb2_grpc.add_SessionServiceServicer_to_server(
        SessionServicer(
            st.sessions,
            lifecycle=end.lifecycle,
            end_on_request=end.on_request,
            resumer=end.resumer,
            remover=MessageRemover(p.redis, st.keys, st.sessions),
            editor=MessageEditor(p.redis, st.keys, st.sessions),
            learner=end.scheduler,
        ),
        server,
    )
    checkpoint_pb2_grpc.add_CheckpointServiceServicer_to_server(
        CheckpointServicer(st.checkpoints, st.sessions, end.lifecycle, end.resumer), server
    )
    context_pb2_grpc.add_ContextServiceServicer_to_server(
        ContextServicer(p.context, on_stats=lambda stats: telemetry.record_assembly(p.metrics, stats)),
        server,
    )


def _add_data_services(server: grpc.aio.Server, p: Served) -> None:
    st = p.stores
    admin = AdminServicer(
        p.user_data,
        p.end.queue,
        UserDirectory(st.sessions, p.ltm),
        UserImport(st.sessions, p.ltm, st.memory_history, st.procedures, limits=st.limits),
    )
    admin_pb2_grpc.add_AdminServiceServicer_to_server(admin, server)
    if p.ltm is not None and p.extractor is not None:
        memory_pb2_grpc.add_MemoryServiceServicer_to_server(
            MemoryServicerWithHistory(
                p.ltm,
                p.extractor,
                OnceMarks(p.redis, st.keys, "feedback"),
                p.embedding_admission,
                MemorySnapshots(p.ltm, st.memory_history.snapshots, st.memory_history),
                limits=st.limits,
            ),
            server,
        )
    procedure_pb2_grpc.add_ProcedureServiceServicer_to_server(
        ProcedureServicer(st.procedures, st.sessions, limits=st.limits), server
    )


def bind(server: grpc.aio.Server, address: str, tls: grpc.ServerCredentials | None = None) -> str:
    """Adds one listen address; returns it as bound (a port 0 resolved)."""
    if address.startswith("unix:"):
        path = Path(address[len("unix:") :].removeprefix("//"))
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket from a crashed run
        server.add_insecure_port(f"unix:{path}")
        share_socket(path)  # the one file of a memlane process others may use (file_modes.py)
        return f"unix:{path}"
    port = server.add_secure_port(address, tls) if tls else server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    host = address.rsplit(":", 1)[0]
    return f"{host}:{port}"


# --- who may call: the access policy, the authenticator and TLS (built before the server) -----------


def start_policy(a: AccessSettings) -> PolicyFile:
    """The access policy, its reload job started."""
    policy = PolicyFile(
        Path(a.access_policy_file) if a.access_policy_file else None, a.access_policy_reload_seconds
    )
    policy.start()
    return policy


def authenticator(a: AccessSettings, policy: PolicyFile) -> Authenticator:
    if not a.auth_required:
        log.warning(
            "auth is disabled: serving loopback and Unix-socket callers only, identified by the "
            "x-memlane-agent header; set auth_required and access_policy_file in production"
        )
    rules = UserTokenRules(
        required=a.user_token_required,
        file_keys=load_jwks_file(Path(a.user_token_jwks_file)) if a.user_token_jwks_file else (),
        issuer=a.user_token_issuer,
        audience=a.user_token_audience,
    )
    return Authenticator(policy, required=a.auth_required, user_tokens=rules)


def tls_credentials(a: AccessSettings) -> grpc.ServerCredentials | None:
    if not a.tls_cert_file:
        return None
    ca = Path(a.tls_client_ca_file).read_bytes() if a.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(Path(a.tls_key_file).read_bytes(), Path(a.tls_cert_file).read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )
