"""PathwaysProgram: a dataflow program of compiled functions on virtual slices, or its driver."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar, Literal, Self

from pydantic import Field, model_validator

from pathways_core.graph import CycleError, topological_order
from pathways_core.resources.base import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    GROUP_VERSION,
    Conditions,
    DnsLabel,
    EnvVar,
    FieldError,
    Model,
    NameRule,
    ObjectMeta,
    Priority,
    ResourceRequirements,
    TenantName,
)
from pathways_core.resources.virtual_slice import SliceRequest

SHA256_PATTERN = r"^[0-9a-f]{64}$"
MAX_RESTARTS = 1000
MAX_INT64 = 2**63 - 1  # what the API server and a Job take for an integer field
PROGRAM_NAME = NameRule(
    DNS_LABEL_PATTERN,
    63 - len(f"-run-{MAX_RESTARTS + 1}"),
    "a lowercase RFC 1123 label",
    "a program's runs are the Jobs <name>-run-<n>, whose names, like the label "
    "pathways.dev/program they carry, have at most 63 characters",
)

# Set by Pathways in every run's environment, the SDK's contract: a driver's env may not set
# them (a driver claiming another's PATHWAYS_PROGRAM had its trace stored as that program's).
RUN_VARIABLES = (
    "PATHWAYS_RUN",
    "PATHWAYS_PROGRAM",
    "PATHWAYS_TENANT",
    "PATHWAYS_PRIORITY",
    "PATHWAYS_WEIGHT",
    "PATHWAYS_STEPS",
    "PATHWAYS_SLICES",
)
CHECKPOINT_VARIABLE = "PATHWAYS_CHECKPOINT_DIR"


def _named_list(key: str = "name") -> dict[str, object]:
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


def _unique_names(field: str, names: list[str]) -> None:
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            raise FieldError(f"{field}[{index}].name", f"name {name!r} is used twice")
        seen.add(name)


MAX_WEIGHT = 10_000
"""The highest share of device time a program (or a tenant's own session) may ask for."""


class ProgramSlice(SliceRequest):
    """A virtual slice the program runs on: an existing VirtualSlice, or one described inline
    (the operator creates it, owned by the program)."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.virtualSliceName) != (has(self.devices) || has(self.shape))",
                    "message": "set virtualSliceName, or devices or shape, but not both",
                }
            ]
        }
    }

    name: DnsLabel = Field(description="Name the graph's nodes use to refer to this slice.")
    virtual_slice_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN_PATTERN,
        max_length=253,
        description="An existing VirtualSlice in the program's namespace to run on.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        inline = self.devices is not None or self.shape is not None
        if self.virtual_slice_name is not None:
            if inline or self.accelerator_kind or self.island or self.island_selector:
                raise FieldError(
                    "virtualSliceName",
                    "set virtualSliceName alone, or describe the slice inline (devices or "
                    "shape), not both",
                )
        else:
            self._check_size()
        return self


class ConfigMapKeyRef(Model):
    """A key of a ConfigMap (binaryData or data) in the program's namespace."""

    name: str = Field(pattern=DNS_SUBDOMAIN_PATTERN, description="ConfigMap name.")
    key: str = Field(min_length=1, description="Key holding the serialized artifact.")


class FunctionArtifact(Model):
    """A compiled function: a serialized ``jax.export`` artifact, by reference or inline."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.configMapKeyRef), has(self.uri), has(self.inline)]"
                    ".filter(x, x).size() == 1",
                    "message": "set exactly one of configMapKeyRef, uri or inline",
                }
            ]
        }
    }

    name: DnsLabel = Field(description="Name the graph's nodes use to call this function.")
    config_map_key_ref: ConfigMapKeyRef | None = Field(
        default=None, description="The artifact stored in a ConfigMap."
    )
    uri: str | None = Field(
        default=None,
        pattern=r"^(gs|s3|https|file)://.+",
        description="Where to fetch the artifact: gs://, s3://, https:// or file://.",
    )
    inline: str | None = Field(
        default=None,
        max_length=1_000_000,
        pattern=r"^[A-Za-z0-9+/]*={0,2}$",
        description="The artifact itself, base64-encoded (small functions only).",
    )
    sha256: str | None = Field(
        default=None,
        pattern=SHA256_PATTERN,
        description="Digest of the serialized artifact; checked before it is loaded.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        sources = [self.config_map_key_ref, self.uri, self.inline]
        if sum(source is not None for source in sources) != 1:
            raise FieldError("uri", "set exactly one of configMapKeyRef, uri or inline")
        return self


class NodeInput(Model):
    """An edge of the graph: output ``output`` of node ``node`` feeds this input."""

    node: DnsLabel = Field(description="Name of the producing node.")
    output: int = Field(default=0, ge=0, description="Index of the producing node's output.")


class GraphNode(Model):
    """A call of a compiled function, run SPMD on every device of one slice."""

    name: DnsLabel = Field(description="Name of the node, unique in the graph.")
    function: DnsLabel = Field(description="Name of the function (in graph.functions) it calls.")
    slice: DnsLabel = Field(description="Name of the slice (in spec.slices) it runs on.")
    inputs: list[NodeInput] = Field(
        default_factory=list,
        max_length=256,
        description="Arguments, in order, as outputs of other nodes.",
    )


class ProgramGraph(Model):
    """A dataflow graph of compiled functions: the program, with no Python needed to run it."""

    functions: list[FunctionArtifact] = Field(
        min_length=1,
        max_length=1024,
        description="Compiled functions the nodes call.",
        json_schema_extra=_named_list(),
    )
    nodes: list[GraphNode] = Field(
        min_length=1,
        max_length=4096,
        description="Calls of the functions; each runs once per step.",
        json_schema_extra=_named_list(),
    )
    outputs: list[NodeInput] = Field(
        default_factory=list,
        max_length=1024,
        description="Node outputs kept as the program's results.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        _unique_names("functions", [function.name for function in self.functions])
        _unique_names("nodes", [node.name for node in self.nodes])
        functions = {function.name for function in self.functions}
        nodes = {node.name: node for node in self.nodes}
        for index, node in enumerate(self.nodes):
            if node.function not in functions:
                raise FieldError(
                    f"nodes[{index}].function",
                    f"node {node.name!r} calls function {node.function!r}, which is not in "
                    f"graph.functions ({', '.join(sorted(functions))})",
                )
        edges = [
            (f"nodes[{index}].inputs[{position}].node", edge)
            for index, node in enumerate(self.nodes)
            for position, edge in enumerate(node.inputs)
        ] + [(f"outputs[{position}].node", edge) for position, edge in enumerate(self.outputs)]
        for field, edge in edges:
            if edge.node not in nodes:
                raise FieldError(field, f"refers to unknown node {edge.node!r}")
        try:
            topological_order(
                {node.name: [edge.node for edge in node.inputs] for node in self.nodes}
            )
        except CycleError as error:
            first = next(i for i, node in enumerate(self.nodes) if node.name == error.cycle[0])
            raise FieldError(f"nodes[{first}]", str(error)) from None
        return self


# The most bytes one argument of a process may hold on Linux (MAX_ARG_STRLEN, 32 pages, with
# its terminating NUL): inline source is one (``python -c``); a longer one failed to start.
MAX_ARGUMENT_BYTES = 131_071


class Driver(Model):
    """A Python driver that builds and runs the program with the SDK, run as a Kubernetes Job."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.command) != has(self.source)",
                    "message": "set exactly one of command or source",
                },
                {
                    "rule": "!has(self.env) || self.env.all(e, !(e.name in ["
                    + ", ".join(f"'{name}'" for name in RUN_VARIABLES)
                    + "]))",
                    "message": "env: the PATHWAYS_* variables of every run are set by Pathways",
                },
                {
                    "rule": "!has(self.checkpointClaim) || !has(self.env) || "
                    f"self.env.all(e, e.name != '{CHECKPOINT_VARIABLE}')",
                    "message": f"env: {CHECKPOINT_VARIABLE} is set from checkpointClaim",
                },
            ]
        }
    }

    image: str | None = Field(
        default=None, min_length=1, description="Container image; defaults to the Pathways image."
    )
    command: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Entrypoint of the driver container.",
    )
    args: list[str] = Field(
        default_factory=list, max_length=1024, description="Arguments of the command."
    )
    source: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ARGUMENT_BYTES,
        description="Inline Python source of the driver, run with the SDK installed (at most "
        f"{MAX_ARGUMENT_BYTES} bytes in UTF-8: it is one argument of the driver's process).",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=256,
        description="Extra environment variables of the driver.",
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="cpu and memory of the driver container."
    )
    checkpoint_claim: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN_PATTERN,
        max_length=253,
        description="A PersistentVolumeClaim of the program's namespace for its checkpoints: "
        "mounted in every run, with PATHWAYS_CHECKPOINT_DIR set to a folder of the program's "
        "own on it, so a run resumes from the last checkpoint of the one before "
        "(pw.checkpoint). Without it, checkpoints are not kept in Kubernetes.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if (self.command is None) == (self.source is None):
            raise FieldError("command", "set exactly one of command or source")
        source_bytes = len(self.source.encode()) if self.source is not None else 0
        if source_bytes > MAX_ARGUMENT_BYTES:
            raise FieldError(
                "source",
                f"is {source_bytes} bytes in UTF-8; at most {MAX_ARGUMENT_BYTES} "
                "fit in one argument of a process (Linux's limit): ship a longer driver in an "
                "image and run it with command",
            )
        texts = [
            ("image", self.image or ""),
            ("source", self.source or ""),
            *((f"command[{i}]", part) for i, part in enumerate(self.command or ())),
            *((f"args[{i}]", part) for i, part in enumerate(self.args)),
            *((f"env[{i}].value", variable.value) for i, variable in enumerate(self.env)),
        ]
        for field, text in texts:
            if "\0" in text:
                raise FieldError(
                    field, "holds a NUL character: no process argument or environment value can"
                )
        for index, variable in enumerate(self.env):
            if variable.name in RUN_VARIABLES:
                raise FieldError(
                    f"env[{index}].name",
                    f"{variable.name} is set by Pathways for every run (the SDK reads it); "
                    "choose another name",
                )
            if variable.name == CHECKPOINT_VARIABLE and self.checkpoint_claim is not None:
                raise FieldError(
                    f"env[{index}].name",
                    f"{CHECKPOINT_VARIABLE} is set from checkpointClaim (a folder of the "
                    "program's on the claim); drop one of them",
                )
        return self


class RestartPolicy(StrEnum):
    NEVER = "Never"
    ON_FAILURE = "OnFailure"


class PathwaysProgramSpec(Model):
    """The desired program."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.graph) != has(self.driver)",
                    "message": "set exactly one of graph or driver",
                }
            ]
        }
    }

    slices: list[ProgramSlice] = Field(
        min_length=1,
        max_length=256,
        description="Virtual slices the program runs on.",
        json_schema_extra=_named_list(),
    )
    graph: ProgramGraph | None = Field(
        default=None, description="The program as a graph of compiled functions."
    )
    driver: Driver | None = Field(
        default=None, description="A driver that builds the graph with the SDK."
    )
    tenant: TenantName | None = Field(
        default=None,
        description="Tenant charged for the program's devices; defaults to the namespace.",
    )
    priority: Priority = Field(
        default=0,
        description="Priority of the program's slices; higher may preempt strictly lower.",
    )
    weight: int = Field(
        default=1,
        ge=1,
        le=MAX_WEIGHT,
        description="Share of device time relative to other programs on the same island "
        "(proportional-share scheduling).",
    )
    steps: int = Field(
        default=1,
        ge=1,
        le=MAX_INT64,
        description="Times the graph runs (training steps); a driver reads it as "
        "PATHWAYS_STEPS (cluster.steps in the SDK).",
    )
    restart_policy: RestartPolicy = Field(
        default=RestartPolicy.NEVER,
        description="Never, or OnFailure: start a new run after a failure (a driver resumes "
        "from its own checkpoint, PATHWAYS_RUN > 1; a graph program starts its steps again).",
    )
    max_restarts: int = Field(
        default=3,
        ge=0,
        le=MAX_RESTARTS,
        description="Restarts allowed before the program fails.",
    )
    suspend: bool = Field(
        default=False,
        description="Suspend the program: its run stops and its slices are released; unset, "
        "a new run starts (a driver resumes from its own checkpoint).",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_INT64,  # a Job's activeDeadlineSeconds
        description="Fail the program if it runs longer than this.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if (self.graph is None) == (self.driver is None):
            raise FieldError("graph", "set exactly one of graph or driver")
        _unique_names("slices", [item.name for item in self.slices])
        if self.graph is not None:
            slices = {item.name for item in self.slices}
            for index, node in enumerate(self.graph.nodes):
                if node.slice not in slices:
                    raise FieldError(
                        f"graph.nodes[{index}].slice",
                        f"node {node.name!r} runs on slice {node.slice!r}, which is not in "
                        f"spec.slices ({', '.join(sorted(slices))})",
                    )
        return self


class ProgramPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class NodePhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class NodeStatus(Model):
    """Progress of one graph node."""

    name: str = Field(description="Node name.")
    phase: NodePhase = Field(description="Pending, Running, Succeeded or Failed.")
    island: str | None = Field(default=None, description="Island the node runs on.")
    completed_steps: int = Field(default=0, ge=0, description="Steps this node has finished.")
    message: str | None = Field(default=None, description="Failure details from the executor.")


class ProgramSliceStatus(Model):
    """The VirtualSlice backing one of the program's slices."""

    name: str = Field(description="Slice name in spec.slices.")
    virtual_slice_name: str = Field(description="The VirtualSlice resource.")
    phase: str | None = Field(default=None, description="That VirtualSlice's phase.")
    island: str | None = Field(default=None, description="Island it is bound to.")


class PathwaysProgramStatus(Model):
    """The observed program."""

    phase: ProgramPhase | None = Field(
        default=None, description="Pending, Running, Suspended, Succeeded or Failed."
    )
    completed_steps: int | None = Field(default=None, ge=0, description="Steps fully completed.")
    restarts: int | None = Field(default=None, ge=0, description="Restarts so far.")
    restarted_run: int | None = Field(
        default=None,
        ge=0,
        description="The failed run the latest restart was counted for (each counts once, "
        "however long the next run waits for its slices).",
    )
    runs: int | None = Field(
        default=None,
        ge=0,
        description="Runs started so far; run n is the Job <program>-run-<n>.",
    )
    next_run_time: datetime | None = Field(
        default=None,
        description="When the next run may start: a restart backs off after its run failed "
        "(the failure grace, doubled at each restart, at most 6 minutes).",
    )
    start_time: datetime | None = Field(default=None, description="When the program started.")
    completion_time: datetime | None = Field(default=None, description="When it finished.")
    reason: str | None = Field(
        default=None, description="Why it is pending or failed (one CamelCase word)."
    )
    message: str | None = Field(default=None, description="Details for humans.")
    slices: list[ProgramSliceStatus] = Field(
        default_factory=list,
        max_length=256,
        description="The program's slices.",
        json_schema_extra=_named_list(),
    )
    nodes: list[NodeStatus] = Field(
        default_factory=list,
        max_length=4096,
        description="Per-node progress.",
        json_schema_extra=_named_list(),
    )
    conditions: Conditions
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this status reflects."
    )


class PathwaysProgram(Model):
    """A Pathways program: a DAG of compiled JAX functions on virtual slices, or a driver that
    builds one, run by the island schedulers and tracked to Succeeded or Failed."""

    NAME_RULE: ClassVar[NameRule] = PROGRAM_NAME

    api_version: Literal["pathways.dev/v1alpha1"] = GROUP_VERSION
    kind: Literal["PathwaysProgram"] = "PathwaysProgram"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PathwaysProgramSpec
    status: PathwaysProgramStatus = Field(default_factory=PathwaysProgramStatus)

    @model_validator(mode="after")
    def _check_name(self) -> Self:
        if problem := self.NAME_RULE.problem(self.metadata):
            raise problem
        return self
