"""Validation of manifests (parsed YAML or JSON documents) against the resource models.

Every problem names the field path at fault and what was expected, so ``pathways validate``,
the operator and the REST API all report bad input the same way.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from pathways_core.resources import API_GROUP, GROUP_VERSION, KINDS, FieldError, Model
from pathways_core.resources.base import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    QUANTITY_PATTERN,
)

_PATTERN_NAMES = {
    DNS_LABEL_PATTERN: "a lowercase RFC 1123 label (a-z, 0-9 and '-', at most 63 characters)",
    DNS_SUBDOMAIN_PATTERN: "a lowercase RFC 1123 name (a-z, 0-9, '-' and '.')",
    LABEL_KEY_PATTERN: "a Kubernetes label key (an optional DNS prefix and '/', then at most "
    "63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit)",
    LABEL_VALUE_PATTERN: "a Kubernetes label value (empty, or at most 63 letters, digits, '-', "
    "'_' and '.', starting and ending with a letter or digit)",
    QUANTITY_PATTERN: "a Kubernetes quantity, not negative (such as 2, 1.5, 500m or 16Gi)",
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a document: the field path (empty for the whole document) and what
    was expected."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


@dataclass(frozen=True)
class Checked:
    """The outcome of validating one document."""

    kind: str | None
    name: str | None
    resource: Model | None
    problems: tuple[Problem, ...]
    skipped: bool = False  # a document of another API group, left alone


def format_path(location: tuple[str | int, ...]) -> str:
    """``("spec", "slices", 0, "shape")`` as ``spec.slices[0].shape``."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part == "[key]":  # pydantic's mark of a mapping's key, not its value
            path += " (the key)"
        else:
            path += f".{part}" if path else str(part)
    return path


def _got(value: Any) -> str:
    text = repr(value)
    return f" (got {text if len(text) <= 60 else text[:57] + '...'})"


def _message(error: dict[str, Any], allowed_fields: list[str]) -> str:
    kind = error["type"]
    context = error.get("ctx") or {}
    value = error.get("input")
    match kind:
        case "missing":
            return "required field is missing"
        case "extra_forbidden":
            field = str(error["loc"][-1])
            close = difflib.get_close_matches(field, allowed_fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            return f"unknown field{hint}"
        case "enum" | "literal_error":
            return f"expected one of {context.get('expected')}{_got(value)}"
        case "greater_than_equal":
            return f"expected a number >= {context['ge']}{_got(value)}"
        case "less_than_equal":
            return f"expected a number <= {context['le']}{_got(value)}"
        case "int_type" | "int_parsing" | "int_from_float":
            return f"expected an integer{_got(value)}"
        case "string_type":
            return f"expected a string{_got(value)}"
        case "bool_type" | "bool_parsing":
            return f"expected true or false{_got(value)}"
        case "list_type":
            return f"expected a list{_got(value)}"
        case "dict_type" | "model_type" | "model_attributes_type":
            return f"expected a mapping of fields{_got(value)}"
        case "too_short":
            return f"expected at least {context.get('min_length')} item(s){_got(value)}"
        case "too_long":
            return f"expected at most {context.get('max_length')} item(s)"
        case "string_too_short":
            return f"expected at least {context.get('min_length')} character(s){_got(value)}"
        case "string_too_long":
            return f"expected at most {context.get('max_length')} characters"
        case "string_pattern_mismatch":
            pattern = context.get("pattern", "")
            return (
                f"expected {_PATTERN_NAMES.get(pattern, f'text matching {pattern}')}{_got(value)}"
            )
        case "value_error":
            return str(context.get("error", error["msg"]))
    return f"{error['msg']}{_got(value)}"


def _fields_at(model: type[Model], location: tuple[str | int, ...]) -> list[str]:
    """Wire names of the fields of the model found at ``location``, for "did you mean" hints."""
    current: Any = model
    for part in location:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields:
            return []
        by_alias = {(info.alias or name): info for name, info in fields.items()}
        info = by_alias.get(part)
        if info is None:
            break
        current = _model_in(info.annotation)
    fields = getattr(current, "model_fields", {})
    return [info.alias or name for name, info in fields.items()]


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, Model):
        return annotation
    for argument in getattr(annotation, "__args__", ()):
        found = _model_in(argument)
        if found is not None:
            return found
    return None


def problems_of(error: ValidationError, model: type[Model]) -> list[Problem]:
    """Problems of a pydantic validation error, one per field at fault."""
    problems = []
    for detail in error.errors(include_url=False):
        location = tuple(detail["loc"])
        cause = (detail.get("ctx") or {}).get("error")
        path = format_path(location)
        if isinstance(cause, FieldError):
            path = f"{path}.{cause.field}" if path else cause.field
        allowed = _fields_at(model, location[:-1]) if detail["type"] == "extra_forbidden" else []
        problems.append(Problem(path.replace(".[", "["), _message(detail, allowed)))
    return problems


MANIFEST_METADATA = ("name", "generateName", "namespace", "labels", "annotations")
"""The metadata a manifest gives."""

SYSTEM_METADATA = (
    *("uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp"),
    *("deletionGracePeriodSeconds", "finalizers", "ownerReferences", "managedFields", "selfLink"),
)
"""The metadata the cluster sets: a ``get -o yaml`` dump has it, a manifest does not (the REST
API refuses it; ``pathways submit`` drops it, as it drops a dump's status)."""

SYSTEM_PREFIX = "pathways.dev"
"""Labels and annotations of this prefix are the system's: a manifest may not set them (a
program's label once freed a tenant's slice of its quota)."""

GENERATE_NAME_LIMIT = 248
"""A generated name is the prefix and five random characters, at most 253."""


TENANT_KINDS = ("PathwaysProgram", "VirtualSlice")
"""The kinds tenants submit: the system's labels and annotations are refused on them (an
Island, an administrator's, names its scheduler with ``pathways.dev/scheduler-endpoint``)."""


def metadata_problems(kind: Any, metadata: Any) -> list[Problem]:
    """What a manifest's ``metadata`` may not hold beyond what its model checks, as the REST
    API refuses it: fields no manifest has, a ``generateName`` that makes no valid name, and
    on the kinds tenants submit labels and annotations of the system's prefix. (What the
    system sets is no problem of a manifest here: ``pathways submit`` drops it, see
    :func:`without_system_fields`. Stored objects carry the system's labels: this is for
    manifests only.)"""
    if not isinstance(metadata, dict):
        return []
    problems = []
    for key in metadata:
        if key not in MANIFEST_METADATA and key not in SYSTEM_METADATA:
            close = difflib.get_close_matches(str(key), MANIFEST_METADATA, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(Problem(f"metadata.{key}", f"unknown field{hint}"))
    for field in ("labels", "annotations") if kind in TENANT_KINDS else ():
        keys = metadata.get(field)
        reserved = sorted(
            k
            for k in (keys if isinstance(keys, dict) else {})
            if str(k).split("/")[0] == SYSTEM_PREFIX
        )
        if reserved:
            problems.append(
                Problem(
                    f"metadata.{field}.{reserved[0]}",
                    f"{SYSTEM_PREFIX}/ keys are set by the system; omit them",
                )
            )
    prefix = metadata.get("generateName")
    if prefix is not None and (
        not isinstance(prefix, str)
        or len(prefix) > GENERATE_NAME_LIMIT
        or not re.fullmatch(r"[a-z0-9][-a-z0-9.]*", prefix)
    ):
        problems.append(
            Problem(
                "metadata.generateName",
                f"expected a lowercase RFC 1123 prefix (a-z, 0-9, '-' and '.', starting with a "
                f"letter or digit, at most {GENERATE_NAME_LIMIT} characters){_got(prefix)}",
            )
        )
    return problems


def without_system_fields(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` without what the system sets (its status, the metadata of
    ``SYSTEM_METADATA``, and on the kinds tenants submit the labels and annotations of the
    system's prefix): a ``get -o yaml`` dump as a manifest."""
    kept = {k: v for k, v in document.items() if k != "status"}
    metadata = kept.get("metadata")
    if isinstance(metadata, dict):
        metadata = {k: v for k, v in metadata.items() if k not in SYSTEM_METADATA}
        # The system's labels and annotations (a renewal's time, a cancellation) are refused
        # in a manifest of the kinds tenants submit: dropped, as the rest the system sets.
        for field in ("labels", "annotations") if document.get("kind") in TENANT_KINDS else ():
            if isinstance(metadata.get(field), dict):
                mine = {
                    k: v
                    for k, v in metadata[field].items()
                    if str(k).split("/")[0] != SYSTEM_PREFIX
                }
                if mine:
                    metadata[field] = mine
                else:
                    del metadata[field]
        kept["metadata"] = metadata
    return kept


MANIFEST_LIMIT_BYTES = 16 << 20
"""The most a manifest may weigh as JSON once its YAML aliases are expanded: sixteen times the
REST API's default body limit, five times what a Kubernetes API server accepts. Reading stops
there, so a few hundred bytes of nested aliases (a "billion laughs") cannot take a reader's
memory and time."""


class _SelfReference(Exception):
    pass


def expanded_size(document: Any, limit: int) -> int | None:
    """About how many bytes ``document`` takes as JSON, every YAML alias expanded (a shared
    node counts once per use), counting at most to ``limit + 1``; ``None`` if an alias refers
    to a node containing it (such a document has no JSON form)."""
    weights: dict[int, int] = {}
    visiting: set[int] = set()

    def weigh(node: Any) -> int:
        if isinstance(node, str | bytes):
            return len(node) + 2
        if isinstance(node, dict):
            children: Any = (item for pair in node.items() for item in pair)
        elif isinstance(node, list):
            children = node
        else:
            return 8  # numbers, booleans, null, dates: a few bytes each
        key = id(node)
        if key in weights:
            return weights[key]
        if key in visiting:
            raise _SelfReference
        visiting.add(key)
        total = 2
        for child in children:
            total += weigh(child) + 1
            if total > limit:
                break  # enough to refuse it: never expand further
        visiting.discard(key)
        weights[key] = min(total, limit + 1)
        return weights[key]

    try:
        return weigh(document)
    except _SelfReference:
        return None


def check_manifest(document: Any) -> Checked:
    """:func:`check_document` (strict), and :func:`metadata_problems`: what ``pathways
    validate`` says, as the REST API would of the manifest ``pathways submit`` sends."""
    checked = check_document(document, strict=True)
    if checked.skipped or not isinstance(document, dict):
        return checked
    more = metadata_problems(document.get("kind"), document.get("metadata"))
    if not more:
        return checked
    return Checked(checked.kind, checked.name, None, (*checked.problems, *more))


def check_document(document: Any, strict: bool = False) -> Checked:
    """Validate one parsed document against the model of its kind. ``strict``: as the API
    server checks a custom resource's types too (no ``"2"`` or ``true`` for an integer, no
    ``"yes"`` for a boolean, which the model would coerce), for manifests read from files."""
    if not isinstance(document, dict):
        return Checked(None, None, None, (Problem("", f"expected a mapping{_got(document)}"),))
    api_version = document.get("apiVersion")
    kind = document.get("kind")
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(api_version, str) or not api_version:
        return Checked(kind, name, None, (Problem("apiVersion", "required field is missing"),))
    group = api_version.split("/")[0]
    # A kind of ours in a group like ours (pathway.dev, Pathways.dev) is a typo, not another
    # project's resource to skip.
    misspelt = isinstance(kind, str) and kind in KINDS and "pathway" in group.lower()
    if group != API_GROUP and not misspelt:
        return Checked(kind, name, None, (), skipped=True)
    if api_version != GROUP_VERSION:
        return Checked(
            kind,
            name,
            None,
            (Problem("apiVersion", f"expected {GROUP_VERSION}{_got(api_version)}"),),
        )
    expected = ", ".join(KINDS)
    if kind is None:
        missing = f"required field is missing (expected one of {expected})"
        return Checked(None, name, None, (Problem("kind", missing),))
    info = KINDS.get(kind) if isinstance(kind, str) else None
    if info is None:
        return Checked(
            kind, name, None, (Problem("kind", f"expected one of {expected}{_got(kind)}"),)
        )
    problems: list[Problem] = []
    if not name and not (isinstance(metadata, dict) and metadata.get("generateName")):
        problems.append(Problem("metadata.name", "required field is missing"))
    try:
        resource = info.model.model_validate(document)
        if strict:  # JSON's types, as the CRD's schema has them
            info.model.model_validate_json(json.dumps(document, default=str), strict=True)
    except ValidationError as error:
        problems.extend(problems_of(error, info.model))
        resource = None
    return Checked(kind, name, resource if not problems else None, tuple(problems))
