"""Host memory between two processes: both directions, sizes, receive targets, counters."""

from __future__ import annotations

import array
import hashlib
import subprocess
import sys

import pytest

import ferrylink

from conftest import TIMEOUT_MS, Peer, no_ucx_here


def pattern(n: int, seed: int = 1) -> bytearray:
    """n bytes that differ from position to position and from seed to seed."""
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest() * 64
    whole, rest = divmod(n, len(block))
    return bytearray(block * whole + block[:rest])


def test_frames_of_every_host_kind_come_back_equal(echo_ep):
    frames = [b"bytes", bytearray(b"bytearray"), memoryview(b"memoryview"), array.array("i", [1, 2, 3])]
    echo_ep.send(b"header", frames)
    header, back = echo_ep.recv()
    assert header == b"header"
    assert [bytes(f) for f in back] == [b"bytes", b"bytearray", b"memoryview", array.array("i", [1, 2, 3]).tobytes()]
    assert all(isinstance(f, memoryview) and not f.readonly and f.format == "B" for f in back)


def test_numpy_arrays_go_as_their_bytes(echo_ep):
    np = pytest.importorskip("numpy")
    a = np.arange(1000, dtype=np.float64).reshape(10, 100)
    echo_ep.send(b"", [a, np.zeros(0, dtype=np.int8)])
    _, (back, empty) = echo_ep.recv()
    assert np.array_equal(np.frombuffer(back, dtype=np.float64).reshape(10, 100), a)
    assert len(empty) == 0


def test_the_listening_side_sends_first(ctx, spawn):
    listener = ctx.listen()
    peer = spawn("connect-echo", listener.path)
    ep = listener.accept()
    ep.send(b"from the listener", [pattern(100_000)])
    header, (frame,) = ep.recv()
    assert header == b"from the listener" and frame == pattern(100_000)
    ep.send(b"stop", [])
    ep.recv()
    assert peer.wait() == 0


def test_many_messages_arrive_in_order(ctx, spawn):
    listener = ctx.listen()
    spawn("connect-send", listener.path, "200")
    ep = listener.accept()
    for i in range(200):
        header, (frame,) = ep.recv()
        assert header == str(i).encode() and int.from_bytes(frame, "little") == i
    ep.send(b"bye", [])


@pytest.mark.parametrize("size", [64 << 20, (64 << 20) + 3])
def test_large_frames_come_back_whole(echo_ep, size):
    data = pattern(size, seed=size)
    echo_ep.send(b"large", [data, pattern(4096, seed=2)])
    _, (back, small) = echo_ep.recv()
    assert len(back) == size
    assert hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
    assert small == pattern(4096, seed=2)


def test_empty_header_frames_and_messages(echo_ep):
    echo_ep.send()
    assert echo_ep.recv() == (b"", [])
    echo_ep.send(b"", [b"", bytearray(), memoryview(b"")])
    header, frames = echo_ep.recv()
    assert header == b"" and [len(f) for f in frames] == [0, 0, 0]


def test_recv_into_fills_the_given_buffers(echo_ep):
    data = pattern(1 << 20)
    echo_ep.send(b"into", [data, b"tail"])
    targets = [bytearray(1 << 20), bytearray(4)]
    header, frames = echo_ep.recv_into(targets)
    assert header == b"into"
    assert frames[0] is targets[0] and frames[1] is targets[1]
    assert targets[0] == data and targets[1] == b"tail"


def test_recv_into_a_mismatch_raises_and_keeps_the_message(echo_ep):
    echo_ep.send(b"sized", [b"12345678"])
    with pytest.raises(ferrylink.BufferMismatchError) as raised:
        echo_ep.recv_into([bytearray(3)])
    assert "do not fit" in str(raised.value)
    header, (frame,) = echo_ep.recv()
    assert header == b"sized" and frame == b"12345678"


def test_a_received_frame_can_be_sent_on(echo_ep):
    echo_ep.send(b"one", [pattern(50_000)])
    _, frames = echo_ep.recv()
    echo_ep.send(b"two", frames)
    assert echo_ep.recv().frames[0] == pattern(50_000)


def test_sending_leaves_the_frames_unchanged_and_resizable(echo_ep):
    buf = bytearray(b"abc" * 1000)
    echo_ep.send(b"", [buf])
    echo_ep.recv()
    buf.extend(b"more")  # no buffer export is left behind
    assert buf.endswith(b"more")


def test_counters_and_settings(echo_ep, ctx):
    before = echo_ep.stats()
    echo_ep.send(b"count", [b"x" * 1000])
    echo_ep.recv()
    after = echo_ep.stats()
    assert after["messages_sent"] == before["messages_sent"] + 1
    assert after["messages_received"] == before["messages_received"] + 1
    assert after["payload_bytes_sent"] - before["payload_bytes_sent"] == 1000
    assert after["bounced_bytes"] == 0
    assert echo_ep.lane == "native" and echo_ep.uses_control_ring
    assert "pid" in echo_ep.peer
    assert ctx.settings["timeout_ms"] == str(TIMEOUT_MS)
    assert ctx.stats()["endpoints"] == 1
    # The lingering copy kernel is opt-in (linger_us=...) and serves device copies only.
    assert ctx.stats()["lingering_copies"] == ctx.stats()["lingering_kernel_launches"] == 0
    # Host messages push nothing into device offers.
    assert ctx.stats()["signalled_pushes"] == 0
    assert ctx.settings["linger_us"] == "0"


def test_settings_come_from_keywords_over_the_environment(monkeypatch):
    monkeypatch.setenv("FERRYLINK_BUSY_POLL_US", "123")
    # disable_cuda=False: a bool setting without a process-wide effect (True would turn
    # CUDA off for the whole test process on the GPU machine).
    with ferrylink.Context(transport="native", push_offer_max_bytes=0, disable_cuda=False) as c:
        assert c.settings["transport"] == "native"
        assert c.settings["busy_poll_us"] == "123"
        assert c.settings["push_offer_max_bytes"] == "0"
        assert c.settings["disable_cuda"] == "0"
    keys = ferrylink.config_keys()
    assert keys["transport"] == ("FERRYLINK_TRANSPORT", "auto", "auto, native or ucx")
    assert set(keys) == set(ferrylink.Context(timeout_ms=TIMEOUT_MS).settings)


def test_the_ucx_lane_carries_host_frames(spawn):
    env = {"FERRYLINK_TRANSPORT": "ucx"}
    try:
        ctx = ferrylink.Context(transport="ucx", timeout_ms=TIMEOUT_MS)
    except ferrylink.ContextError as e:
        no_ucx_here(e, f"UCX is not usable here: {e}")
    peer = spawn("listen-echo", env=env)
    ep = ctx.connect(peer.line())
    assert peer.line() == "ucx" and ep.lane == "ucx"
    data = pattern(3 << 20)
    ep.send(b"over ucx", [data, b"small"])
    header, (back, small) = ep.recv()
    assert header == b"over ucx" and back == data and small == b"small"
    ep.send(b"stop", [])
    ep.recv()
    ep.close()
    ctx.close()


def test_shared_host_memory_is_sent_without_a_copy(ctx):
    """host_buffer() views, NumPy arrays over them, slices of them and received host
    frames lie in memfd regions: the native lane passes the fd once and copies nothing
    (staged_bytes stays 0), where a bytearray is copied into staging."""
    np = pytest.importorskip("numpy")
    listener = ctx.listen()
    b = ctx.connect(listener.path)
    a = listener.accept()
    buf = ferrylink.host_buffer(1 << 20)
    buf[:] = pattern(1 << 20, seed=5)
    b.send(b"view", [buf, np.frombuffer(buf, dtype=np.uint32), buf[100:200]])
    _, (whole, as_u32, part) = a.recv()
    assert whole == buf and as_u32 == buf and part == buf[100:200]
    a.send(b"echo", [whole, part])  # received frames go on without a copy too
    _, (echoed, echoed_part) = b.recv()
    assert echoed == buf and echoed_part == buf[100:200]
    assert b.stats()["staged_bytes"] == 0 and a.stats()["staged_bytes"] == 0
    b.send(b"copied", [bytearray(buf)])
    a.recv()
    assert b.stats()["staged_bytes"] == 1 << 20


def test_received_host_frames_stay_intact_while_referenced(ctx):
    listener = ctx.listen()
    b = ctx.connect(listener.path)
    a = listener.accept()
    b.send(b"keep", [pattern(300_000, seed=9)])
    _, (kept,) = a.recv()
    for i in range(50):
        b.send(b"more", [pattern(300_000, seed=100 + i)])
        a.recv()
    assert kept == pattern(300_000, seed=9)
    kept[:4] = b"mine"  # writable, and the memory is this frame's alone
    assert kept[:4] == b"mine"


@pytest.mark.parametrize("size", [1, 4096, 4097, 70_000])
def test_received_frames_of_every_size_are_writable_views_of_their_own(ctx, size):
    """Small frames come as views over a copy, larger ones over the frame's own memory:
    the same writable, 1-D byte views either way, unaffected by later messages."""
    listener = ctx.listen()
    b = ctx.connect(listener.path)
    a = listener.accept()
    b.send(b"first", [pattern(size, seed=3), pattern(size, seed=4)])
    _, frames = a.recv()
    b.send(b"second", [pattern(size, seed=5), pattern(size, seed=6)])
    _, later = a.recv()
    for frame, seed in zip(frames + later, (3, 4, 5, 6)):
        assert isinstance(frame, memoryview) and not frame.readonly and frame.format == "B" and frame.ndim == 1
        assert frame == pattern(size, seed=seed)
    frames[0][:1] = b"\xff"
    assert frames[0][:1] == b"\xff" and frames[1] == pattern(size, seed=4) and later[0] == pattern(size, seed=5)
    a.send(b"on", frames)  # sent on as any host frame
    _, back = b.recv()
    assert back[1] == pattern(size, seed=4) and back[0][:1] == b"\xff"


def test_rust_log_prints_the_transports_logs():
    script = (
        "import ferrylink\n"
        "c = ferrylink.Context()\n"
        "l = c.listen()\n"
        "a = c.connect(l.path)\n"
        "b = l.accept()\n"
        "a.send(b'x', [])\n"
        "b.recv()\n"
    )
    env = Peer.child_env({"RUST_LOG": "ferrylink_transport=trace"})
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "send called" in out.stderr
    env.pop("RUST_LOG")
    quiet = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert quiet.returncode == 0 and "send called" not in quiet.stderr


def test_tcp_listeners_bootstrap_the_ucx_lane(spawn):
    """Peers on other machines meet over TCP (here on loopback): the data goes over UCX."""
    try:
        ctx = ferrylink.Context(timeout_ms=TIMEOUT_MS)
        listener = ctx.listen_tcp(0, "127.0.0.1")
    except ferrylink.FerrylinkError as e:
        pytest.fail(f"a TCP listener: {e}")
    host, port = listener.tcp_address
    assert host == "127.0.0.1" and port > 0 and listener.path == ""
    spawn("connect-echo", f"tcp:{host}:{port}")
    try:
        ep = listener.accept()
    except ferrylink.TimedOutError as e:
        no_ucx_here(e, "the peer could not connect over TCP (no UCX here?)")
    assert ep.lane == "ucx"
    ep.send(b"over tcp", [pattern(2 << 20), b"tail"])
    header, (back, tail) = ep.recv()
    assert header == b"over tcp" and back == pattern(2 << 20) and tail == b"tail"
    ep.send(b"stop", [])
    ep.recv()
    with pytest.raises(ferrylink.ConnectError):
        ctx.connect_tcp("127.0.0.1", 1)
