"""LangGraph checkpoint objects <-> memlane.v1 CheckpointService messages.

Channel values are stored once per (namespace, channel, version), like LangGraph's own savers: a put
sends only the channels in ``new_versions``; a read gets back the values at the checkpoint's versions.
Metadata travels as JSON so the sidecar can filter on it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from memlane.v1 import checkpoint_pb2 as kpb

EMPTY = "empty"  # the type of a channel that has a version but no value (LangGraph's convention)


def thread_of(config: RunnableConfig) -> tuple[str, str]:
    conf = config.get("configurable", {})
    thread_id = conf.get("thread_id")
    if not thread_id:
        raise ValueError("config['configurable']['thread_id'] is required (it is the memlane session id)")
    return str(thread_id), str(conf.get("checkpoint_ns", ""))


def _typed(serde: SerializerProtocol, value: Any) -> kpb.TypedValue:
    kind, data = serde.dumps_typed(value)
    return kpb.TypedValue(type=kind, data=data)


def _untyped(serde: SerializerProtocol, value: kpb.TypedValue) -> Any:
    return serde.loads_typed((value.type, value.data))


def metadata_json(metadata: dict[str, Any]) -> str:
    # Values JSON cannot hold are kept as their text: metadata is for filtering, not for state.
    return json.dumps(metadata, default=str, separators=(",", ":"))


def put_request(
    serde: SerializerProtocol,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> kpb.PutCheckpointRequest:
    thread_id, ns = thread_of(config)
    c: dict[str, Any] = dict(checkpoint)
    values: dict[str, Any] = c.pop("channel_values", None) or {}
    new_values = [
        kpb.ChannelValue(
            channel=ch,
            version=str(ver),
            value=_typed(serde, values[ch]) if ch in values else kpb.TypedValue(type=EMPTY),
        )
        for ch, ver in new_versions.items()
    ]
    return kpb.PutCheckpointRequest(
        session_id=thread_id,
        namespace=ns,
        checkpoint_id=checkpoint["id"],
        parent_checkpoint_id=get_checkpoint_id(config) or "",
        checkpoint=_typed(serde, c),
        metadata_json=metadata_json(dict(get_serializable_checkpoint_metadata(config, metadata))),
        channel_versions={ch: str(v) for ch, v in checkpoint["channel_versions"].items()},
        new_values=new_values,
    )


def stored_config(request: kpb.PutCheckpointRequest) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": request.session_id,
            "checkpoint_ns": request.namespace,
            "checkpoint_id": request.checkpoint_id,
        }
    }


def writes_request(
    serde: SerializerProtocol,
    config: RunnableConfig,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> kpb.PutCheckpointWritesRequest:
    thread_id, ns = thread_of(config)
    checkpoint_id = get_checkpoint_id(config)
    if not checkpoint_id:
        raise ValueError("put_writes needs config['configurable']['checkpoint_id']")
    return kpb.PutCheckpointWritesRequest(
        session_id=thread_id,
        namespace=ns,
        checkpoint_id=checkpoint_id,
        writes=[
            kpb.PendingWrite(
                task_id=task_id,
                index=WRITES_IDX_MAP.get(channel, i),
                channel=channel,
                value=_typed(serde, value),
                task_path=task_path,
            )
            for i, (channel, value) in enumerate(writes)
        ],
    )


def get_request(config: RunnableConfig) -> kpb.GetCheckpointRequest:
    thread_id, ns = thread_of(config)
    return kpb.GetCheckpointRequest(
        session_id=thread_id, namespace=ns, checkpoint_id=get_checkpoint_id(config) or ""
    )


def list_request(
    config: RunnableConfig | None,
    filter: dict[str, Any] | None,
    before: RunnableConfig | None,
    page_size: int,
) -> kpb.ListCheckpointsRequest:
    if config is None:
        raise ValueError("MemlaneSaver lists one thread at a time: pass a config with a thread_id")
    thread_id = thread_of(config)[0]
    ns = config.get("configurable", {}).get("checkpoint_ns")
    req = kpb.ListCheckpointsRequest(
        session_id=thread_id,
        before_checkpoint_id=(get_checkpoint_id(before) or "") if before else "",
        metadata_filter_json=metadata_json(filter) if filter else "",
        page_size=page_size,
    )
    if ns is not None:
        req.namespace = str(ns)
    return req


def to_tuple(serde: SerializerProtocol, r: kpb.CheckpointRecord) -> CheckpointTuple:
    checkpoint = cast(Checkpoint, _untyped(serde, r.checkpoint))
    checkpoint["channel_values"] = {
        v.channel: _untyped(serde, v.value) for v in r.channel_values if v.value.type != EMPTY
    }
    writes = sorted(r.pending_writes, key=lambda w: writes_sort_key(w.task_path, w.task_id, w.index))
    parent: RunnableConfig | None = None
    if r.parent_checkpoint_id:
        parent = {
            "configurable": {
                "thread_id": r.session_id,
                "checkpoint_ns": r.namespace,
                "checkpoint_id": r.parent_checkpoint_id,
            }
        }
    return CheckpointTuple(
        config={
            "configurable": {
                "thread_id": r.session_id,
                "checkpoint_ns": r.namespace,
                "checkpoint_id": r.checkpoint_id,
            }
        },
        checkpoint=checkpoint,
        metadata=cast(CheckpointMetadata, json.loads(r.metadata_json) if r.metadata_json else {}),
        parent_config=parent,
        pending_writes=[(w.task_id, w.channel, _untyped(serde, w.value)) for w in writes],
    )
