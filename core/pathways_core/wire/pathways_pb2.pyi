from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FunctionRegistration(_message.Message):
    __slots__ = ("function_id", "artifact", "name", "kind")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        JAX_EXPORT: _ClassVar[FunctionRegistration.Kind]
        STABLEHLO: _ClassVar[FunctionRegistration.Kind]
    JAX_EXPORT: FunctionRegistration.Kind
    STABLEHLO: FunctionRegistration.Kind
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    function_id: str
    artifact: bytes
    name: str
    kind: FunctionRegistration.Kind
    def __init__(self, function_id: _Optional[str] = ..., artifact: _Optional[bytes] = ..., name: _Optional[str] = ..., kind: _Optional[_Union[FunctionRegistration.Kind, str]] = ...) -> None: ...

class StableHloProgram(_message.Message):
    __slots__ = ("module", "compile_options")
    MODULE_FIELD_NUMBER: _ClassVar[int]
    COMPILE_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    module: bytes
    compile_options: bytes
    def __init__(self, module: _Optional[bytes] = ..., compile_options: _Optional[bytes] = ...) -> None: ...

class CompiledArray(_message.Message):
    __slots__ = ("dtype", "shape", "sharding", "minor_to_major", "memory_kind")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    SHARDING_FIELD_NUMBER: _ClassVar[int]
    MINOR_TO_MAJOR_FIELD_NUMBER: _ClassVar[int]
    MEMORY_KIND_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    sharding: bytes
    minor_to_major: _containers.RepeatedScalarFieldContainer[int]
    memory_kind: str
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., sharding: _Optional[bytes] = ..., minor_to_major: _Optional[_Iterable[int]] = ..., memory_kind: _Optional[str] = ...) -> None: ...

class CompiledProgram(_message.Message):
    __slots__ = ("name", "fingerprint", "parameters", "results", "parameter_shardings", "result_shardings", "generated_code_bytes", "cost_analysis", "hlo_text", "donated_parameters")
    class CostAnalysisEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_SHARDINGS_FIELD_NUMBER: _ClassVar[int]
    RESULT_SHARDINGS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_CODE_BYTES_FIELD_NUMBER: _ClassVar[int]
    COST_ANALYSIS_FIELD_NUMBER: _ClassVar[int]
    HLO_TEXT_FIELD_NUMBER: _ClassVar[int]
    DONATED_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    fingerprint: bytes
    parameters: _containers.RepeatedCompositeFieldContainer[CompiledArray]
    results: _containers.RepeatedCompositeFieldContainer[CompiledArray]
    parameter_shardings: bool
    result_shardings: bool
    generated_code_bytes: int
    cost_analysis: _containers.ScalarMap[str, float]
    hlo_text: str
    donated_parameters: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., fingerprint: _Optional[bytes] = ..., parameters: _Optional[_Iterable[_Union[CompiledArray, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[CompiledArray, _Mapping]]] = ..., parameter_shardings: _Optional[bool] = ..., result_shardings: _Optional[bool] = ..., generated_code_bytes: _Optional[int] = ..., cost_analysis: _Optional[_Mapping[str, float]] = ..., hlo_text: _Optional[str] = ..., donated_parameters: _Optional[_Iterable[int]] = ...) -> None: ...

class Computation(_message.Message):
    __slots__ = ("id", "client", "function_id", "devices", "inputs", "outputs", "name", "describe")
    ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIBE_FIELD_NUMBER: _ClassVar[int]
    id: str
    client: str
    function_id: str
    devices: _containers.RepeatedScalarFieldContainer[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    name: str
    describe: bool
    def __init__(self, id: _Optional[str] = ..., client: _Optional[str] = ..., function_id: _Optional[str] = ..., devices: _Optional[_Iterable[int]] = ..., inputs: _Optional[_Iterable[str]] = ..., outputs: _Optional[_Iterable[str]] = ..., name: _Optional[str] = ..., describe: _Optional[bool] = ...) -> None: ...

class DeleteBuffers(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ProgramRegistration(_message.Message):
    __slots__ = ("program_id", "name", "nodes", "arguments", "results", "sources")
    PROGRAM_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    program_id: str
    name: str
    nodes: _containers.RepeatedCompositeFieldContainer[Computation]
    arguments: _containers.RepeatedScalarFieldContainer[str]
    results: _containers.RepeatedScalarFieldContainer[str]
    sources: _containers.RepeatedCompositeFieldContainer[InputSource]
    def __init__(self, program_id: _Optional[str] = ..., name: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[Computation, _Mapping]]] = ..., arguments: _Optional[_Iterable[str]] = ..., results: _Optional[_Iterable[str]] = ..., sources: _Optional[_Iterable[_Union[InputSource, _Mapping]]] = ...) -> None: ...

class ProgramCall(_message.Message):
    __slots__ = ("id", "program_id", "arguments", "results")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_ID_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    program_id: str
    arguments: _containers.RepeatedScalarFieldContainer[str]
    results: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., program_id: _Optional[str] = ..., arguments: _Optional[_Iterable[str]] = ..., results: _Optional[_Iterable[str]] = ...) -> None: ...

class ClientMessage(_message.Message):
    __slots__ = ("hello", "function", "computation", "delete", "placed", "program", "call", "remote_failed", "remote_ready")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    COMPUTATION_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    PLACED_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FAILED_FIELD_NUMBER: _ClassVar[int]
    REMOTE_READY_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    function: FunctionRegistration
    computation: Computation
    delete: DeleteBuffers
    placed: PlacedBuffer
    program: ProgramRegistration
    call: ProgramCall
    remote_failed: RemoteFailed
    remote_ready: RemoteReady
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., function: _Optional[_Union[FunctionRegistration, _Mapping]] = ..., computation: _Optional[_Union[Computation, _Mapping]] = ..., delete: _Optional[_Union[DeleteBuffers, _Mapping]] = ..., placed: _Optional[_Union[PlacedBuffer, _Mapping]] = ..., program: _Optional[_Union[ProgramRegistration, _Mapping]] = ..., call: _Optional[_Union[ProgramCall, _Mapping]] = ..., remote_failed: _Optional[_Union[RemoteFailed, _Mapping]] = ..., remote_ready: _Optional[_Union[RemoteReady, _Mapping]] = ...) -> None: ...

class Prefetch(_message.Message):
    __slots__ = ("sources",)
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    sources: _containers.RepeatedCompositeFieldContainer[InputSource]
    def __init__(self, sources: _Optional[_Iterable[_Union[InputSource, _Mapping]]] = ...) -> None: ...

class RemoteReady(_message.Message):
    __slots__ = ("buffer_ids",)
    BUFFER_IDS_FIELD_NUMBER: _ClassVar[int]
    buffer_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, buffer_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoteFailed(_message.Message):
    __slots__ = ("buffer_ids", "reason")
    BUFFER_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    buffer_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, buffer_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class PlacedBuffer(_message.Message):
    __slots__ = ("buffer_id", "executor", "remote", "executors")
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FIELD_NUMBER: _ClassVar[int]
    EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    buffer_id: str
    executor: int
    remote: InputSource
    executors: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, buffer_id: _Optional[str] = ..., executor: _Optional[int] = ..., remote: _Optional[_Union[InputSource, _Mapping]] = ..., executors: _Optional[_Iterable[int]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("client", "weight", "priority", "credential")
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    client: str
    weight: int
    priority: int
    credential: str
    def __init__(self, client: _Optional[str] = ..., weight: _Optional[int] = ..., priority: _Optional[int] = ..., credential: _Optional[str] = ...) -> None: ...

class ClientEvent(_message.Message):
    __slots__ = ("kind", "computation_id", "seq", "message", "function_id", "program_id", "executor", "rejoined", "unmade", "ends_session")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[ClientEvent.Kind]
        QUEUED: _ClassVar[ClientEvent.Kind]
        COMPLETED: _ClassVar[ClientEvent.Kind]
        FAILED: _ClassVar[ClientEvent.Kind]
        REJECTED: _ClassVar[ClientEvent.Kind]
        REGISTERED: _ClassVar[ClientEvent.Kind]
        EXECUTOR_LOST: _ClassVar[ClientEvent.Kind]
        EXECUTOR_REJOINED: _ClassVar[ClientEvent.Kind]
    KIND_UNSPECIFIED: ClientEvent.Kind
    QUEUED: ClientEvent.Kind
    COMPLETED: ClientEvent.Kind
    FAILED: ClientEvent.Kind
    REJECTED: ClientEvent.Kind
    REGISTERED: ClientEvent.Kind
    EXECUTOR_LOST: ClientEvent.Kind
    EXECUTOR_REJOINED: ClientEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    COMPUTATION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    REJOINED_FIELD_NUMBER: _ClassVar[int]
    UNMADE_FIELD_NUMBER: _ClassVar[int]
    ENDS_SESSION_FIELD_NUMBER: _ClassVar[int]
    kind: ClientEvent.Kind
    computation_id: str
    seq: int
    message: str
    function_id: str
    program_id: str
    executor: int
    rejoined: ExecutorInfo
    unmade: bool
    ends_session: bool
    def __init__(self, kind: _Optional[_Union[ClientEvent.Kind, str]] = ..., computation_id: _Optional[str] = ..., seq: _Optional[int] = ..., message: _Optional[str] = ..., function_id: _Optional[str] = ..., program_id: _Optional[str] = ..., executor: _Optional[int] = ..., rejoined: _Optional[_Union[ExecutorInfo, _Mapping]] = ..., unmade: _Optional[bool] = ..., ends_session: _Optional[bool] = ...) -> None: ...

class InputSource(_message.Message):
    __slots__ = ("buffer_id", "executors", "data_endpoints", "uploaded", "partial", "pending")
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    UPLOADED_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    buffer_id: str
    executors: _containers.RepeatedScalarFieldContainer[str]
    data_endpoints: _containers.RepeatedScalarFieldContainer[str]
    uploaded: bool
    partial: bool
    pending: bool
    def __init__(self, buffer_id: _Optional[str] = ..., executors: _Optional[_Iterable[str]] = ..., data_endpoints: _Optional[_Iterable[str]] = ..., uploaded: _Optional[bool] = ..., partial: _Optional[bool] = ..., pending: _Optional[bool] = ...) -> None: ...

class ExecutorCommand(_message.Message):
    __slots__ = ("seq", "run", "register", "delete", "hello", "program", "call", "forget", "peer_down", "peer_up", "retire", "remote_failed", "prefetch", "sources")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    FORGET_FIELD_NUMBER: _ClassVar[int]
    PEER_DOWN_FIELD_NUMBER: _ClassVar[int]
    PEER_UP_FIELD_NUMBER: _ClassVar[int]
    RETIRE_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FAILED_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    seq: int
    run: Computation
    register: FunctionRegistration
    delete: DeleteBuffers
    hello: ControlHello
    program: ProgramRegistration
    call: ProgramCall
    forget: Forget
    peer_down: PeerDown
    peer_up: PeerUp
    retire: Retire
    remote_failed: RemoteFailed
    prefetch: Prefetch
    sources: _containers.RepeatedCompositeFieldContainer[InputSource]
    def __init__(self, seq: _Optional[int] = ..., run: _Optional[_Union[Computation, _Mapping]] = ..., register: _Optional[_Union[FunctionRegistration, _Mapping]] = ..., delete: _Optional[_Union[DeleteBuffers, _Mapping]] = ..., hello: _Optional[_Union[ControlHello, _Mapping]] = ..., program: _Optional[_Union[ProgramRegistration, _Mapping]] = ..., call: _Optional[_Union[ProgramCall, _Mapping]] = ..., forget: _Optional[_Union[Forget, _Mapping]] = ..., peer_down: _Optional[_Union[PeerDown, _Mapping]] = ..., peer_up: _Optional[_Union[PeerUp, _Mapping]] = ..., retire: _Optional[_Union[Retire, _Mapping]] = ..., remote_failed: _Optional[_Union[RemoteFailed, _Mapping]] = ..., prefetch: _Optional[_Union[Prefetch, _Mapping]] = ..., sources: _Optional[_Iterable[_Union[InputSource, _Mapping]]] = ...) -> None: ...

class Forget(_message.Message):
    __slots__ = ("function_ids", "program_ids")
    FUNCTION_IDS_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_IDS_FIELD_NUMBER: _ClassVar[int]
    function_ids: _containers.RepeatedScalarFieldContainer[str]
    program_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, function_ids: _Optional[_Iterable[str]] = ..., program_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PeerDown(_message.Message):
    __slots__ = ("executor", "data_endpoint", "reason")
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    executor: int
    data_endpoint: str
    reason: str
    def __init__(self, executor: _Optional[int] = ..., data_endpoint: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PeerUp(_message.Message):
    __slots__ = ("executor", "data_endpoint")
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    executor: int
    data_endpoint: str
    def __init__(self, executor: _Optional[int] = ..., data_endpoint: _Optional[str] = ...) -> None: ...

class Retire(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ControlHello(_message.Message):
    __slots__ = ("island", "token", "scheduler")
    ISLAND_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    island: str
    token: str
    scheduler: str
    def __init__(self, island: _Optional[str] = ..., token: _Optional[str] = ..., scheduler: _Optional[str] = ...) -> None: ...

class ExecutorEvent(_message.Message):
    __slots__ = ("seq", "computation_id", "ok", "message", "start_ns", "end_ns", "executor", "node_indices", "node_starts_ns", "node_ends_ns", "node_failed")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COMPUTATION_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    NODE_INDICES_FIELD_NUMBER: _ClassVar[int]
    NODE_STARTS_NS_FIELD_NUMBER: _ClassVar[int]
    NODE_ENDS_NS_FIELD_NUMBER: _ClassVar[int]
    NODE_FAILED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    computation_id: str
    ok: bool
    message: str
    start_ns: int
    end_ns: int
    executor: int
    node_indices: _containers.RepeatedScalarFieldContainer[int]
    node_starts_ns: _containers.RepeatedScalarFieldContainer[int]
    node_ends_ns: _containers.RepeatedScalarFieldContainer[int]
    node_failed: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, seq: _Optional[int] = ..., computation_id: _Optional[str] = ..., ok: _Optional[bool] = ..., message: _Optional[str] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., executor: _Optional[int] = ..., node_indices: _Optional[_Iterable[int]] = ..., node_starts_ns: _Optional[_Iterable[int]] = ..., node_ends_ns: _Optional[_Iterable[int]] = ..., node_failed: _Optional[_Iterable[int]] = ...) -> None: ...

class ArrayChunk(_message.Message):
    __slots__ = ("buffer_id", "dtype", "shape", "total_bytes", "data", "begin", "region_start", "region_stop")
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    REGION_START_FIELD_NUMBER: _ClassVar[int]
    REGION_STOP_FIELD_NUMBER: _ClassVar[int]
    buffer_id: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    total_bytes: int
    data: bytes
    begin: bool
    region_start: _containers.RepeatedScalarFieldContainer[int]
    region_stop: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, buffer_id: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., total_bytes: _Optional[int] = ..., data: _Optional[bytes] = ..., begin: _Optional[bool] = ..., region_start: _Optional[_Iterable[int]] = ..., region_stop: _Optional[_Iterable[int]] = ...) -> None: ...

class ArrayRequest(_message.Message):
    __slots__ = ("buffer_id", "timeout_seconds")
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    buffer_id: str
    timeout_seconds: float
    def __init__(self, buffer_id: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class ExecutorInfo(_message.Message):
    __slots__ = ("index", "endpoint", "devices", "platform", "data_endpoint", "control_endpoint", "buffers", "buffer_bytes", "inputs_taken_over", "functions", "executables", "programs", "lost", "incarnation")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    CONTROL_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    INPUTS_TAKEN_OVER_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    EXECUTABLES_FIELD_NUMBER: _ClassVar[int]
    PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    index: int
    endpoint: str
    devices: _containers.RepeatedScalarFieldContainer[int]
    platform: str
    data_endpoint: str
    control_endpoint: str
    buffers: int
    buffer_bytes: int
    inputs_taken_over: int
    functions: int
    executables: int
    programs: int
    lost: str
    incarnation: str
    def __init__(self, index: _Optional[int] = ..., endpoint: _Optional[str] = ..., devices: _Optional[_Iterable[int]] = ..., platform: _Optional[str] = ..., data_endpoint: _Optional[str] = ..., control_endpoint: _Optional[str] = ..., buffers: _Optional[int] = ..., buffer_bytes: _Optional[int] = ..., inputs_taken_over: _Optional[int] = ..., functions: _Optional[int] = ..., executables: _Optional[int] = ..., programs: _Optional[int] = ..., lost: _Optional[str] = ..., incarnation: _Optional[str] = ...) -> None: ...

class IslandInfo(_message.Message):
    __slots__ = ("island", "shape", "executors", "policy", "session_endpoint", "max_queued", "max_queued_per_client", "functions", "programs", "credentials_required")
    ISLAND_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_PER_CLIENT_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    CREDENTIALS_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    island: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    executors: _containers.RepeatedCompositeFieldContainer[ExecutorInfo]
    policy: str
    session_endpoint: str
    max_queued: int
    max_queued_per_client: int
    functions: int
    programs: int
    credentials_required: bool
    def __init__(self, island: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., executors: _Optional[_Iterable[_Union[ExecutorInfo, _Mapping]]] = ..., policy: _Optional[str] = ..., session_endpoint: _Optional[str] = ..., max_queued: _Optional[int] = ..., max_queued_per_client: _Optional[int] = ..., functions: _Optional[int] = ..., programs: _Optional[int] = ..., credentials_required: _Optional[bool] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TraceRecord(_message.Message):
    __slots__ = ("seq", "computation_id", "client", "name", "devices", "executor", "start_ns", "end_ns", "ok")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COMPUTATION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    seq: int
    computation_id: str
    client: str
    name: str
    devices: _containers.RepeatedScalarFieldContainer[int]
    executor: int
    start_ns: int
    end_ns: int
    ok: bool
    def __init__(self, seq: _Optional[int] = ..., computation_id: _Optional[str] = ..., client: _Optional[str] = ..., name: _Optional[str] = ..., devices: _Optional[_Iterable[int]] = ..., executor: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., ok: _Optional[bool] = ...) -> None: ...

class TraceRequest(_message.Message):
    __slots__ = ("clients", "since_ns")
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    SINCE_NS_FIELD_NUMBER: _ClassVar[int]
    clients: _containers.RepeatedScalarFieldContainer[str]
    since_ns: int
    def __init__(self, clients: _Optional[_Iterable[str]] = ..., since_ns: _Optional[int] = ...) -> None: ...

class Trace(_message.Message):
    __slots__ = ("records", "dropped_until_ns")
    class DroppedUntilNsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_UNTIL_NS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[TraceRecord]
    dropped_until_ns: _containers.ScalarMap[str, int]
    def __init__(self, records: _Optional[_Iterable[_Union[TraceRecord, _Mapping]]] = ..., dropped_until_ns: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ClientBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ClientMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ClientMessage, _Mapping]]] = ...) -> None: ...

class ClientEventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[ClientEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[ClientEvent, _Mapping]]] = ...) -> None: ...

class CommandBatch(_message.Message):
    __slots__ = ("commands",)
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[ExecutorCommand]
    def __init__(self, commands: _Optional[_Iterable[_Union[ExecutorCommand, _Mapping]]] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[ExecutorEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[ExecutorEvent, _Mapping]]] = ...) -> None: ...
