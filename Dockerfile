# syntax=docker/dockerfile:1
#
# One image for every Pathways component. Entrypoints (each a command line, given as the pod's
# `args` so that tini stays PID 1 and forwards SIGTERM):
#   operator     kopf run -m pathways_operator --all-namespaces --peering=pathways
#                  --liveness=http://0.0.0.0:8080/healthz      (metrics on :9090/metrics)
#   scheduler    python -m pathways_scheduler --port 8470 --session-port 8472 ...  (one per island)
#   executor     python -m pathways_executor --port 8473 ...   (one per island host)
#   REST API     python -m pathways_api --host 0.0.0.0 --port 8080
#   graph runner python -m pathways_client.run_graph --spec /etc/pathways/program.json
#   uninstall    python -m pathways_operator.uninstall --selector=app.kubernetes.io/instance=R
#                  (the chart's pre-delete hook: deletes the release's islands, waits for them)
#   driver/CLI   python -c ... / python /path/to/driver.py / pathways --help
#
# Variants (build arg JAX_VARIANT): cpu (default; also fake devices for kind), tpu (jax[tpu],
# which brings libtpu), cuda12 or cuda13 (jax[cuda12] / jax[cuda13], CUDA wheels). For example
#   docker build -t ghcr.io/pathways-k8s/pathways:0.1.0 .
#   docker build --build-arg JAX_VARIANT=tpu -t ghcr.io/pathways-k8s/pathways:0.1.0-tpu .
#
# Runs as the numeric non-root user 65532 with a read-only root filesystem: the only writable
# paths are /tmp and /var/cache/pathways (JAX's compilation cache), mounted as volumes.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a virtual environment holding the project and its dependencies --------------------
FROM ${PYTHON_IMAGE} AS build
ARG JAX_VARIANT=cpu
ARG JAX_VERSION=0.10.2
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/pathways
ENV PATH=/opt/pathways/bin:$PATH
# JAX first, in its own layer: the largest and slowest-changing part of the image.
RUN case "$JAX_VARIANT" in \
      cpu) pip install "jax==${JAX_VERSION}" ;; \
      tpu|cuda12|cuda13) pip install "jax[${JAX_VARIANT}]==${JAX_VERSION}" ;; \
      *) echo "JAX_VARIANT must be cpu, tpu, cuda12 or cuda13, not '${JAX_VARIANT}'" >&2; exit 1 ;; \
    esac
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core core
COPY operator operator
COPY scheduler scheduler
COPY executor executor
COPY api api
COPY client client
# A regular (not editable) install: the sources are not needed in the final image. Byte code is
# compiled here because the root filesystem is read-only at run time.
RUN pip install . \
    && python -m compileall -q /opt/pathways/lib \
    && pathways --help > /dev/null

# ---- runtime: the virtual environment on a slim Python, no compilers, no pip cache ------------
FROM ${PYTHON_IMAGE} AS runtime
ARG JAX_VARIANT=cpu
LABEL org.opencontainers.image.title="pathways" \
      org.opencontainers.image.description="Pathways on Kubernetes: operator, island scheduler, executor, REST API and SDK in one image" \
      org.opencontainers.image.source="https://github.com/pathways-k8s/pathways" \
      org.opencontainers.image.licenses="Apache-2.0" \
      dev.pathways.jax-variant="${JAX_VARIANT}"
# tini reaps zombies and forwards signals, so that every component stops cleanly on SIGTERM.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 65532 pathways \
    && useradd --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
         --shell /usr/sbin/nologin pathways \
    && mkdir -p /var/cache/pathways \
    && chown 65532:65532 /var/cache/pathways
COPY --from=build /opt/pathways /opt/pathways
ENV PATH=/opt/pathways/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/var/cache/pathways \
    JAX_COMPILATION_CACHE_DIR=/var/cache/pathways/jax
VOLUME ["/tmp", "/var/cache/pathways"]
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["pathways", "--help"]
