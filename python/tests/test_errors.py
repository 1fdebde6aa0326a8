"""Bad input, dead peers and a missing GPU: clear Python exceptions, never a crash or a
hang."""

from __future__ import annotations

import os
import signal
import threading

import pytest

import ferrylink

from conftest import TIMEOUT_MS


def test_wrong_frame_types_are_type_errors(echo_ep):
    with pytest.raises(TypeError, match="frame 0: a frame must be device memory"):
        echo_ep.send(b"", [42])
    with pytest.raises(TypeError, match="frame 1: .* not str"):
        echo_ep.send(b"", [b"fine", "text is not bytes"])
    with pytest.raises(TypeError, match="a list of frames"):
        echo_ep.send(b"", b"a bare buffer")
    with pytest.raises(TypeError, match="header must be bytes-like"):
        echo_ep.send(12, [])
    with pytest.raises(TypeError):
        echo_ep.send(b"", 5)
    # The endpoint still works after each refusal.
    echo_ep.send(b"after", [b"x"])
    assert echo_ep.recv().header == b"after"


def test_read_only_and_non_contiguous_targets_are_frame_errors(echo_ep):
    with pytest.raises(ferrylink.FrameError, match="frame 0"):
        echo_ep.recv_into([b"read-only bytes"])
    np = pytest.importorskip("numpy")
    strided = np.arange(100, dtype=np.int32)[::2]
    with pytest.raises(ferrylink.FrameError, match="contiguous"):
        echo_ep.send(b"", [strided])
    with pytest.raises(ferrylink.FrameError):
        echo_ep.recv_into([np.zeros(4).view()[::-1]])


def test_dlpack_only_host_objects_are_read_through_the_capsule(echo_ep):
    np = pytest.importorskip("numpy")

    class OnlyDLPack:
        """Host memory offered through DLPack alone (as a CPU torch tensor is)."""

        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__()

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    a = np.arange(256, dtype=np.uint16).reshape(16, 16)
    echo_ep.send(b"dlpack", [OnlyDLPack(a)])
    _, (back,) = echo_ep.recv()
    assert np.array_equal(np.frombuffer(back, dtype=np.uint16).reshape(16, 16), a)
    with pytest.raises(ferrylink.FrameError, match="not contiguous"):
        echo_ep.send(b"", [OnlyDLPack(a[:, ::2])])


def test_device_frames_without_a_gpu_are_unsupported(echo_ep):
    if ferrylink.device_count() > 0:
        pytest.skip("this process sees a GPU (the GPU tests cover device frames)")

    class FakeDeviceArray:
        __cuda_array_interface__ = {"shape": (16,), "typestr": "|u1", "data": (0xDEAD000, False), "version": 3}

    with pytest.raises(ferrylink.UnsupportedError, match="CUDA device"):
        echo_ep.send(b"", [FakeDeviceArray()])
    with pytest.raises(ferrylink.UnsupportedError):
        ferrylink.alloc_device(1024)


def test_bad_settings_name_the_variable():
    with pytest.raises(ferrylink.ConfigError, match="FERRYLINK_TRANSPORT") as raised:
        ferrylink.Context(transport="carrier-pigeon")
    assert isinstance(raised.value, ValueError)
    with pytest.raises(ferrylink.ConfigError, match="FERRYLINK_TIMEOUT_MS"):
        ferrylink.Context(timeout_ms=0)
    with pytest.raises(TypeError, match='unknown setting "speed".*transport'):
        ferrylink.Context(speed="fast")
    with pytest.raises(TypeError, match="takes a str, int, bool or path"):
        ferrylink.Context(timeout_ms=1.5)


def test_a_bad_variable_in_the_environment_is_a_config_error(monkeypatch):
    monkeypatch.setenv("FERRYLINK_DEVICE_COPIES", "everyone")
    with pytest.raises(ferrylink.ConfigError, match="FERRYLINK_DEVICE_COPIES"):
        ferrylink.Context()


def test_connecting_to_nobody_is_a_connect_error(ctx, tmp_path):
    with pytest.raises(ferrylink.ConnectError, match="cannot connect") as raised:
        ctx.connect(tmp_path / "nobody.sock")
    assert isinstance(raised.value, ConnectionError)


def test_waits_end_with_timed_out_errors():
    with ferrylink.Context(timeout_ms=300) as c:
        listener = c.listen()
        with pytest.raises(ferrylink.TimedOutError) as raised:
            listener.accept()
        assert isinstance(raised.value, TimeoutError)
        a = c.connect(listener.path)
        with pytest.raises(ferrylink.TimedOutError, match="timed out"):
            a.recv()
        b = listener.accept()
        b.send(b"later", [])
        assert a.recv().header == b"later", "the timed-out receive lost nothing"


def test_a_closed_endpoint_refuses_and_its_peer_sees_it_closed(ctx):
    listener = ctx.listen()
    a = ctx.connect(listener.path)
    b = listener.accept()
    a.close()
    a.close()
    assert a.closed
    with pytest.raises(ferrylink.EndpointClosedError):
        a.send(b"", [])
    with pytest.raises(ferrylink.EndpointClosedError):
        a.lane
    with pytest.raises((ferrylink.PeerClosedError, ferrylink.PeerFailedError)):
        b.recv()


def test_a_killed_peer_fails_pending_and_later_requests(ctx, spawn):
    peer = spawn("listen-hold")
    ep = ctx.connect(peer.line())
    assert peer.line() == "accepted"
    failures = []

    def receive():
        try:
            ep.recv()
        except ferrylink.FerrylinkError as e:
            failures.append(e)

    waiting = threading.Thread(target=receive)
    waiting.start()
    os.kill(peer.proc.pid, signal.SIGKILL)
    waiting.join(timeout=TIMEOUT_MS / 1000 + 10)
    assert not waiting.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], ConnectionError), failures
    assert "peer" in str(failures[0])
    with pytest.raises(ConnectionError):
        ep.send(b"to the dead", [b"x" * 100_000])
    with pytest.raises(ConnectionError):
        ep.recv()


def test_a_finished_op_cannot_be_waited_for_twice(echo_ep):
    op = echo_ep._ep.send_op(b"op", [])
    assert op.wait() is None
    assert op.finished
    with pytest.raises(ferrylink.FerrylinkError, match="already waited for"):
        op.wait()
    echo_ep.recv()


def test_a_process_leaving_requests_in_flight_exits_cleanly(ctx, spawn):
    listener = ctx.listen()
    peer = spawn("exit-in-flight", listener.path)
    ep = listener.accept()
    assert peer.line() == "leaving"
    assert peer.wait() == 0
    with pytest.raises((ferrylink.PeerClosedError, ferrylink.PeerFailedError)):
        while True:  # the big message may or may not have made it before the exit
            ep.recv()
