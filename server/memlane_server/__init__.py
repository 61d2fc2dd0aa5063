"""memlane sidecar: sessions in Redis, long-term memory in LanceDB, context assembly over gRPC."""
