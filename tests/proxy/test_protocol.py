"""The IFRT proxy protocol is read out of the installed jaxlib, or refused clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from pathways_client.proxy import protocol


def test_protocol_comes_from_the_installed_jaxlib() -> None:
    p = protocol.load()
    assert p.library.endswith(".so")
    assert protocol.SERVICE_FILE in p.files
    methods = set(p.service.methods_by_name)
    assert {"GetVersion", "IfrtSession", "HostBufferStore", "HostBufferLookup"} <= methods
    request_kinds = {f.name for f in p.IfrtRequest.DESCRIPTOR.oneofs_by_name["request"].fields}
    assert {"init_request", "compile_request", "loaded_executable_execute_request"} <= request_kinds
    # Messages round-trip through their wire form.
    message = p.GrpcGetVersionRequest()
    message.min_version.protocol_version = 16
    assert p.GrpcGetVersionRequest.FromString(message.SerializeToString()) == message
    assert protocol.load() is p  # read once per process


def test_a_library_without_the_protocol_is_a_clear_error(tmp_path: Path) -> None:
    plain = tmp_path / "libplain.so"
    plain.write_bytes(b"\x7fELF" + b"\0" * 64)
    with pytest.raises(protocol.ProtocolUnavailable, match="no GrpcIfrtService"):
        protocol.load(str(plain))
    # The service's name without its descriptors: the missing file is named.
    partial = tmp_path / "libpartial.so"
    partial.write_bytes(b"\0GrpcIfrtService\0" * 4)
    with pytest.raises(protocol.ProtocolUnavailable, match=r"grpc_ifrt_service\.proto"):
        protocol.load(str(partial))
    with pytest.raises(protocol.ProtocolUnavailable, match="cannot read"):
        protocol.load(str(tmp_path / "missing.so"))


def test_a_descriptor_ends_where_the_next_record_begins() -> None:
    def file(name: str, message: str) -> bytes:
        proto = descriptor_pb2.FileDescriptorProto(name=name, package="t", syntax="proto3")
        proto.message_type.add(name=message).field.add(
            name="x", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32
        )
        return proto.SerializeToString()

    # Two descriptors back to back (as a linker may lay them out), with bytes around them.
    data = b"\x01\x02junk" + file("a/first.proto", "A") + file("a/second.proto", "B") + b"\0\0"
    first = protocol._find_file(data, "a/first.proto")
    second = protocol._find_file(data, "a/second.proto")
    assert first is not None and second is not None
    assert [m.name for m in first.message_type] == ["A"]
    assert [m.name for m in second.message_type] == ["B"]
    assert protocol._find_file(data, "a/third.proto") is None
