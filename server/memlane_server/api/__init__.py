"""gRPC servicers: proto <-> domain conversion, and the one place domain errors become status codes."""
