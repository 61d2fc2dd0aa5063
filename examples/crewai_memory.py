"""CrewAI memory on memlane (runs offline: every field is given, so CrewAI needs no LLM to analyze).

    memlane serve &                                      # the sidecar
    python examples/crewai_memory.py 127.0.0.1:50051

1. A crew's ``Memory`` stores what it learned; its storage is ``MemlaneStorage`` (memlane's long-term
   memory) and its embedder ``MemlaneEmbedder`` (the sidecar's model: one model embeds everything).
2. A fresh process recalls it by meaning, within a scope.
3. ``reset`` (CrewAI's ``reset_memories``) erases the crew's records, not the user's other memories.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

from crewai.memory import Memory

import memlane
from memlane.integrations.crewai import MemlaneEmbedder, MemlaneStorage
from memlane.v1 import memory_pb2 as mpb


def memory(target: str, user: str) -> Memory:
    return Memory(
        storage=MemlaneStorage(target, user_id=user, agent_id="crew"), embedder=MemlaneEmbedder(target)
    )


def learn(target: str, user: str) -> None:
    m = memory(target, user)
    m.remember(
        "The backend deploys on Tuesdays.", scope="/company/eng", categories=["process"], importance=0.7
    )
    m.remember("The database is PostgreSQL 16.", scope="/company/eng", categories=["tech"], importance=0.6)
    m.remember(
        "Dana prefers short status reports.", scope="/people/dana", categories=["preference"], importance=0.8
    )
    m.drain_writes()
    print("stored", m.info("/").record_count, "records; scopes:", m.list_scopes("/"))
    m.close()


def recall(target: str, user: str) -> None:
    m = memory(target, user)
    hits = m.recall("which database do we run?", scope="/company", limit=1, depth="shallow")
    print("recalled:", hits[0].record.content)
    assert hits[0].record.content == "The database is PostgreSQL 16."
    m.close()


def reset(target: str, user: str) -> None:
    with memlane.Client(target) as c:
        c.create_memory(
            caller=mpb.Caller(user_id=user), kind=mpb.MEMORY_KIND_FACT, content="Dana lives in Lisbon."
        )
        m = memory(target, user)
        m.reset()
        left = [x.content for x in c.list_memories(caller=mpb.Caller(user_id=user, agent_id="crew")).memories]
        print("after reset:", m.info("/").record_count, "crew records; the user's other memories:", left)
        assert left == ["Dana lives in Lisbon."]
        m.close()


def main() -> None:
    target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
    if len(sys.argv) > 3:  # a child process: one step
        {"learn": learn, "recall": recall, "reset": reset}[sys.argv[2]](target, sys.argv[3])
        return
    user = f"dana-{uuid.uuid4().hex[:6]}"
    for step in ("learn", "recall", "reset"):
        subprocess.run([sys.executable, __file__, target, step, user], check=True)
    print("ok")


if __name__ == "__main__":
    main()
