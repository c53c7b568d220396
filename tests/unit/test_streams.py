"""Control-stream framing: messages survive any split of the byte stream; bad bytes are named."""

from __future__ import annotations

import socket
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pathways_core.wire import pb
from pathways_core.wire.streams import (
    RECEIVE_BYTES,
    FrameDecoder,
    FrameError,
    frame,
    frames,
    messages,
)


def batch(count: int) -> pb.ClientBatch:
    return pb.ClientBatch(
        messages=[
            pb.ClientMessage(
                computation=pb.Computation(id=f"c/{i}", devices=[i, i + 1], outputs=[f"c/b{i}"])
            )
            for i in range(count)
        ]
    )


@given(
    counts=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    cuts=st.lists(st.integers(1, 64), max_size=40),
)
def test_frames_split_anywhere_decode_to_the_same_messages(counts, cuts) -> None:
    sent = [batch(n) for n in counts]
    data = b"".join(frame(m) for m in sent)
    decoder = FrameDecoder(pb.ClientBatch.FromString)
    received, position = [], 0
    for cut in [*cuts, len(data)]:
        received += decoder.feed(data[position : position + cut])
        position += cut
    received += decoder.feed(data[position:])
    assert received == sent
    assert not decoder.partial


def test_messages_reads_until_the_peer_closes() -> None:
    data = frame(batch(2)) + frame(batch(0)) + frame(batch(3))
    pieces = [data[:7], data[7:30], data[30:]]
    received = list(messages(lambda _: pieces.pop(0) if pieces else b"", pb.ClientBatch.FromString))
    assert [len(m.messages) for m in received] == [2, 0, 3]


def test_frames_longer_than_a_read_arrive_whole_over_a_socket() -> None:
    """A frame several reads long, written from another thread between small ones, comes out
    intact."""
    big = pb.ClientBatch(
        messages=[
            pb.ClientMessage(function=pb.FunctionRegistration(artifact=bytes(range(256)) * 4_000))
        ]
    )
    sent = [batch(1), big, batch(3), big, batch(0)]
    reader, writer = socket.socketpair()
    with reader, writer:
        thread = threading.Thread(
            target=lambda: (writer.sendall(b"".join(frame(m) for m in sent)), writer.close())
        )
        thread.start()
        received = list(messages(reader.recv, pb.ClientBatch.FromString))
        thread.join(10)
    assert len(big.SerializeToString()) > 3 * RECEIVE_BYTES
    assert received == sent


def test_a_stream_ending_inside_a_frame_is_an_error() -> None:
    pieces = [frame(batch(2))[:-1]]
    with pytest.raises(FrameError, match="middle of a frame"):
        list(messages(lambda _: pieces.pop(0) if pieces else b"", pb.ClientBatch.FromString))


def test_oversized_and_garbled_frames_are_refused() -> None:
    with pytest.raises(FrameError, match="exceeds 100"):
        FrameDecoder(pb.ClientBatch.FromString, max_bytes=100).feed(b"\x00\x00\x10\x00")
    with pytest.raises(FrameError, match="does not parse"):
        FrameDecoder(pb.ClientBatch.FromString).feed(b"\x00\x00\x00\x03\xff\xff\xff")


@given(sizes=st.lists(st.integers(0, 300), max_size=30), cap=st.integers(320, 2000))
def test_bursts_are_split_into_frames_under_the_cap(sizes, cap) -> None:
    items = [pb.ClientEvent(message="m" * size) for size in sizes]
    data = frames(items, lambda events: pb.ClientEventBatch(events=events), max_bytes=cap)
    decoder = FrameDecoder(pb.ClientEventBatch.FromString, max_bytes=cap)
    received = decoder.feed(data)
    assert [e for batch in received for e in batch.events] == items
    assert not decoder.partial


def test_a_message_over_the_cap_on_its_own_is_refused_by_the_sender() -> None:
    with pytest.raises(FrameError, match="exceeds the frame cap of 100"):
        frames([pb.ClientEvent(message="m" * 200)], lambda e: pb.ClientEventBatch(events=e), 100)
