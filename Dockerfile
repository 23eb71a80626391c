# syntax=docker/dockerfile:1.7
# Three images from one file:
#   docker build --target operator -t ghcr.io/stoker-dev/stoker:0.1.0 .
#   docker build --target runtime  -t ghcr.io/stoker-dev/stoker-vllm:0.26.0 .
#   docker build --target snapshot-agent -t ghcr.io/stoker-dev/stoker:0.1.0-snapshot-agent .
# The operator image also ships the programs stoker runs in its pods (`stoker programs DIR`, run by every
# seed and serving pod's init container): the runtime image needs nothing of stoker, like any vLLM image.
# Every base image and package is pinned: tests/unit/test_dockerfile.py rejects floating tags.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
ARG VLLM_IMAGE=vllm/vllm-openai:v0.26.0

# ------------------------------------------------------------------------------------------ wheel
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# --------------------------------------------------------------------------------------- operator
FROM ${PYTHON_IMAGE} AS operator
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/stoker/bin:$PATH
# pip compiles bytecode while installing, so a read-only root filesystem costs no import time.
RUN --mount=type=bind,from=wheel,source=/dist,target=/dist \
    python -m venv /opt/stoker \
    && /opt/stoker/bin/pip install --no-cache-dir /dist/stoker-*.whl \
    && stoker run --help >/dev/null \
    && stoker programs /tmp/programs-check >/dev/null && rm -r /tmp/programs-check
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["stoker"]
CMD ["run"]

# ------------------------------------------------------------------------------------------- criu
# CRIU as hack/criu builds it: bookworm's own 3.17.1 fails `criu check` on current kernels (vDSO), so 4.2.1
# from Debian's pinned source tarball, against the libraries of the bookworm the agent's image runs on.
FROM ${PYTHON_IMAGE} AS criu
ARG CRIU_VERSION=4.2.1
ARG CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl xz-utils \
        build-essential pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler \
        python3-protobuf libnl-3-dev libcap-dev libnet1-dev libgnutls28-dev libaio-dev libbsd-dev \
        libnftables-dev libdrm-dev uuid-dev \
    && curl -fsSL -o /tmp/criu.tar.xz "http://deb.debian.org/debian/pool/main/c/criu/criu_${CRIU_VERSION}.orig.tar.xz" \
    && echo "${CRIU_SHA256}  /tmp/criu.tar.xz" | sha256sum -c - \
    && tar -xJf /tmp/criu.tar.xz -C /tmp \
    && make -C "/tmp/criu-${CRIU_VERSION}" -j"$(nproc)" criu \
    && make -C "/tmp/criu-${CRIU_VERSION}" install-criu PREFIX=/opt/criu

# --------------------------------------------------------------------------------- snapshot-agent
# The operator's image with CRIU, for the snapshot agent's DaemonSet (chart value snapshot.image), which
# runs it privileged as root: `python3 -m stoker.snapshot.agent serve`.
FROM operator AS snapshot-agent
USER 0:0
COPY --from=criu /opt/criu/sbin/criu /usr/local/sbin/criu
# The runtime halves of the builder's -dev packages that criu links. nsenter and unshare, with which the
# agent runs CRIU in a target's PID namespace, are util-linux's, which Debian always installs.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libbsd0 libgnutls30 \
        libnet1 libnftables1 libnl-3-200 libprotobuf-c1 libuuid1 \
    && rm -rf /var/lib/apt/lists/* \
    && criu --version && nsenter --version && unshare --version
USER 65532:65532

# ---------------------------------------------------------------------------------------- runtime
FROM ${VLLM_IMAGE} AS runtime
ARG VLLM_VERSION=0.26.0
ARG RUNAI_STREAMER_VERSION=0.16.1
ARG INSTANTTENSOR_VERSION=0.2.2
ARG MODELEXPRESS_VERSION=0.7.0
ARG NIXL_VERSION=1.5.1
# The Run:ai streamer (local files, S3, GCS, Azure) for `--load-format runai_streamer`, InstantTensor
# (vllm[instanttensor]) for `--load-format instanttensor`, which stoker renders for weights on a volume, and
# ModelExpress with NIXL for `--load-format modelexpress` (coldStart.peerWeights). `nixl` itself is a meta
# package that needs both CUDA builds at one version, and PyPI's stop at 1.5.1; torch here is CUDA 13's.
RUN python3 -m pip install --no-cache-dir "runai-model-streamer[s3,gcs,azure]==${RUNAI_STREAMER_VERSION}" \
        "instanttensor==${INSTANTTENSOR_VERSION}" "modelexpress==${MODELEXPRESS_VERSION}" \
        "nixl-cu13==${NIXL_VERSION}" \
    && python3 -c "import instanttensor, modelexpress, runai_model_streamer, vllm; assert vllm.__version__ == '${VLLM_VERSION}', vllm.__version__"
# Most of a warm start is Python imports, twice (API server and engine process). The upstream image is
# installed by uv, which writes no bytecode, so every new pod would compile it again. Unchecked-hash .pyc
# files are never re-validated against their sources: the image's files do not change. compileall exits
# non-zero for the few files that are not valid Python 3 (tests, templates); they are never imported.
RUN for site in $(python3 -c 'import sysconfig; print(*{sysconfig.get_path(k) for k in ("purelib", "platlib")})'); do \
        python3 -m compileall -q -q -j 0 --invalidation-mode unchecked-hash "$site" || true; \
    done
# A non-root engine; group 1000 matches the fsGroup stoker sets on the engine pods' cache volumes.
RUN (getent group 1000 >/dev/null || groupadd --gid 1000 vllm) \
    && (getent passwd 1000 >/dev/null || useradd --uid 1000 --gid 1000 --no-create-home --shell /usr/sbin/nologin vllm) \
    && install -d -o 1000 -g 1000 /home/vllm
ENV HOME=/home/vllm
USER 1000:1000
EXPOSE 8000
ENTRYPOINT ["vllm", "serve"]
