"""Sessions in Redis: the documents and their messages (``store``, composing ``messages`` and
``transitions``), the domain model and its rules (``model``), their stored form and bounds (``codec``,
``limits``), the Lua scripts of a session's slot (``scripts``), lifecycle events and their outbox
(``events``), noticing idle and ended sessions (``lifecycle``), the session-end queue and progress
(``ending``), leases and erasure fences (``leases``), edits and removals of stored messages (``edits``)
and turn traces (``traces``). Other stores live in rooms of their own (``checkpoints/``,
``procedures/``, ``ltm/redis_state.py``); the key layout every store shares is ``keyspace.py``."""
