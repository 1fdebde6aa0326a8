"""The ``ferrylink://`` comm backend against what Dask's comms promise.

Each test runs on a fresh event loop bounded by ``BOUND_S``; a comm that breaks a
promise fails its test instead of hanging it. Both lanes are tested where it matters:
``native`` (this host, the default) and ``ucx`` (``FERRYLINK_TRANSPORT=ucx``, UCX over
TCP loopback in CI).
"""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from unittest import mock

import pytest

pytest.importorskip("distributed")

import numpy as np  # noqa: E402
from distributed.comm import CommClosedError, connect, listen  # noqa: E402
from distributed.comm.addressing import get_address_host, get_local_address_for, resolve_address  # noqa: E402
from distributed.comm.registry import backends, get_backend  # noqa: E402
from distributed.protocol import Serialized, to_serialize  # noqa: E402

import ferrylink  # noqa: E402
from ferrylink.dask import _comm, _frames  # noqa: E402

from conftest import Peer, no_ucx_here  # noqa: E402

BOUND_S = 60.0
# How soon a closed or dead peer must be noticed; generous for a loaded 2-core machine.
PROMPT_S = 10.0


def run(coro, bound: float = BOUND_S):
    return asyncio.run(asyncio.wait_for(coro, bound))


@pytest.fixture(params=["native", "ucx"])
def lane(request, monkeypatch):
    """This process's comm context forced to a lane (a fresh context each test)."""
    context = ferrylink.Context(transport=request.param, timeout_ms=20000)
    if request.param == "ucx":
        try:
            probe = context.listen_tcp(0, "127.0.0.1")
            context.connect_tcp("127.0.0.1", probe.tcp_address[1]).close()
            probe.close()
        except ferrylink.FerrylinkError as e:
            no_ucx_here(e, f"the UCX lane is not available here: {e}")
    monkeypatch.setitem(_comm._context_state, "context", context)
    monkeypatch.setitem(_comm._context_state, "pid", os.getpid())
    yield request.param
    context.close()


async def comm_pair(address: str = "ferrylink://127.0.0.1", dial=None, **kwargs):
    """A listener and a comm to it, both ends; ``dial(listener)`` is the address the
    client connects to (default: the contact address)."""
    accepted: asyncio.Queue = asyncio.Queue()

    async def handle(comm):
        await accepted.put(comm)

    listener = await listen(address, handle, **kwargs)
    client = await connect(dial(listener) if dial else listener.contact_address, timeout=20)
    server = await asyncio.wait_for(accepted.get(), 20)
    return listener, client, server


def test_entry_point_gives_the_backend(monkeypatch):
    points = importlib.metadata.entry_points(group="distributed.comm.backends", name="ferrylink")
    assert [p.value for p in points] == ["ferrylink.dask._comm:FerrylinkBackend"]
    monkeypatch.delitem(backends, "ferrylink", raising=False)
    assert isinstance(get_backend("ferrylink"), _comm.FerrylinkBackend)


def test_import_is_cheap_and_needs_no_distributed():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["distributed"] = None  # as if it were not installed
        import ferrylink.dask
        assert "distributed" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
        try:
            ferrylink.dask.FerrylinkBackend
        except ImportError:
            print("backend needs distributed")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], env=Peer.child_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "backend needs distributed"


def test_address_functions():
    assert get_address_host("ferrylink://127.0.0.1:8786") == "127.0.0.1"
    assert get_address_host("ferrylink://10.1.2.3") == "10.1.2.3"
    assert resolve_address("ferrylink://localhost:8786") == "ferrylink://127.0.0.1:8786"
    assert get_local_address_for("ferrylink://127.0.0.1:8786") == "ferrylink://127.0.0.1"
    for hostless in ("ferrylink://", "ferrylink://:8786"):
        with pytest.raises(ValueError):
            get_address_host(hostless)
        with pytest.raises(ValueError):
            resolve_address(hostless)
        with pytest.raises(ValueError):
            get_local_address_for(hostless)


def test_addresses_info_and_round_trip(lane):
    async def main():
        listener, client, server = await comm_pair()
        try:
            assert client.peer_address == listener.contact_address
            assert client.peer_address == server.local_address
            assert client.local_address == server.peer_address
            assert client.local_address != listener.contact_address
            for comm in (client, server):
                assert comm.extra_info["lane"] == lane
                assert comm.remote_info["ferrylink"]["lane"] == lane
                assert comm.local_info["address"] == comm.local_address
                assert "pickle-protocol" in comm.handshake_options
                assert comm.same_host
            array = np.arange(1 << 20, dtype=np.int64)
            message = {"op": "ping", "blob": os.urandom(3 << 20), "empty": b"", "array": to_serialize(array)}
            await client.write(message)
            got = await server.read()
            await server.write(got)
            back = await client.read()
            assert back["blob"] == message["blob"] and back["empty"] == b""
            np.testing.assert_array_equal(back["array"], array)
            assert "closed" not in repr(client)
        finally:
            listener.stop()
            client.abort()
            server.abort()
        assert "closed" in repr(client)

    run(main())


def test_addresses_match_when_dialled_by_another_name(lane):
    def by_name(listener):
        return "ferrylink://localhost:%d" % listener.get_host_port()[1]

    async def main():
        listener, client, server = await comm_pair(dial=by_name)
        assert client.peer_address == by_name(listener) != listener.contact_address
        assert client.peer_address == server.local_address
        assert client.local_address == server.peer_address
        listener.stop()
        client.abort()
        server.abort()

    run(main())


def test_write_returns_while_the_peer_does_not_read(lane):
    async def main():
        listener, client, server = await comm_pair()
        blobs = [os.urandom(8 << 20) for _ in range(3)]
        for blob in blobs:
            # The peer reads nothing until all three went.
            await asyncio.wait_for(client.write({"blob": blob}), 20)
        for blob in blobs:
            assert (await server.read())["blob"] == blob
        listener.stop()
        client.abort()
        server.abort()

    run(main())


def test_read_waits_past_the_transport_timeout(monkeypatch):
    context = ferrylink.Context(timeout_ms=300)
    monkeypatch.setitem(_comm._context_state, "context", context)
    monkeypatch.setitem(_comm._context_state, "pid", os.getpid())

    async def main():
        listener, client, server = await comm_pair()
        read = asyncio.ensure_future(server.read())
        await asyncio.sleep(1.5)  # five timeouts of the transport's
        assert not read.done()
        await client.write("late")
        assert await asyncio.wait_for(read, 20) == "late"
        listener.stop()
        client.abort()
        server.abort()

    run(main())


@pytest.mark.parametrize("closer", ["client", "server"])
@pytest.mark.parametrize("how", ["close", "abort"])
def test_a_closed_comm_fails_both_sides(lane, closer, how):
    async def main():
        listener, client, server = await comm_pair()
        this, other = (client, server) if closer == "client" else (server, client)
        this_read = asyncio.ensure_future(this.read())
        other_read = asyncio.ensure_future(other.read())
        await asyncio.sleep(0.05)
        if how == "close":
            await this.close()
        else:
            this.abort()
        assert this.closed()
        for pending in (this_read, other_read):
            with pytest.raises(CommClosedError):
                await asyncio.wait_for(pending, PROMPT_S)
        assert other.closed()
        for comm in (this, other):
            with pytest.raises(CommClosedError):
                await comm.read()
            with pytest.raises(CommClosedError):
                await comm.write({})
        listener.stop()

    run(main())


DEAD_PEER = """
import asyncio, sys
from distributed.comm import connect
async def main():
    comm = await connect(sys.argv[1], timeout=30)
    await comm.write("connected")
    print("connected", flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


def test_a_dead_peer_fails_the_comm(tmp_path):
    script = tmp_path / "peer.py"
    script.write_text(DEAD_PEER)

    async def main():
        accepted: asyncio.Queue = asyncio.Queue()

        async def handle(comm):
            await accepted.put(comm)

        listener = await listen("ferrylink://127.0.0.1", handle)
        peer = subprocess.Popen(
            [sys.executable, str(script), listener.contact_address], env=Peer.child_env(), stdout=subprocess.PIPE
        )
        try:
            server = await asyncio.wait_for(accepted.get(), 30)
            assert await asyncio.wait_for(server.read(), 30) == "connected"
            read = asyncio.ensure_future(server.read())
            await asyncio.sleep(0.1)
            peer.send_signal(signal.SIGKILL)
            start = time.monotonic()
            with pytest.raises(CommClosedError):
                await asyncio.wait_for(read, PROMPT_S)
            assert time.monotonic() - start < PROMPT_S
        finally:
            peer.kill()
            peer.wait(30)
            listener.stop()

    run(main())


def test_a_dropped_comm_frees_its_connection(lane):
    async def main():
        listener, client, server = await comm_pair()
        context = _comm.process_context()
        endpoints = context.stats()["endpoints"]
        read = asyncio.ensure_future(server.read())
        await asyncio.sleep(0.05)
        del client  # never closed
        gc.collect()
        with pytest.raises(CommClosedError):
            await asyncio.wait_for(read, PROMPT_S)
        deadline = time.monotonic() + PROMPT_S
        while context.stats()["endpoints"] > endpoints - 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert context.stats()["endpoints"] <= endpoints - 1
        server.abort()
        listener.stop()

    run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connect_where_nothing_listens_honours_the_timeout():
    async def main():
        start = time.monotonic()
        with pytest.raises(OSError):
            await connect(f"ferrylink://127.0.0.1:{free_port()}", timeout=0.5)
        elapsed = time.monotonic() - start
        assert 0.4 <= elapsed < 5, elapsed

    run(main())


def test_many_listeners_and_comms_at_once(lane):
    async def echo(comm):
        try:
            for _ in range(3):
                await comm.write(await comm.read())
        finally:
            await comm.close()

    async def main():
        listeners = [await listen("ferrylink://127.0.0.1", echo) for _ in range(20)]
        assert len({l.listen_address for l in listeners}) == 20
        assert len({l.contact_address for l in listeners}) == 20

        async def client(key: int) -> int:
            comm = await connect(listeners[key % 4].contact_address, timeout=30)
            try:
                for round_ in range(3):
                    await comm.write({"key": key, "round": round_})
                    assert await comm.read() == {"key": key, "round": round_}
                with pytest.raises(CommClosedError):
                    await asyncio.wait_for(comm.read(), PROMPT_S)
            finally:
                await comm.close()
            return key

        assert sorted(await asyncio.gather(*(client(k) for k in range(40)))) == list(range(40))
        for listener in listeners:
            listener.stop()

    run(main())


def test_a_message_over_the_transports_frame_limit_is_carried(lane):
    async def main():
        listener, client, server = await comm_pair()
        arrays = [np.full(3, i, dtype=np.int32) for i in range(5000)]
        sent_before = client._ep.stats()["messages_sent"]
        await client.write({"arrays": [to_serialize(a) for a in arrays]})
        got = await server.read()
        # More frames than one ferrylink message takes (4096) went in several.
        assert client._ep.stats()["messages_sent"] - sent_before >= 5
        assert len(got["arrays"]) == 5000
        for a, b in zip(arrays, got["arrays"]):
            np.testing.assert_array_equal(a, b)
        listener.stop()
        client.abort()
        server.abort()

    run(main())


def test_deserialize_false_gives_serialized_objects():
    async def main():
        listener, client, server = await comm_pair(deserialize=False)
        await client.write({"x": to_serialize(123)})
        got = await server.read()
        assert isinstance(got["x"], Serialized)
        listener.stop()
        client.abort()
        server.abort()

    run(main())


def test_part_headers_round_trip_and_refuse_garbage():
    header = _frames.pack_part_header(b"hdhd", [10, 1 << 40], True)
    assert _frames.unpack_part_header(header) == (b"hdhd", [10, 1 << 40], True)
    bad = [b"", header[:-1], bytes([9]) + header[1:], header[:6] + b"x" + header[7:]]
    for garbage in bad:
        with pytest.raises(_frames.FramingError):
            _frames.unpack_part_header(garbage)
    frames = [b"a", b"b", b"c"]
    (part,) = _frames.split_parts(frames, memoryview)
    assert _frames.merge_part(b"hhh", part.host, None) == part.host
    with pytest.raises(_frames.FramingError):
        _frames.merge_part(b"hhd", part.host, None)


def test_a_large_frame_travels_whole_and_is_not_copied_to_join_shards(lane):
    """distributed shards frames over its shard size (64 MiB; 1 MiB here) for sockets and
    joins shards that arrive as separate buffers by copying the whole frame: the comm
    sends a frame whole, so the receiver has nothing to join."""
    from distributed.protocol import utils as protocol_utils

    async def main():
        listener, client, server = await comm_pair()
        sent = np.arange(3 * (1 << 20), dtype=np.uint8)

        def no_copy(buffers):
            raise AssertionError(f"{len(buffers)} shards joined by a copy")

        with mock.patch.object(protocol_utils, "BIG_BYTES_SHARD_SIZE", 1 << 20), mock.patch(
            "distributed.protocol.serialize.host_array_from_buffers", no_copy
        ):
            await client.write({"x": to_serialize(sent)})
            got = await server.read()
        np.testing.assert_array_equal(got["x"], sent)
        listener.stop()
        client.abort()
        server.abort()

    run(main())


def test_a_written_object_is_let_go_once_the_answer_is_read(lane):
    """A write keeps its frames only while the send is under way: once the peer's answer
    is read, the object written is no longer held by the comm."""
    import weakref

    async def main():
        listener, client, server = await comm_pair()
        payload = np.arange(1 << 20, dtype=np.uint8)
        held = weakref.ref(payload)
        await client.write({"x": to_serialize(payload)})
        del payload
        got = await server.read()
        del got
        await server.write("answer")
        assert await client.read() == "answer"
        gc.collect()
        assert held() is None
        listener.stop()
        client.abort()
        server.abort()

    run(main())


def test_close_delivers_what_was_written(lane):
    async def main():
        listener, client, server = await comm_pair()
        payload = np.arange(1 << 22, dtype=np.uint8)
        await client.write({"x": to_serialize(payload)})
        await client.close()
        got = await server.read()
        np.testing.assert_array_equal(got["x"], payload)
        with pytest.raises(CommClosedError):
            await server.read()
        listener.stop()
        server.abort()

    run(main())


def test_the_benchmark_runs_and_checks_its_echoes():
    out = subprocess.run(
        [sys.executable, "-m", "ferrylink.benchmarks.dask_comm", "--schemes", "ferrylink,tcp", "--sizes", "8B,1MB"]
        + ["--objects", "host", "--iters", "3", "--warmup", "1", "--json"],
        env=Peer.child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    import json

    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [(r["scheme"], r["bytes"]) for r in rows] == [
        ("ferrylink", 8),
        ("ferrylink", 1000000),
        ("tcp", 8),
        ("tcp", 1000000),
    ]
    assert all(r["checked"] and r["iters"] == 3 and r["api_median_s"] > 0 for r in rows)
    # The floor: the Python API's round trip plus Dask's serialization at both ends.
    assert all(r["serialize_s"] > 0 and r["floor_s"] == r["api_median_s"] + r["serialize_s"] for r in rows)


def test_the_benchmarks_rmm_pool_reaches_both_processes(tmp_path):
    """``--rmm-pool`` makes the client and its server each allocate from an RMM pool (a
    stand-in ``rmm`` module records the calls)."""
    calls = tmp_path / "calls"
    (tmp_path / "rmm.py").write_text(
        "import os\n"
        "def reinitialize(**kwargs):\n"
        f"    with open({str(calls)!r}, 'a') as f:\n"
        "        f.write(f\"{os.getpid()} {kwargs['pool_allocator']} {kwargs['initial_pool_size']}\\n\")\n"
    )
    env = Peer.child_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-m", "ferrylink.benchmarks.dask_comm", "--schemes", "ferrylink", "--sizes", "8B"]
        + ["--objects", "host", "--iters", "2", "--warmup", "0", "--json", "--rmm-pool", "2MB"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = calls.read_text().split("\n")[:-1]
    assert len({line.split()[0] for line in lines}) == 2, lines
    assert all(line.split()[1:] == ["True", "2000000"] for line in lines), lines


def test_the_benchmark_reads_its_servers_addresses_past_library_output():
    """A library that prints on the server's stdout (UCX's log, whose "[1765…]" stamp even
    parses as JSON) does not stand in for the server's addresses."""
    from ferrylink.benchmarks import dask_comm

    script = (
        "print('[1765000000.123456] [host:1:0] ucp_context.c:1 UCX WARN something', flush=True);"
        "print('{\"comm\": \"ferrylink://127.0.0.1:1\", \"api\": \"/tmp/x\"}', flush=True)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert dask_comm.server_addresses(proc, "ferrylink") == {"comm": "ferrylink://127.0.0.1:1", "api": "/tmp/x"}
    proc.wait(timeout=30)
    silent = subprocess.Popen([sys.executable, "-c", "print('[1]')"], stdout=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match="before printing its addresses"):
        dask_comm.server_addresses(silent, "ucx")
