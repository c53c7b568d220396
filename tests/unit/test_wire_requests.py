"""Requests that do not parse as their method's type are named, not raised, by the servers'
deserializers (the gRPC garbage tests in tests/integration/test_hostile_input.py run them in
real servers)."""

from __future__ import annotations

import pytest

from pathways_core.wire import EXECUTOR, pb
from pathways_core.wire.requests import Malformed, MalformedRequest, checked, parser, refusal

INFO = next(m for m in EXECUTOR.methods if m.name == "Info")
PUT = next(m for m in EXECUTOR.methods if m.name == "PutArray")


def test_a_request_that_parses_is_passed_on() -> None:
    chunk = pb.ArrayChunk(buffer_id="b", dtype="float32")
    parsed = parser(pb.ArrayChunk)(chunk.SerializeToString())
    assert parsed == chunk
    assert refusal(parsed, PUT) is None


def test_garbage_is_refused_naming_the_message_type_and_the_method() -> None:
    garbage = parser(pb.Empty)(b"\xff")
    assert isinstance(garbage, Malformed)
    problem = refusal(garbage, INFO)
    assert problem is not None
    assert problem.startswith("malformed pathways.v1.Empty request to Info: DecodeError")


def test_a_request_stream_stops_at_its_first_malformed_request() -> None:
    parse = parser(pb.ArrayChunk)
    good = pb.ArrayChunk(buffer_id="b").SerializeToString()
    stream = checked([parse(good), parse(b"\xff"), parse(good)], PUT)
    assert next(stream).buffer_id == "b"
    with pytest.raises(
        MalformedRequest, match=r"malformed pathways\.v1\.ArrayChunk request to PutArray: "
    ):
        next(stream)
