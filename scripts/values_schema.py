"""Generate the Helm chart's ``values.schema.json``.

The chart's own settings are written out below; the schema of an island's ``spec`` is derived
from the Island CRD (itself generated from the pathways_core model), made strict (unknown fields
rejected) so that a typo in values fails ``helm install`` with the path of the value at fault
instead of being pruned silently by the API server.

It also writes ``files/mesh-ranks.json`` (the axes each accelerator kind's topology may have),
which the island template reads to refuse a topology of the wrong rank.

Usage: ``python scripts/values_schema.py`` writes the files; ``--check`` exits 1 when a committed
file differs from what would be written (a test runs it).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from pathways_core.accelerators import AcceleratorKind, accelerator_info
from pathways_core.crds import all_crds
from pathways_core.resources.base import (
    DNS_1035_LABEL_PATTERN,
    DNS_LABEL_PATTERN,
    MAX_PRIORITY,
)
from pathways_core.resources.island import ISLAND_NAME
from pathways_operator.config import MIN_PEERING_LIFETIME_SECONDS

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = ROOT / "charts" / "pathways" / "values.schema.json"
MESH_RANKS = Path("files") / "mesh-ranks.json"  # beside the schema, read by templates/islands.yaml

DURATION = r"^([0-9]+(ms|s|m|h|d|w|y))+$"  # Prometheus' durations (30s, 1m30s)
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# An OCI image reference (the distribution project's grammar, without IPv6 hosts): an optional
# registry host[:port], path components, then ":tag" and/or "@digest". The chart joins
# image.repository and image.tag with ":", so each is checked on its own: a space or " #" in
# either rendered an invalid reference or cut it short as a YAML comment.
_HOST = (
    r"[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?)*(:[0-9]+)?/"
)
_PATH = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}"
IMAGE_REPOSITORY = f"^({_HOST})?{_PATH}$"
IMAGE_TAG = f"^({_TAG})?$"  # "": the chart's appVersion
IMAGE_REFERENCE = f"^({_HOST})?{_PATH}(:{_TAG})?(@{_DIGEST})?$"
QUANTITY = {
    "type": ["string", "integer", "number"],
    "description": "A Kubernetes quantity such as 2, 500m or 16Gi.",
}


def strict(node: Any) -> Any:
    """A JSON Schema equivalent of a structural CRD schema that rejects unknown fields.

    Kubernetes extensions are dropped (JSON Schema validators ignore them anyway, and
    int-or-string has no JSON Schema meaning), objects with fixed properties forbid others.
    """
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("x-kubernetes-int-or-string"):
        return dict(QUANTITY)
    result = {key: strict(value) for key, value in node.items() if not key.startswith("x-")}
    if "properties" in result and "additionalProperties" not in result:
        result["additionalProperties"] = False
    return result


def island_spec_schema() -> dict[str, Any]:
    """The strict schema of Island.spec, from the generated CRD (its ``required`` list is the
    one the island template checks, islandDefaults merged)."""
    crd = all_crds()["islands.pathways.dev.yaml"]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return strict(copy.deepcopy(spec))


def obj(properties: dict[str, Any], description: str = "", **extra: Any) -> dict[str, Any]:
    """A closed object schema: only the listed properties are allowed."""
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if description:
        schema["description"] = description
    schema["properties"] = properties
    schema.update(extra)
    return schema


def string(description: str = "", **extra: Any) -> dict[str, Any]:
    return {"type": "string", **({"description": description} if description else {}), **extra}


def integer(description: str = "", **extra: Any) -> dict[str, Any]:
    return {"type": "integer", **({"description": description} if description else {}), **extra}


def rate_limit(description: str) -> dict[str, Any]:
    """A rate limit: "RATE" or "RATE,BURST" (requests per second, largest burst), or a number
    (``--set`` makes one); 0 disables it."""
    return {
        "type": ["string", "number"],
        "description": f"{description} RATE or RATE,BURST per second; 0 disables.",
        "pattern": r"^[0-9]+(\.[0-9]+)?(,[1-9][0-9]*)?$",
        "minimum": 0,
    }


OPEN_OBJECT = {"type": "object"}
# A container's environment variable, as a pod takes it (a bare string rendered "- foo").
# Values are strings: helm reads a number in a values file as a float, and a quoted 1000000
# would reach the pod as "1e+06".
ENV = {
    "type": "array",
    "description": 'More environment variables: [{name: X, value: "1"}] or valueFrom.',
    "items": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "value": {"type": "string"},
            "valueFrom": {"type": "object"},
        },
        "required": ["name"],
    },
}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
CHART_LABELS = [
    "helm.sh/chart",
    *(
        f"app.kubernetes.io/{key}"
        for key in ("name", "instance", "component", "version", "managed-by", "part-of")
    ),
]
OWN_LABELS = {
    **STRING_MAP,
    "propertyNames": {"not": {"enum": CHART_LABELS}},
    "description": "Labels of one's own: the chart's own keys (its selectors, the uninstall "
    "hook's release label) are the chart's to set.",
}
LIST = {"type": "array"}
PORT = integer("A TCP port.", minimum=1, maximum=65535)


def service_account() -> dict[str, Any]:
    return obj(
        {
            "create": {"type": "boolean", "description": "Create the ServiceAccount."},
            "name": string(
                "Its name (a DNS subdomain); defaults to <fullname>-<component>.",
                pattern=f"^$|{DNS_SUBDOMAIN}",
            ),
            "annotations": STRING_MAP,
        }
    )


def disruption_budget() -> dict[str, Any]:
    return obj(
        {
            "enabled": {"type": "boolean"},
            "maxUnavailable": {
                # A count, or a percentage: what a PodDisruptionBudget takes ("abc" rendered,
                # and the API server refused it).
                "anyOf": [
                    {"type": "integer", "minimum": 0},
                    {"type": "string", "pattern": r"^[0-9]+%$"},
                ],
                "description": "Pods that may be down at once during voluntary disruptions.",
            },
        }
    )


def pod_settings() -> dict[str, Any]:
    """Settings shared by the operator and API Deployments."""
    return {
        "replicas": integer("Number of pods.", minimum=0, maximum=100),
        "extraArgs": {"type": "array", "items": {"type": "string"}},
        "env": ENV,
        "resources": OPEN_OBJECT,
        "nodeSelector": STRING_MAP,
        "tolerations": LIST,
        "affinity": OPEN_OBJECT,
        "podAnnotations": STRING_MAP,
        "podLabels": OWN_LABELS,
        "priorityClassName": string(),
        "serviceAccount": service_account(),
        "podDisruptionBudget": disruption_budget(),
    }


def tenants_schema() -> dict[str, Any]:
    """The operator's tenant policy (PATHWAYS_TENANTS, read by pathways_core.control.tenants)."""
    limits = {
        "maxPriority": integer(
            "The highest priority of the tenant's slices and programs.",
            minimum=-MAX_PRIORITY,
            maximum=MAX_PRIORITY,
        ),
        "devices": {
            "type": "object",
            "description": "The most devices the tenant holds, by accelerator kind.",
            "propertyNames": {"enum": [kind.value for kind in AcceleratorKind]},
            "additionalProperties": integer(minimum=0),
        },
    }
    namespaces = {
        "type": "array",
        "description": "Namespaces whose objects may name the tenant (default: its own name).",
        "items": string(pattern=DNS_LABEL_PATTERN),
    }
    return {
        "type": "object",
        "description": 'Tenants\' namespaces, highest priority and devices; "*": the others.',
        "propertyNames": {"minLength": 1, "maxLength": 63},
        "properties": {"*": obj(limits)},
        "additionalProperties": obj({"namespaces": namespaces, **limits}),
    }


def values_schema() -> dict[str, Any]:
    """The whole values schema."""
    # Required fields may come from islandDefaults: the island template checks them merged.
    spec = {key: value for key, value in island_spec_schema().items() if key != "required"}
    # A one-axis topology written as a number (topology: 8, or --set ...topology=8) is what
    # users write: the island template renders it as the string the CRD takes. Numbers stop
    # at the pattern's 4 digits (a values file's numbers are floats: larger ones print as 1e+06).
    topology = spec["properties"]["topology"]
    spec["properties"]["topology"] = {
        **topology,
        "type": ["string", "integer"],
        "minimum": 1,
        "maximum": 9999,
    }
    # The chart's image reference is checked above; an island's own is checked alike.
    spec["properties"]["image"] = {**spec["properties"]["image"], "pattern": IMAGE_REFERENCE}
    defaults = {**spec, "description": "Deep-merged under the spec of every island."}
    island = obj(
        {
            "name": string(
                f"Name of the Island resource: {ISLAND_NAME.expected}, at most "
                f"{ISLAND_NAME.max_length} characters ({ISLAND_NAME.reason}).",
                pattern=ISLAND_NAME.pattern,
                minLength=1,
                maxLength=ISLAND_NAME.max_length,
            ),
            "labels": OWN_LABELS,
            "annotations": STRING_MAP,
            "spec": {"$ref": "#/definitions/islandSpec"},
        },
        "An island of accelerators, created as an Island resource.",
        required=["name", "spec"],
    )
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Values of the pathways chart",
        "description": "Generated by scripts/values_schema.py from the Island model. Do not edit.",
        **obj(
            {
                # Helm passes a `global` map to every chart (shared with subcharts).
                "global": OPEN_OBJECT,
                # Object names and the app.kubernetes.io/name label are made from these
                # (Bad_Name rendered "pw-Bad_Name-schedulers"); the full name also starts
                # Service names, which begin with a letter.
                "nameOverride": string(
                    "Replaces the chart's name in object names: a DNS label.",
                    pattern=f"^$|{DNS_LABEL_PATTERN}",
                ),
                "fullnameOverride": string(
                    "Replaces <release>-<name>: a DNS label starting with a letter.",
                    pattern=f"^$|{DNS_1035_LABEL_PATTERN}",
                ),
                "image": obj(
                    {
                        "repository": string(
                            "Image repository: [host[:port]/]path, without a tag.",
                            pattern=IMAGE_REPOSITORY,
                            maxLength=255,
                        ),
                        "tag": string(
                            "Image tag; defaults to the chart's appVersion.", pattern=IMAGE_TAG
                        ),
                        "pullPolicy": string(enum=["Always", "IfNotPresent", "Never"]),
                    },
                    "The one image of every component.",
                    required=["repository"],
                ),
                "imagePullSecrets": {
                    "type": "array",
                    "items": obj(
                        {
                            "name": string(
                                "A Secret of registry credentials.", pattern=DNS_SUBDOMAIN
                            )
                        },
                        required=["name"],
                    ),
                    "description": "As a pod's: [{name: regcred}], not [regcred]. Every pod "
                    "the chart and the operator make pulls with them (island pods in the "
                    "release's namespace, program pods in their tenant's: each needs a copy).",
                },
                "podSecurityContext": OPEN_OBJECT,
                "containerSecurityContext": OPEN_OBJECT,
                "operator": obj(
                    {
                        **pod_settings(),
                        "peering": obj(
                            {
                                "name": string("ClusterKopfPeering name.", pattern=DNS_SUBDOMAIN),
                                "lifetimeSeconds": integer(
                                    "How long a silent replica is held active before a "
                                    "standby takes over.",
                                    minimum=MIN_PEERING_LIFETIME_SECONDS,
                                ),
                            },
                            required=["name"],
                        ),
                        "healthPort": PORT,
                        "metricsPort": PORT,
                        "childImage": string(
                            "Image of the pods the operator creates; defaults to the chart's.",
                            pattern=f"^$|{IMAGE_REFERENCE}",
                        ),
                        "controlTokens": {
                            "type": "boolean",
                            "description": "A control token per island, in a Secret of its own.",
                        },
                        "sessionCredentials": {
                            "type": "boolean",
                            "description": "Islands take sessions with signed credentials only.",
                        },
                        "tenants": tenants_schema(),
                        "admissionPolicy": {
                            "enum": ["auto", True, False],
                            "description": "The tenant policy at admission as well.",
                        },
                    },
                    "The operator (global resource manager).",
                ),
                "api": obj(
                    {
                        **pod_settings(),
                        "enabled": {"type": "boolean"},
                        "port": PORT,
                        "quotas": obj(
                            {
                                "devices": integer(
                                    "Devices a tenant's slices may hold.", minimum=0
                                ),
                                "programs": integer(
                                    "A tenant's programs not yet finished.", minimum=0
                                ),
                                "priority": integer(
                                    "Highest priority a tenant may ask for (who preempts whom).",
                                    minimum=-MAX_PRIORITY,
                                    maximum=MAX_PRIORITY,
                                ),
                            },
                            "Every tenant's quotas in the REST API.",
                        ),
                        "limits": obj(
                            {
                                "maxBodyBytes": integer(
                                    "Largest request body (PATHWAYS_API_MAX_BODY).", minimum=1
                                ),
                                "rateLimit": rate_limit(
                                    "Each tenant's mutating requests (PATHWAYS_API_RATE_LIMIT)."
                                ),
                                "readRateLimit": rate_limit(
                                    "Each tenant's reads (PATHWAYS_API_READ_RATE_LIMIT)."
                                ),
                            },
                            "Limits of each API replica.",
                        ),
                        "service": obj(
                            {
                                "type": string(enum=["ClusterIP", "NodePort", "LoadBalancer"]),
                                "port": PORT,
                                "annotations": STRING_MAP,
                            }
                        ),
                        "ingress": obj(
                            {
                                "enabled": {"type": "boolean"},
                                "className": string(),
                                "annotations": STRING_MAP,
                                "hosts": {
                                    "type": "array",
                                    "items": obj(
                                        {
                                            "host": string(),
                                            "paths": {
                                                "type": "array",
                                                "minItems": 1,
                                                "items": obj(
                                                    {
                                                        "path": string(pattern="^/"),
                                                        "pathType": string(
                                                            enum=[
                                                                "Exact",
                                                                "Prefix",
                                                                "ImplementationSpecific",
                                                            ]
                                                        ),
                                                    },
                                                    required=["path"],
                                                ),
                                            },
                                        },
                                        required=["host", "paths"],
                                    ),
                                },
                                "tls": LIST,
                            }
                        ),
                    },
                    "The multi-tenant REST API.",
                ),
                "proxy": obj(
                    {
                        **{
                            key: value
                            for key, value in pod_settings().items()
                            if key != "serviceAccount"  # the proxy's pods mount no token
                        },
                        "enabled": {"type": "boolean"},
                        "port": PORT,
                        "devices": integer("Devices of each session's slice.", minimum=1),
                        "island": string(
                            "Bind the sessions' slices on this island.",
                            pattern=f"^$|{DNS_SUBDOMAIN}",
                        ),
                        "tenant": string(
                            "Tenant of the token (names sessions).", pattern=f"^$|{DNS_SUBDOMAIN}"
                        ),
                        "weight": integer("The sessions' share of device time.", minimum=1),
                        "priority": integer("The sessions' priority."),
                        "apiUrl": string(
                            "REST API URL; empty: this release's API Service.",
                            pattern=r"^$|^https?://",
                        ),
                        "tokenSecret": obj(
                            {
                                "name": string(
                                    "Secret holding the tenant's API token.",
                                    pattern=f"^$|{DNS_SUBDOMAIN}",
                                ),
                                "key": string("Its key.", minLength=1),
                            },
                            "The tenant's API token, from a Secret only.",
                        ),
                        "serveTls": {
                            "type": "boolean",
                            "description": "With tls.enabled, serve clients TLS.",
                        },
                        "allowedClients": LIST,
                        "extraEgress": LIST,
                        "service": obj(
                            {
                                "type": string(enum=["ClusterIP", "NodePort", "LoadBalancer"]),
                                "port": PORT,
                                "annotations": STRING_MAP,
                            }
                        ),
                    },
                    "The IFRT proxy: stock JAX programs on virtual slices.",
                ),
                "serviceMonitor": obj(
                    {
                        "enabled": {"type": "boolean"},
                        "interval": string("A Prometheus duration, such as 30s.", pattern=DURATION),
                        "scrapeTimeout": string(
                            "A Prometheus duration, at most the interval.", pattern=DURATION
                        ),
                        "labels": STRING_MAP,
                    }
                ),
                "networkPolicy": obj(
                    {
                        "enabled": {"type": "boolean"},
                        "programNamespaceSelector": OPEN_OBJECT,
                        "crossIslandTransfers": {"type": "boolean"},
                        "extraEgress": LIST,
                    },
                    "NetworkPolicies of the islands, the API and the operator.",
                ),
                "tls": obj(
                    {
                        "enabled": {"type": "boolean"},
                        "secretName": string(
                            "A kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt).",
                            pattern=f"^$|{DNS_SUBDOMAIN}",
                        ),
                        "certManager": obj(
                            {
                                "issuerRef": obj(
                                    {"name": string(), "kind": string(), "group": string()}
                                ),
                                "duration": string(),
                                "renewBefore": string(),
                                "clientNamespaces": {
                                    "type": "array",
                                    "description": "Namespaces whose program pods get a "
                                    "client-only certificate (a ClusterIssuer signs it).",
                                    "items": {"type": "string", "pattern": DNS_LABEL_PATTERN},
                                    "uniqueItems": True,
                                },
                            }
                        ),
                        "extraDnsNames": {"type": "array", "items": {"type": "string"}},
                    },
                    "TLS certificates of the API, schedulers and executors.",
                ),
                "uninstallHook": obj(
                    {
                        "enabled": {"type": "boolean"},
                        "timeoutSeconds": integer(
                            "Seconds the hook waits for the islands to be gone (keep it under "
                            "helm's --timeout).",
                            minimum=1,
                        ),
                        "resources": OPEN_OBJECT,
                    },
                    "A pre-delete hook that deletes the release's islands while the operator "
                    "runs, and waits for them.",
                ),
                "islandDefaults": {"$ref": "#/definitions/islandDefaults"},
                "islands": {
                    "type": "array",
                    "description": "Islands created as Island resources.",
                    "items": island,
                },
            }
        ),
        "definitions": {"islandSpec": spec, "islandDefaults": defaults},
    }


def render() -> str:
    """The file's text."""
    return json.dumps(values_schema(), indent=2) + "\n"


def render_mesh_ranks() -> str:
    """``files/mesh-ranks.json``: the axes each accelerator kind's topology may have (as
    strings: what the island template compares), from the catalogue the Island model checks."""
    ranks = {
        kind.value: [str(rank) for rank in accelerator_info(kind).mesh_ranks]
        for kind in AcceleratorKind
    }
    return json.dumps(ranks, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the schema (and the mesh ranks the island template reads), or with ``--check``
    report whether the committed files are current."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    parser.add_argument("--out", type=Path, default=SCHEMA_PATH)
    args = parser.parse_args(argv)
    outputs = {args.out: render(), args.out.parent / MESH_RANKS: render_mesh_ranks()}
    if args.check:
        stale = [
            path for path, text in outputs.items() if not path.exists() or path.read_text() != text
        ]
        for path in stale:
            print(f"{path}: stale; run python scripts/values_schema.py", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
