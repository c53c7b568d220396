"""Version negotiation, sessions and host buffers, with stock JAX and a bare client."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from proxy_harness import (
    ProxyProcess,
    connect_snippet,
    run_client,
    run_program,
    start_proxy,
    stop_proxy,
)
from raw_client import P, RawSession, get_version, method

from pathways_client.proxy.server import STORE_METADATA_KEY


def test_stock_jax_sees_the_proxy_devices(proxy: ProxyProcess) -> None:
    seen = run_program(
        proxy.address,
        "import json\n"
        "ds = jax.devices()\n"
        "print(json.dumps({'ids': [d.id for d in ds], 'kinds': [d.device_kind for d in ds],\n"
        "  'platform': ds[0].platform, 'backend': jax.default_backend(),\n"
        "  'memories': [m.kind for m in ds[0].addressable_memories()]}))\n",
    )
    assert seen["ids"] == [0, 1, 2, 3]
    assert seen["kinds"] == ["cpu"] * 4
    assert seen["platform"] == "cpu"
    assert set(seen["memories"]) == {"device", "pinned_host", "unpinned_host"}


def test_a_client_outside_our_versions_gets_a_clear_error_and_the_server_goes_on() -> None:
    # This proxy accepts only versions 16-20 of the 16-25 it implements.
    picky = start_proxy("--backend", "local", "--devices", "2", "--protocol-range", "16-20")
    try:
        with grpc.insecure_channel(picky.address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                get_version(channel, 21, 25)
            assert "[21, 25]" in str(refused.value.details())
            assert "[16, 20]" in str(refused.value.details())
            assert get_version(channel, 18, 23).version.protocol_version == 20
        # The installed jaxlib (16-25) is served at 20, the newest both speak.
        script = connect_snippet(picky.address, timeout=30) + "print(len(jax.devices()))\n"
        result = run_client(["-c", script])
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.split() == ["2"]
        assert picky.alive()
    finally:
        stop_proxy(picky)


def test_a_protocol_range_beyond_what_is_implemented_is_refused() -> None:
    """It was taken as given: a proxy told 30-40 served versions it does not speak."""
    result = run_client(
        ["-m", "pathways_client", "proxy", "--backend", "local", "--protocol-range", "30-40"]
    )
    assert result.returncode == 2
    assert "30-40 is not within the versions the Pathways proxy implements, 16-25" in (
        result.stderr
    )


def test_one_session_too_many_is_refused_at_once_and_the_others_go_on() -> None:
    """The 65th session waited, silently, for a worker of a pool of 64 held by the others."""
    small = start_proxy("--backend", "local", "--devices", "2", "--max-sessions", "2")
    try:
        with grpc.insecure_channel(small.address) as channel:
            first, second = RawSession(channel), RawSession(channel)
            assert first.init().session_id and second.init().session_id
            third = RawSession(channel)
            with pytest.raises(AssertionError, match="serves at most 2 sessions at once"):
                third.call("init_request", timeout=10)
            assert third.error is not None
            assert third.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-sessions" in third.error.details()
            assert first.call("init_request").init_response.session_id  # still served
            second.close()
            deadline = time.monotonic() + 10
            while True:  # its end is seen by the proxy shortly after the stream closes
                fourth = RawSession(channel)
                try:
                    assert fourth.init().session_id
                    break
                except AssertionError:
                    assert time.monotonic() < deadline, "the closed session's place stayed taken"
                    time.sleep(0.1)
            first.close()
            fourth.close()
        assert small.alive()
    finally:
        stop_proxy(small)


def test_uploads_stalled_by_one_client_keep_no_other_waiting() -> None:
    """A client stopped mid-upload (a debugger, a suspended laptop, a slow link) left calls
    waiting for their next chunk: each held a worker thread, and with every worker held the
    proxy answered no one (another session's Init, even a GetVersion) until they ended."""
    small = start_proxy("--backend", "local", "--devices", "2", "--max-sessions", "4")
    stalled = threading.Event()
    try:
        with (
            grpc.insecure_channel(small.address) as channel,
            grpc.insecure_channel(small.address) as other_channel,
        ):
            stalling = RawSession(channel)
            stalling.init()
            store = method(
                channel, "HostBufferStore", "stream_unary", "", "GrpcHostBufferStoreResponse"
            )

            def first_chunk_only():
                yield P.GrpcHostBufferStoreRequest(data=b"x" * 1024)
                stalled.wait(120)

            uploads = []
            for handle in range(64):  # far more than the threads the proxy ever had
                metadata = P.GrpcHostBufferStoreMetadata(
                    session_id=stalling.session_id, handle=handle, buffer_size=1 << 20
                )
                uploads.append(
                    store.future(
                        first_chunk_only(),
                        metadata=[(STORE_METADATA_KEY, metadata.SerializeToString())],
                    )
                )
            time.sleep(1)
            other = RawSession(other_channel)
            other.session_id = other.call("init_request", timeout=10).init_response.session_id
            assert other.session_id
            assert get_version(other_channel, 16, 25).version.protocol_version == 25
            assert other.store(7, b"data") is not None
            assert b"".join(other.lookup(7)) == b"data"
            other.close()
            stalled.set()
            for upload in uploads:  # each ends short of its size, said so
                with pytest.raises(grpc.RpcError) as failed:
                    upload.result(timeout=30)
                assert failed.value.code() == grpc.StatusCode.DATA_LOSS
            stalling.close()
        assert small.alive()
    finally:
        stalled.set()
        stop_proxy(small)


def test_version_negotiation_with_a_bare_client(proxy: ProxyProcess) -> None:
    with grpc.insecure_channel(proxy.address) as channel:
        assert get_version(channel, 16, 25).version.protocol_version == 25
        assert get_version(channel, 10, 18).version.protocol_version == 18
        assert get_version(channel, 16, 99).version.protocol_version == 25
        for low, high in [(1, 5), (40, 50)]:
            with pytest.raises(grpc.RpcError) as refused:
                get_version(channel, low, high)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"[{low}, {high}]" in refused.value.details()
        with pytest.raises(grpc.RpcError) as backwards:
            get_version(channel, 25, 16)
        assert "min_version.protocol_version 25 is above" in backwards.value.details()
        # A session must carry its negotiated version.
        bare = RawSession(channel, metadata=False)
        with pytest.raises(AssertionError, match="ifrt-session-metadata"):
            bare.call("init_request", timeout=10)
        old = RawSession(channel, version=3)
        with pytest.raises(AssertionError, match="protocol version 3"):
            old.call("init_request", timeout=10)
        assert proxy.alive()


def test_host_buffers_store_lookup_delete(proxy: ProxyProcess) -> None:
    with grpc.insecure_channel(proxy.address) as channel:
        session = RawSession(channel)
        init = session.init()
        assert [d.id for d in init.all_devices] == [0, 1, 2, 3]
        assert init.session_id > 0
        data = bytes(range(256)) * (3 * 4096 + 7)  # a little over 3 MiB
        session.store(7, data, chunk=300_000)
        chunks = session.lookup(7)
        assert b"".join(chunks) == data
        assert len(chunks) == 4 and max(len(c) for c in chunks) <= 1 << 20
        session.store(8, b"")
        assert session.lookup(8) == [b""]
        session.delete(7)
        with pytest.raises(grpc.RpcError) as gone:
            session.lookup(7)
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND
        assert "7 was deleted" in gone.value.details()
        with pytest.raises(grpc.RpcError) as short:
            session.store(9, b"abc", size=10)
        assert short.value.code() == grpc.StatusCode.DATA_LOSS
        assert "expected buffer_size 10 bytes but got 3" in short.value.details()
        with pytest.raises(grpc.RpcError) as long:
            session.store(9, b"abcdef", size=4, chunk=3)
        assert long.value.code() == grpc.StatusCode.DATA_LOSS
        assert "expected buffer_size 4 bytes but got more (6 so far)" in long.value.details()
        with pytest.raises(grpc.RpcError) as negative:
            session.store(9, b"", size=-1)
        assert negative.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "buffer_size -1 is negative" in negative.value.details()
        with pytest.raises(grpc.RpcError) as huge:
            session.store(9, b"abc", size=1 << 62)
        assert huge.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "does not fit in the proxy's memory" in huge.value.details()
        session.store(9, b"abc")  # none of the refused stores kept the handle
        assert session.lookup(9) == [b"abc"]
        with pytest.raises(grpc.RpcError) as twice:
            session.store(8, b"x")
        assert twice.value.code() == grpc.StatusCode.ALREADY_EXISTS
        # Another session's buffers are out of reach: the id (the host buffer calls' only
        # credential) is random, so the next session's is not the next number, and a guess
        # learns nothing from the error.
        other = RawSession(channel)
        second = other.init().session_id
        assert abs(second - init.session_id) > 1_000_000
        guess = RawSession(channel)
        guess.session_id = init.session_id + 1
        with pytest.raises(grpc.RpcError) as unknown:
            guess.lookup(8)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert str(guess.session_id) not in unknown.value.details()
        # Nor do the proxy's logs show an id, not even of a request that failed.
        unknown_array = P.CopyToHostBufferRequest(array_handle=999, host_buffer_handle=5)
        failed = session.call("copy_to_host_buffer_request", unknown_array)
        assert failed.response_metadata.status.code != 0
        output = "".join(proxy.lines)
        assert "copy_to_host_buffer_request (op" in output
        assert str(init.session_id) not in output and str(second) not in output
        other.close()
        session.close()
