"""The IFRT proxy's wire protocol, read out of the installed jaxlib.

jaxlib ships the IFRT proxy *client* (``jax.extend.backend.ifrt_proxy``) and, compiled into
``libjax_common.so``, the serialized ``FileDescriptorProto`` of every ``.proto`` file it uses
(``xla/python/ifrt_proxy/common/ifrt_service.proto`` and its dependencies). Reading them from the
binary gives message classes that match the installed client exactly, with no ``.proto`` file in
this repository: a different jaxlib brings its own protocol along.

How the descriptors are found: protoc embeds each file as its serialized ``FileDescriptorProto``,
which starts with field 1 (the file's name), i.e. the bytes ``0x0a <varint length> <name>``. From
there the record is walked field by field (protoc writes fields in increasing number order) until a
byte cannot continue a ``FileDescriptorProto``; that prefix is parsed and checked to carry the name.
Dependencies are loaded first, recursively; ``google/protobuf/*`` files come from the Python
protobuf runtime.

Everything is done once per process and cached (:func:`load`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import mmap
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from pathways_core.wire.fields import encode_varint, varint

#: The file holding the service and the request/response messages.
SERVICE_FILE = "xla/python/ifrt_proxy/common/grpc_ifrt_service.proto"
#: The gRPC service's full name: methods are ``/xla.ifrt.proxy.GrpcIfrtService/<Method>``.
SERVICE_NAME = "xla.ifrt.proxy.GrpcIfrtService"

# FileDescriptorProto's fields and their wire types (0 varint, 2 length-delimited); the walk
# stops at the first tag outside this set, or at a field number lower than the previous one.
_FILE_FIELDS = {
    1: 2,
    2: 2,
    3: 2,
    4: 2,
    5: 2,
    6: 2,
    7: 2,
    8: 2,
    9: 2,
    10: 0,
    11: 0,
    12: 2,
    14: 0,
    15: 2,
}


class ProtocolUnavailable(RuntimeError):
    """The installed jaxlib does not carry the IFRT proxy protocol (or it could not be read)."""


def _record_end(data: bytes | mmap.mmap, start: int) -> int:
    """Where the serialized FileDescriptorProto starting at ``start`` ends (see module doc)."""
    pos, last = start, 0
    while pos < len(data):
        try:
            tag, after = varint(data, pos)
            field, wire = tag >> 3, tag & 7
            if _FILE_FIELDS.get(field) != wire or field < last:
                return pos
            length, after = varint(data, after)
            if wire == 2:
                after += length
            if after > len(data):
                return pos
        except (IndexError, ValueError):
            return pos
        last, pos = field, after
    return pos


def _find_file(data: bytes | mmap.mmap, name: str) -> descriptor_pb2.FileDescriptorProto | None:
    encoded = name.encode()
    needle = b"\x0a" + encode_varint(len(encoded)) + encoded
    for match in re.finditer(re.escape(needle), data):
        end = _record_end(data, match.start())
        proto = descriptor_pb2.FileDescriptorProto()
        try:
            proto.ParseFromString(data[match.start() : end])
        except Exception:
            continue
        if proto.name == name and (proto.message_type or proto.enum_type or proto.service):
            return proto
    return None


def jaxlib_library() -> Path:
    """The shared library of the installed jaxlib that embeds the protocol's descriptors."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        raise ProtocolUnavailable("jaxlib is not installed: the IFRT proxy protocol comes from it")
    folder = Path(next(iter(spec.submodule_search_locations)))
    library = folder / "libjax_common.so"
    if not library.exists():
        # Older jaxlibs put everything into the extension module itself.
        candidates = sorted(folder.glob("xla_extension*.so")) + sorted(folder.glob("_jax*.so"))
        library = max(candidates, key=lambda p: p.stat().st_size, default=library)
    if not library.exists():
        raise ProtocolUnavailable(f"no jaxlib shared library found in {folder}")
    return library


@dataclass(frozen=True)
class Protocol:
    """The protocol's message classes, built in a private descriptor pool."""

    pool: descriptor_pool.DescriptorPool
    library: str
    files: tuple[str, ...]

    def message(self, full_name: str) -> type[Any]:
        """The message class of ``full_name`` (e.g. ``xla.ifrt.proxy.IfrtRequest``)."""
        return _message_class(self, full_name)

    def __getattr__(self, short: str) -> type[Any]:
        """``protocol.IfrtRequest``: a message of package ``xla.ifrt.proxy`` by its short name."""
        if short.startswith("_"):
            raise AttributeError(short)
        for package in ("xla.ifrt.proxy", "xla.ifrt", "xla.ifrt.proto", "xla", "tensorflow"):
            try:
                return self.message(f"{package}.{short}")
            except KeyError:
                continue
        raise AttributeError(f"no message {short!r} in the IFRT proxy protocol")

    @property
    def service(self) -> Any:
        """The ``GrpcIfrtService`` ServiceDescriptor."""
        return self.pool.FindServiceByName(SERVICE_NAME)


@functools.cache
def _message_class(protocol: Protocol, full_name: str) -> type[Any]:
    return message_factory.GetMessageClass(protocol.pool.FindMessageTypeByName(full_name))


def _well_known(name: str) -> descriptor_pb2.FileDescriptorProto | None:
    """A ``google/protobuf/*.proto`` file from the Python protobuf runtime."""
    from google.protobuf import descriptor_pool as dp

    try:
        found = dp.Default().FindFileByName(name)
    except KeyError:
        module = name.rsplit("/", 1)[-1].removesuffix(".proto") + "_pb2"
        try:
            found = importlib.import_module(f"google.protobuf.{module}").DESCRIPTOR
        except ImportError:
            return None
    proto = descriptor_pb2.FileDescriptorProto()
    found.CopyToProto(proto)
    return proto


@functools.lru_cache(maxsize=4)
def load(library: str | None = None) -> Protocol:
    """Read the protocol out of the installed jaxlib (or ``library``), once per process.

    Raises:
        ProtocolUnavailable: jaxlib is missing, or its library lacks a file of the protocol.
    """
    library = Path(library) if library else jaxlib_library()
    try:
        # Mapped, not read: the library is hundreds of MB and only a few KB of it are needed.
        with library.open("rb") as handle:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise ProtocolUnavailable(f"cannot read {library}: {exc}") from exc
    pool = descriptor_pool.DescriptorPool()
    added: list[str] = []
    visiting: set[str] = set()

    def add(name: str) -> None:
        if name in added or name in visiting:
            return
        visiting.add(name)
        proto = _well_known(name) if name.startswith("google/protobuf/") else _find_file(data, name)
        if proto is None:
            raise ProtocolUnavailable(
                f"{library} does not embed {name}: this jaxlib has no usable IFRT proxy protocol"
            )
        for dependency in proto.dependency:
            add(dependency)
        pool.Add(proto)
        added.append(name)

    if data.find(b"GrpcIfrtService") < 0:
        raise ProtocolUnavailable(
            f"{library} has no GrpcIfrtService: this jaxlib has no IFRT proxy"
        )
    add(SERVICE_FILE)
    # Programs and compile options the client sends: serialized with IFRT serdes, whose payloads
    # are protos of these files (loaded when the library has them; not every jaxlib does).
    for optional in (
        "xla/python/ifrt/ir/ifrt_ir_program.proto",
        "xla/pjrt/proto/compile_options.proto",
        "xla/python/ifrt/sharding_serdes.proto",
        "xla/python/ifrt/layout_serdes.proto",
        "xla/python/ifrt/custom_call_program.proto",
        "xla/python/pjrt_ifrt/xla_compiler.proto",
        "xla/python/pjrt_ifrt/xla_sharding.proto",
        "xla/python/pjrt_ifrt/pjrt_layout_serdes.proto",
        "xla/python/pjrt_ifrt/executable_metadata.proto",
        "xla/python/ifrt/ir/sharding_param.proto",
    ):
        try:
            add(optional)
        except ProtocolUnavailable:
            continue
    data.close()
    return Protocol(pool=pool, library=str(library), files=tuple(added))
