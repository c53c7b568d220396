"""How the pods the control plane creates are locked down: one user, a read-only root, scratch
volumes, no service account token, and the TLS Secret when TLS is on.

The image (see the Dockerfile) runs as the numeric user 65532 with ``tini`` as its ENTRYPOINT:
containers therefore set ``args`` (tini runs them and forwards SIGTERM), never ``command``,
unless a user's own image asks for its own command. The only writable paths are ``/tmp`` and
``/var/cache/pathways`` (``XDG_CACHE_HOME``; JAX's compilation cache below it), each an
``emptyDir``.

TLS (see docs/security.md and the contracts): when the operator knows the name of a Secret of
type ``kubernetes.io/tls`` (``PATHWAYS_TLS_SECRET``), it mounts it read-only at
:data:`TLS_MOUNT` in every scheduler, executor and program pod and points the
``PATHWAYS_TLS_CERT``, ``PATHWAYS_TLS_KEY`` and ``PATHWAYS_TLS_CA`` variables at its files.

Control tokens: an executor takes the command stream only from a scheduler whose first frame
carries the token in ``PATHWAYS_CONTROL_TOKEN``. With ``PATHWAYS_CONTROL_TOKENS`` on, the operator
gives each island a Secret of its own holding a random token (see
:func:`pathways_core.control.islands.control_token_secret`), and the island's scheduler and
executor containers read it with :func:`control_token_env`. With session credentials on, the
same Secret holds the scheduler's session key (:func:`session_key_env`; see
:mod:`pathways_core.wire.credentials`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pathways_core.wire.credentials import SESSION_KEY_ENV
from pathways_core.wire.streams import CONTROL_TOKEN_ENV
from pathways_core.wire.tls import CA_ENV, CERT_ENV, KEY_ENV

USER_ID = 65532
"""The image's non-root user and group (Dockerfile ``USER 65532:65532``)."""
TMP_DIR = "/tmp"
CACHE_DIR = "/var/cache/pathways"
COMPILATION_CACHE_DIR = f"{CACHE_DIR}/jax"
"""The image's ``JAX_COMPILATION_CACHE_DIR``: executors compile into it."""
TLS_MOUNT = "/var/run/pathways/tls"
"""Where the TLS Secret is mounted (not under ``/etc/pathways``: that is a graph program's
ConfigMap, and a mount inside a read-only ConfigMap volume cannot be created)."""
TLS_VOLUME = "pathways-tls"
# The variables the servers and clients read (pathways_core.wire.tls parses them).
TLS_CERT_ENV = CERT_ENV
TLS_KEY_ENV = KEY_ENV
TLS_CA_ENV = CA_ENV
TLS_SECRET_ENV = "PATHWAYS_TLS_SECRET"
"""The operator's own setting: the Secret to mount (unset: TLS off)."""
PULL_SECRETS_ENV = "PATHWAYS_IMAGE_PULL_SECRETS"
"""The operator's own setting: the Secrets its pods pull images with, comma-separated."""
# The keys of a kubernetes.io/tls Secret, and the CA key cert-manager adds.
TLS_FILES = {TLS_CERT_ENV: "tls.crt", TLS_KEY_ENV: "tls.key", TLS_CA_ENV: "ca.crt"}
CONTROL_TOKENS_ENV = "PATHWAYS_CONTROL_TOKENS"
"""The operator's own setting: ``true`` gives each island a control token from a Secret of its
own (unset or ``false``: no token, any caller's hello is taken; for dev clusters)."""
CONTROL_TOKEN_KEY = "token"
"""The key of the token in an island's control Secret."""
SESSION_KEY_KEY = "session-key"
"""The key of the island's session key in its control Secret (with session credentials on)."""


def pod_security_context() -> dict[str, Any]:
    """The pod-level settings: the image's user, never root, the runtime's seccomp profile;
    ``fsGroup`` makes mounted volumes (and the TLS key) readable by that user."""
    return {
        "runAsNonRoot": True,
        "runAsUser": USER_ID,
        "runAsGroup": USER_ID,
        "fsGroup": USER_ID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """The container-level settings: read-only root, no privilege escalation, no capability."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def scratch_volumes() -> list[dict[str, Any]]:
    """Writable ``emptyDir`` volumes for the paths the image writes to."""
    return [
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        # XLA executables of large programs are big: the cache gets more room than /tmp.
        {"name": "cache", "emptyDir": {"sizeLimit": "4Gi"}},
    ]


def scratch_mounts() -> list[dict[str, Any]]:
    """Where the scratch volumes are mounted."""
    return [
        {"name": "tmp", "mountPath": TMP_DIR},
        {"name": "cache", "mountPath": CACHE_DIR},
    ]


def tls_env() -> list[dict[str, Any]]:
    """The variables naming the mounted certificate, key and CA files."""
    return [{"name": env, "value": f"{TLS_MOUNT}/{file}"} for env, file in TLS_FILES.items()]


def control_token_env(secret_name: str) -> dict[str, Any]:
    """The ``PATHWAYS_CONTROL_TOKEN`` variable of a scheduler or executor container, read from
    the island's Secret (never a literal: pod specs are readable by many more than Secrets)."""
    return {
        "name": CONTROL_TOKEN_ENV,
        "valueFrom": {"secretKeyRef": {"name": secret_name, "key": CONTROL_TOKEN_KEY}},
    }


def session_key_env(secret_name: str) -> dict[str, Any]:
    """The scheduler's ``PATHWAYS_SESSION_KEY``, from the island's control Secret; optional,
    since a Secret made before session credentials were turned on holds none (that island's
    scheduler then takes sessions without credentials until the Island is made again)."""
    return {
        "name": SESSION_KEY_ENV,
        "valueFrom": {
            "secretKeyRef": {"name": secret_name, "key": SESSION_KEY_KEY, "optional": True}
        },
    }


def harden(
    pod_spec: dict[str, Any], tls_secret: str | None = None, pull_secrets: Sequence[str] = ()
) -> dict[str, Any]:
    """``pod_spec`` locked down in place (and returned): security contexts on the pod and every
    container, scratch volumes, no service account token (these pods never call the Kubernetes
    API), the TLS Secret mounted read-only with its variables when ``tls_secret`` is set, and
    ``pull_secrets`` (Secrets of the pod's namespace) to pull its images with."""
    pod_spec["automountServiceAccountToken"] = False
    if pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in pull_secrets]
    pod_spec["securityContext"] = pod_security_context()
    volumes = list(pod_spec.get("volumes") or []) + scratch_volumes()
    mounts = scratch_mounts()
    env: list[dict[str, Any]] = []
    if tls_secret:
        # 0440 with fsGroup: the key is readable by the pod's user only.
        volumes.append(
            {"name": TLS_VOLUME, "secret": {"secretName": tls_secret, "defaultMode": 0o440}}
        )
        mounts = [*mounts, {"name": TLS_VOLUME, "mountPath": TLS_MOUNT, "readOnly": True}]
        env = tls_env()
    pod_spec["volumes"] = volumes
    for container in pod_spec["containers"]:
        container["securityContext"] = container_security_context()
        container["volumeMounts"] = list(container.get("volumeMounts") or []) + mounts
        if env:
            container["env"] = list(container.get("env") or []) + env
    return pod_spec
