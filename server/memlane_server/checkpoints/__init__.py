"""Framework state per session (LangGraph's checkpointer contract), a room of its own: the store and its
records (``store``: Redis, export, the archive at retirement and resumption) and its Lua scripts
(``scripts``). It reads the session document's status through the same slot, and nothing of sessions but
their model, scripts' status digits and error words."""
