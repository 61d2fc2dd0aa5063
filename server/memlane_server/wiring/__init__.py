"""Builders of the sidecar's parts, by concern: the gRPC server and who may call it (``grpc_server``),
where data lives (``stores``: the Redis stores and long-term memory), the work on a session's turns
(``lifecycle``: providers, context assembly, session end) and the embedding model (``embedding``, apart so
that the model process imports nothing else). Each takes the settings sections it needs (whole) and the
parts already built, and returns what it built; ``app.py`` calls them in order, registers how each part is
closed, and starts the background jobs once the sidecar serves (the access policy's reload,
``grpc_server.start_policy``, is the one job started here).

Here, and only here, settings become the values of the component configs (``WorkerConfig``,
``MemoryTuning``, ``BudgetPolicy``, ...): those have no defaults for what a setting decides, so each
default is written once, on its setting in ``config.py``."""
