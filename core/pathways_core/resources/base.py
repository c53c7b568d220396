"""Building blocks shared by every resource: the base model, metadata, conditions, selectors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
)
from pydantic.alias_generators import to_camel

API_GROUP = "pathways.dev"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_1035_LABEL_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""A label that starts with a letter, as a Service's name must."""


class Model(BaseModel):
    """Base of every wire model: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready dict Kubernetes stores: camelCase keys, unset optional fields omitted."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


DnsLabel = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]
"""A lowercase RFC 1123 label: names of slices, graph nodes and functions."""

MAX_PRIORITY = 1_000_000_000

TenantName = Annotated[str, Field(min_length=1, max_length=63)]
"""A tenant: whose quota is charged (the namespace unless set)."""

Priority = Annotated[int, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)]
"""Higher priority slices may preempt strictly lower priority ones."""


def _quantity_to_str(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    return str(value) if isinstance(value, int | float) else value


QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""A Kubernetes resource quantity (apimachinery's, less the sign: a container's resources are
never negative)."""

Quantity = Annotated[
    str,
    BeforeValidator(_quantity_to_str),
    Field(pattern=QUANTITY_PATTERN, max_length=64),
    WithJsonSchema(
        {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN, "maxLength": 64}
    ),
]
"""A Kubernetes resource quantity such as ``2``, ``1.5``, ``500m`` or ``16Gi`` (not ``lots``,
``nan`` or ``-1``: the API server refused the program's Job, and the program waited, saying
only that it was creating its slices)."""


LABEL_NAME_PATTERN = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
LABEL_KEY_PATTERN = rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{LABEL_NAME_PATTERN}$"
"""A Kubernetes label key: an optional DNS subdomain prefix and '/', then a name of at most
63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit."""
LABEL_VALUE_PATTERN = rf"^{LABEL_NAME_PATTERN}?$"
"""A Kubernetes label value: empty, or a name as in a key."""
LABEL_KEY_MAX, LABEL_VALUE_MAX = 317, 63
LabelKey = Annotated[str, Field(pattern=LABEL_KEY_PATTERN, max_length=LABEL_KEY_MAX)]
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=LABEL_VALUE_MAX)]
ANNOTATIONS_LIMIT_BYTES = 256 * 1024
"""The most bytes an object's annotations may hold, keys and values together (Kubernetes')."""


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    """``labels`` if every key and value is one Kubernetes takes, else ValueError naming the
    first that is not (a selector of another key could match nothing, and waited for good)."""
    for key, value in labels.items():
        if len(key) > LABEL_KEY_MAX or not re.match(LABEL_KEY_PATTERN, key):
            raise ValueError(
                f"{key!r} is no label key (an optional DNS prefix and '/', then a name)"
            )
        if len(value) > LABEL_VALUE_MAX or not re.match(LABEL_VALUE_PATTERN, value):
            raise ValueError(
                f"{value!r} (of {key!r}) is no label value (at most 63 of a-z, 0-9, '-', '_', '.')"
            )
    return labels


class ObjectMeta(BaseModel):
    """The Kubernetes object metadata we read; other metadata fields are kept untouched."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    name: Annotated[str, Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)] | None = None
    generate_name: str | None = None
    namespace: Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)] | None = None
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    annotations: dict[LabelKey, str] = Field(default_factory=dict)
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None

    @field_validator("annotations")
    @classmethod
    def _annotations_fit(cls, annotations: dict[str, str]) -> dict[str, str]:
        size = sum(len(key.encode()) + len(value.encode()) for key, value in annotations.items())
        if size > ANNOTATIONS_LIMIT_BYTES:
            raise ValueError(
                f"annotations hold {size} bytes; at most {ANNOTATIONS_LIMIT_BYTES} (Kubernetes')"
            )
        return annotations


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(Model):
    """An observation of one aspect of an object's state, as in every Kubernetes API."""

    type: str = Field(description="Type of condition, such as Ready or Degraded.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str | None = Field(
        default=None, description="One CamelCase word saying why the condition last changed."
    )
    message: str | None = Field(default=None, description="Human-readable details.")
    last_transition_time: datetime | None = Field(
        default=None, description="When the status last changed."
    )
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this condition was computed from."
    )


Conditions = Annotated[
    list[Condition],
    Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Current conditions of the object, one per type.",
    ),
]


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(Model):
    """One requirement of a label selector."""

    key: str = Field(description="The label key the requirement applies to.")
    operator: SelectorOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[str] = Field(
        default_factory=list, max_length=64, description="Values for In and NotIn; empty otherwise."
    )


class LabelSelector(Model):
    """A Kubernetes label selector: all of its terms must match."""

    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels that must be present with these values."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=32, description="Set-based requirements on labels."
    )

    _labels_taken = field_validator("match_labels")(check_labels)

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether an object carrying ``labels`` is selected."""
        if any(labels.get(key) != value for key, value in self.match_labels.items()):
            return False
        for requirement in self.match_expressions:
            present = requirement.key in labels
            value = labels.get(requirement.key)
            match requirement.operator:
                case SelectorOperator.IN:
                    ok = present and value in requirement.values
                case SelectorOperator.NOT_IN:
                    ok = not present or value not in requirement.values
                case SelectorOperator.EXISTS:
                    ok = present
                case SelectorOperator.DOES_NOT_EXIST:
                    ok = not present
            if not ok:
                return False
        return True


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(Model):
    """A pod toleration, as in the core Kubernetes API."""

    key: str | None = Field(default=None, description="Taint key; empty matches all keys.")
    operator: TolerationOperator = Field(
        default=TolerationOperator.EQUAL, description="Exists or Equal."
    )
    value: str | None = Field(default=None, description="Taint value for Equal.")
    effect: TaintEffect | None = Field(
        default=None, description="NoSchedule, PreferNoSchedule or NoExecute; empty matches all."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )


class ResourceRequirements(Model):
    """Compute resources of a container (cpu, memory, extended resources)."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Minimum resources, such as cpu: 4 or memory: 16Gi."
    )
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Maximum resources.")


class EnvVar(Model):
    """An environment variable given to a container."""

    name: str = Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Variable name.")
    value: str = Field(default="", description="Variable value.")


class FieldError(ValueError):
    """A validation error of one field, raised by model validators that check several fields.

    ``field`` is the wire path below the model that raised it (``topology``, ``slices[1]``), so
    error reports can name the exact field at fault.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class NameRule:
    """What a kind's ``metadata.name`` must be beyond a DNS subdomain, because objects made
    for it are named after it or carry it as a label. Checked by the model and, as a CEL rule
    at the root of its CRD, by the API server."""

    pattern: str
    max_length: int
    expected: str
    """What the pattern allows, in words."""
    reason: str

    def problem(self, metadata: ObjectMeta) -> FieldError | None:
        """Why the object's name breaks the rule, or None. A ``generateName`` is checked with
        the five characters the server appends to it."""
        field, name = "metadata.name", metadata.name
        if name is None and metadata.generate_name is not None:
            field, name = "metadata.generateName", metadata.generate_name + "x" * 5
        if name is None or (len(name) <= self.max_length and re.match(self.pattern, name)):
            return None
        return FieldError(field, f"{self.message} (got {name!r}, {len(name)} characters)")

    @property
    def message(self) -> str:
        return f"expected {self.expected} of at most {self.max_length} characters: {self.reason}"

    def cel(self) -> dict[str, str]:
        """The rule as an ``x-kubernetes-validations`` entry of the CRD's root schema."""
        return {
            "rule": f"self.metadata.name.size() <= {self.max_length} && "
            f"self.metadata.name.matches('{self.pattern}')",
            "message": f"metadata.name: {self.message}",
        }
