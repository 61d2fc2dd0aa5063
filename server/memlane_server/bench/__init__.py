"""``memlane bench``: latency and throughput of a real sidecar, each as a ratio to a bare gRPC echo
measured in the same run on the same machine (absolute times drift on shared machines; ratios don't)."""
