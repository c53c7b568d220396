"""The accelerator catalogue: what each accelerator kind is and how Kubernetes exposes it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class AcceleratorKind(StrEnum):
    """Kinds of accelerator an island can be made of."""

    TPU_V4 = "tpu-v4"
    TPU_V5E = "tpu-v5e"
    TPU_V5P = "tpu-v5p"
    TPU_V6E = "tpu-v6e"
    GPU_A100 = "gpu-a100"
    GPU_H100 = "gpu-h100"
    GPU_H200 = "gpu-h200"
    GPU_B200 = "gpu-b200"
    GPU_L4 = "gpu-l4"
    CPU_FAKE = "cpu-fake"


class AcceleratorFamily(StrEnum):
    """How devices of a kind are provided to pods."""

    TPU = "tpu"
    GPU = "gpu"
    CPU = "cpu"


TPU_RESOURCE = "google.com/tpu"
GPU_RESOURCE = "nvidia.com/gpu"
GKE_TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
GKE_GPU_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"


@dataclass(frozen=True)
class AcceleratorInfo:
    """Facts about one accelerator kind.

    ``mesh_ranks`` lists the number of axes its interconnect topology may have (TPU v4 and v5p
    are 3-D tori, v5e and v6e 2-D); ``max_devices_per_host`` bounds the devices one executor
    pod may own; ``device_resource`` is the extended resource a pod requests for its devices and
    ``node_label`` the GKE node label (key, value) that selects nodes carrying them.
    """

    kind: AcceleratorKind
    family: AcceleratorFamily
    mesh_ranks: tuple[int, ...]
    max_devices_per_host: int
    device_resource: str | None
    node_label: tuple[str, str] | None


_CATALOGUE = [
    AcceleratorInfo(
        AcceleratorKind.TPU_V4,
        AcceleratorFamily.TPU,
        (3,),
        4,
        TPU_RESOURCE,
        (GKE_TPU_ACCELERATOR_LABEL, "tpu-v4-podslice"),
    ),
    AcceleratorInfo(
        AcceleratorKind.TPU_V5E,
        AcceleratorFamily.TPU,
        (2,),
        8,
        TPU_RESOURCE,
        (GKE_TPU_ACCELERATOR_LABEL, "tpu-v5-lite-podslice"),
    ),
    AcceleratorInfo(
        AcceleratorKind.TPU_V5P,
        AcceleratorFamily.TPU,
        (3,),
        4,
        TPU_RESOURCE,
        (GKE_TPU_ACCELERATOR_LABEL, "tpu-v5p-slice"),
    ),
    AcceleratorInfo(
        AcceleratorKind.TPU_V6E,
        AcceleratorFamily.TPU,
        (2,),
        8,
        TPU_RESOURCE,
        (GKE_TPU_ACCELERATOR_LABEL, "tpu-v6e-slice"),
    ),
    AcceleratorInfo(
        AcceleratorKind.GPU_A100,
        AcceleratorFamily.GPU,
        (1, 2),
        8,
        GPU_RESOURCE,
        (GKE_GPU_ACCELERATOR_LABEL, "nvidia-tesla-a100"),
    ),
    AcceleratorInfo(
        AcceleratorKind.GPU_H100,
        AcceleratorFamily.GPU,
        (1, 2),
        8,
        GPU_RESOURCE,
        (GKE_GPU_ACCELERATOR_LABEL, "nvidia-h100-80gb"),
    ),
    AcceleratorInfo(
        AcceleratorKind.GPU_H200,
        AcceleratorFamily.GPU,
        (1, 2),
        8,
        GPU_RESOURCE,
        (GKE_GPU_ACCELERATOR_LABEL, "nvidia-h200-141gb"),
    ),
    AcceleratorInfo(
        AcceleratorKind.GPU_B200,
        AcceleratorFamily.GPU,
        (1, 2),
        8,
        GPU_RESOURCE,
        (GKE_GPU_ACCELERATOR_LABEL, "nvidia-b200"),
    ),
    AcceleratorInfo(
        AcceleratorKind.GPU_L4,
        AcceleratorFamily.GPU,
        (1, 2),
        8,
        GPU_RESOURCE,
        (GKE_GPU_ACCELERATOR_LABEL, "nvidia-l4"),
    ),
    # Fake devices are XLA host-platform devices; one executor process can carry many.
    AcceleratorInfo(AcceleratorKind.CPU_FAKE, AcceleratorFamily.CPU, (1, 2, 3), 64, None, None),
]

ACCELERATORS: dict[AcceleratorKind, AcceleratorInfo] = {info.kind: info for info in _CATALOGUE}


def accelerator_info(kind: AcceleratorKind | str) -> AcceleratorInfo:
    """The catalogue entry of an accelerator kind."""
    return ACCELERATORS[AcceleratorKind(kind)]
