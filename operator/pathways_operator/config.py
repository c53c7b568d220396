"""The operator's settings, from its environment (see the contracts and the README)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from pathways_core.accelerators import AcceleratorKind
from pathways_core.resources.island import DEFAULT_IMAGE


@dataclass(frozen=True)
class Config:
    """``PATHWAYS_NAMESPACE``: where island pods run (and Events of islands go);
    ``PATHWAYS_IMAGE``: the image of program Jobs; ``PATHWAYS_METRICS_PORT``: 0 disables
    metrics; ``PATHWAYS_RESYNC_SECONDS``: how often everything is reconciled again even when
    nothing changed; ``PATHWAYS_QUOTAS``: JSON ``{"tenant": {"tpu-v5e": 64}}``."""

    namespace: str = "pathways-system"
    image: str = DEFAULT_IMAGE
    metrics_port: int = 9090
    resync_seconds: float = 60.0
    quotas: dict[tuple[str, AcceleratorKind], int] = field(default_factory=dict)

    @classmethod
    def from_environment(cls) -> Config:
        """Read the settings; a malformed one raises naming the variable."""
        environ = os.environ
        quotas: dict[tuple[str, AcceleratorKind], int] = {}
        raw = environ.get("PATHWAYS_QUOTAS", "").strip()
        if raw:
            try:
                for tenant, limits in json.loads(raw).items():
                    for kind, limit in limits.items():
                        quotas[(tenant, AcceleratorKind(kind))] = int(limit)
            except (ValueError, AttributeError, TypeError) as error:
                raise ValueError(
                    f'PATHWAYS_QUOTAS: expected JSON like {{"tenant": {{"tpu-v5e": 64}}}} ({error})'
                ) from None
        return cls(
            namespace=environ.get("PATHWAYS_NAMESPACE") or cls.namespace,
            image=environ.get("PATHWAYS_IMAGE") or cls.image,
            metrics_port=int(_number("PATHWAYS_METRICS_PORT", cls.metrics_port)),
            resync_seconds=_number("PATHWAYS_RESYNC_SECONDS", cls.resync_seconds),
            quotas=quotas,
        )


def _number(variable: str, default: float) -> float:
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{variable}: expected a number, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{variable}: expected a number >= 0, got {raw!r}")
    return value
