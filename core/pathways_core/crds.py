"""CustomResourceDefinitions generated from the resource models.

The pydantic models are the single source of truth. Their JSON Schema is turned into the
structural OpenAPI v3 schema Kubernetes requires: references inlined, ``null`` alternatives and
titles dropped, ``additionalProperties: false`` removed (the API server prunes unknown fields),
every object typed.
"""

from __future__ import annotations

from typing import Any

from pathways_core.resources import API_GROUP, API_VERSION, CATEGORY, KINDS, KindInfo

_DROPPED_KEYS = {"title", "examples"}


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    while "$ref" in node or "anyOf" in node:
        if "$ref" in node:
            target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
            # Keys beside the reference (description, default) win over the referenced ones.
            node = {**target, **node}
        else:
            alternatives = [alt for alt in node.pop("anyOf") if alt.get("type") != "null"]
            if len(alternatives) != 1:
                raise ValueError(f"unions are not structural: {alternatives}")
            node = {**alternatives[0], **node}
    if "description" in node:
        # Docstrings wrap lines; kubectl explain reflows text itself.
        node["description"] = " ".join(node["description"].split())
    if node.get("default", ...) is None:
        del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    if "exclusiveMinimum" in node or "exclusiveMaximum" in node:
        raise ValueError("use ge/le bounds: OpenAPI v3.0 has no numeric exclusive bounds")
    if "properties" in node or "additionalProperties" in node:
        node.setdefault("type", "object")
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            result[key] = {name: _structural(prop, defs) for name, prop in value.items()}
        elif key in ("items", "additionalProperties"):
            result[key] = _structural(value, defs)
        else:
            result[key] = value
    return result


def openapi_schema(info: KindInfo) -> dict[str, Any]:
    """The structural openAPIV3Schema of one kind."""
    schema = info.model.model_json_schema(by_alias=True, mode="validation")
    defs = schema.pop("$defs", {})
    spec_and_status = {
        name: _structural(schema["properties"][name], defs) for name in ("spec", "status")
    }
    name_rule = getattr(info.model, "NAME_RULE", None)
    return {
        "type": "object",
        "description": " ".join(schema.get("description", "").split()),
        **({"x-kubernetes-validations": [name_rule.cel()]} if name_rule else {}),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            **spec_and_status,
        },
    }


def custom_resource_definition(info: KindInfo) -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of one kind."""
    columns = [
        {
            "name": column.name,
            "type": column.type,
            "jsonPath": column.json_path,
            **({"description": column.description} if column.description else {}),
            **({"priority": column.priority} if column.priority else {}),
        }
        for column in info.printer_columns
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{info.plural}.{API_GROUP}",
            "labels": {"app.kubernetes.io/part-of": "pathways"},
        },
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": info.kind,
                "listKind": f"{info.kind}List",
                "plural": info.plural,
                "singular": info.singular,
                "shortNames": list(info.short_names),
                "categories": [CATEGORY],
            },
            "scope": "Namespaced" if info.namespaced else "Cluster",
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema(info)},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def all_crds() -> dict[str, dict[str, Any]]:
    """Every CRD keyed by its file name, such as ``islands.pathways.dev.yaml``."""
    return {
        f"{info.plural}.{API_GROUP}.yaml": custom_resource_definition(info)
        for info in KINDS.values()
    }
