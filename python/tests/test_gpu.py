"""Device frames with PyTorch on a GPU machine.

Each test skips without a CUDA device and torch, and fails instead when
``FERRYLINK_REQUIRE_GPU=1`` (``python/tools/run_gpu_tests.sh`` sets it).
"""

from __future__ import annotations

import asyncio
import gc

import pytest

import ferrylink

from conftest import require_gpu
from _peer import ordered_turn, ordering_tensors


@pytest.fixture
def torch():
    require_gpu()
    import torch

    return torch


def random_tensor(torch, dtype, shape):
    g = torch.Generator(device="cuda").manual_seed(sum(shape) + 7)
    if dtype == torch.bool:
        return torch.rand(shape, device="cuda", generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, device="cuda", generator=g)
    if dtype.is_floating_point:
        return torch.randn(shape, device="cuda", generator=g).to(dtype)
    return torch.randint(-1000, 1000, shape, device="cuda", generator=g).to(dtype)


def as_tensor(torch, frame, dtype, shape):
    return torch.from_dlpack(frame).view(dtype).reshape(shape)


CASES = [
    ("float32", (1000,)),
    ("float16", (3, 4, 5)),
    ("bfloat16", (7, 9)),
    ("int64", (1,)),
    ("int8", (255,)),
    ("bool", (33,)),
    ("complex64", (2, 2)),
    ("float32", (1 << 20,)),
    ("uint8", (0,)),
    ("float64", (16, 1024, 64)),
]


@pytest.mark.parametrize("dtype_name,shape", CASES)
def test_device_tensors_come_back_equal(torch, echo_ep, dtype_name, shape):
    dtype = getattr(torch, dtype_name)
    t = random_tensor(torch, dtype, shape)
    echo_ep.send(b"tensor", [t])
    header, (frame,) = echo_ep.recv()
    assert header == b"tensor"
    assert isinstance(frame, ferrylink.DeviceFrame) and frame.nbytes == t.nbytes
    assert torch.equal(as_tensor(torch, frame, dtype, shape), t)


def test_recv_into_device_tensors_and_mixed_messages(torch, echo_ep):
    t = random_tensor(torch, torch.float32, (256, 256))
    echo_ep.send(b"mixed", [t, b"host bytes", random_tensor(torch, torch.int32, (10,))])
    targets = [torch.empty_like(t), bytearray(10), torch.zeros(10, dtype=torch.int32, device="cuda")]
    header, frames = echo_ep.recv_into(targets)
    assert header == b"mixed" and frames[0] is targets[0]
    assert torch.equal(targets[0], t) and targets[1] == b"host bytes"
    assert torch.equal(targets[2], random_tensor(torch, torch.int32, (10,)))


def test_non_contiguous_tensors_are_refused(torch, echo_ep):
    t = random_tensor(torch, torch.float32, (64, 32))
    with pytest.raises(ferrylink.FrameError, match="contiguous"):
        echo_ep.send(b"", [t.t()])
    with pytest.raises(ferrylink.FrameError, match="contiguous"):
        echo_ep.recv_into([torch.empty(64, 64, device="cuda")[:, ::2]])
    echo_ep.send(b"contiguous", [t.t().contiguous()])
    _, (frame,) = echo_ep.recv()
    assert torch.equal(as_tensor(torch, frame, torch.float32, (32, 64)), t.t())


def test_received_frames_are_dlpack_and_cai_without_a_copy(torch, echo_ep):
    t = random_tensor(torch, torch.float32, (4096,))
    echo_ep.send(b"", [t])
    _, (frame,) = echo_ep.recv()
    assert frame.__dlpack_device__() == (2, t.device.index)
    viewed = torch.from_dlpack(frame)
    assert viewed.dtype == torch.uint8 and viewed.data_ptr() == frame.ptr
    cai = frame.__cuda_array_interface__
    assert cai["data"][0] == frame.ptr and cai["shape"] == (t.nbytes,) and cai["typestr"] == "|u1"
    assert torch.as_tensor(frame, device="cuda").data_ptr() == frame.ptr
    with pytest.raises(BufferError):
        frame.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError):
        frame.__dlpack__(copy=True)
    # The tensor keeps the memory alive after the frame object is gone, and writes to it
    # are the frame's: sending it on carries them.
    floats = viewed.view(torch.float32)
    del frame, viewed
    gc.collect()
    floats.mul_(2)
    echo_ep.send(b"again", [floats])
    _, (again,) = echo_ep.recv()
    assert torch.equal(as_tensor(torch, again, torch.float32, (4096,)), t * 2)


def test_dlpack_capsules_of_other_producers_are_taken(torch, echo_ep):
    t = random_tensor(torch, torch.int16, (1000,))

    class OnlyDLPack:
        def __dlpack__(self, **kwargs):
            return t.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return t.__dlpack_device__()

    class OnlyCAI:
        __cuda_array_interface__ = t.__cuda_array_interface__

    for obj in (OnlyDLPack(), OnlyCAI()):
        echo_ep.send(b"", [obj])
        _, (frame,) = echo_ep.recv()
        assert torch.equal(as_tensor(torch, frame, torch.int16, (1000,)), t)


def test_ferrylink_device_memory_round_trips(torch, echo_ep):
    frame = ferrylink.alloc_device(1 << 16)
    torch.from_dlpack(frame).fill_(42)
    torch.cuda.synchronize()
    echo_ep.send(b"", [frame])
    _, (back,) = echo_ep.recv()
    assert torch.equal(torch.from_dlpack(back), torch.full((1 << 16,), 42, dtype=torch.uint8, device="cuda"))


def test_a_tensor_produced_on_a_side_stream_is_sent_after_its_work(torch, echo_ep):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # keeps the stream busy for a while first
        t = torch.full((1 << 22,), 7.0, device="cuda")
        echo_ep.send(b"ordered", [t])
    _, (frame,) = echo_ep.recv()
    assert torch.equal(as_tensor(torch, frame, torch.float32, (1 << 22,)), torch.full_like(t, 7.0))


def test_caching_allocator_memory_is_sent_without_a_bounce(torch, echo_ep):
    before = echo_ep.stats()["bounced_bytes"]
    for n in (1 << 10, 1 << 20, 64 << 20):
        t = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(3)
        echo_ep.send(b"", [t])
        echo_ep.recv()
    assert echo_ep.stats()["bounced_bytes"] == before


@pytest.mark.parametrize("alloc_conf", ["", "expandable_segments:True"])
def test_a_torch_process_sends_without_a_bounce(torch, ctx, spawn, alloc_conf):
    """The sender is its own process so that PYTORCH_CUDA_ALLOC_CONF applies to it:
    plain caching-allocator blocks go by legacy CUDA IPC, expandable segments (VMM) by
    their chunks' fds; neither is copied."""
    listener = ctx.listen()
    peer = spawn("send-torch", listener.path, env={"PYTORCH_CUDA_ALLOC_CONF": alloc_conf})
    ep = listener.accept()
    header, frames = ep.recv()
    ep.send(header, frames)
    assert peer.line() == "True 0"


def test_device_frames_over_asyncio(torch, echo_ep):
    t = random_tensor(torch, torch.float32, (1 << 18,))

    async def main():
        await echo_ep.send_async(b"async", [t])
        _, (frame,) = await echo_ep.recv_async()
        return frame

    frame = asyncio.run(main())
    assert torch.equal(as_tensor(torch, frame, torch.float32, (1 << 18,)), t)


def test_a_prepared_put_of_device_tensors_moves_fresh_bytes_at_every_post(torch, ctx, spawn):
    """A peer process prepares a put of a CUDA tensor's four blocks into the owner's,
    reversed, once, and posts it twice with its source rewritten in between."""
    n = 1 << 16
    owner = torch.zeros(4 * n, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    reg = ctx.register(owner, "rw")
    listener = ctx.listen()
    peer = spawn("prepared-torch", listener.path)
    ep = listener.accept()
    ep.send(reg.key, [])
    for round_ in range(2):
        assert ep.recv_notification() == b"round %d" % round_
        source = torch.arange(4 * n, dtype=torch.float32, device="cuda") + 1000 * round_
        want = torch.cat([source[(3 - j) * n : (4 - j) * n] for j in range(4)])
        assert torch.equal(owner, want), f"round {round_}"
        ep.send(b"next", [])
    assert peer.line() == "posted 2"
    assert peer.wait() == 0


def test_one_sided_put_and_get_of_device_tensors(torch, ctx, spawn):
    """The owner registers a CUDA tensor from PyTorch's caching allocator; a peer process
    imports its key, puts a tensor into it with a notification, and gets it back."""
    owner = torch.zeros(1 << 18, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    reg = ctx.register(owner, "rw")
    listener = ctx.listen()
    peer = spawn("put-torch", listener.path)
    ep = listener.accept()
    ep.send(reg.key, [])
    assert ep.recv_notification() == b"put done"
    assert torch.equal(owner, torch.arange(1 << 18, dtype=torch.float32, device="cuda"))
    assert peer.line() == "True True"
    ep.send(b"bye", [])
    assert peer.wait() == 0


def test_one_sided_transfers_wait_for_work_on_the_default_stream(torch, ctx, spawn):
    """Tensors written on PyTorch's default stream (the legacy default stream) behind a
    long GPU sleep, then put from or got into at once: the transfer waits for that work,
    whichever side runs it. The peer connects, so it copies its own transfers on its GPU
    (they wait there); then this side, the listener, whose transfers the peer's process
    runs (this side's progress thread waits for its stream first)."""
    local = ordering_tensors(torch, ctx)
    listener = ctx.listen()
    peer = spawn("ordered-torch", listener.path)
    ep = listener.accept()
    ep.send(local["mine_reg"].key, [])
    key, _ = ep.recv()
    region = ep.import_region(key)
    for round_ in range(3):
        assert ep.recv_notification() == b"put %d" % round_
        want = torch.full_like(local["mine"], float(round_ + 1))
        assert torch.equal(local["mine"], want), f"the peer's put {round_} came before its source's work"
        ep.send(b"checked", [])
    assert peer.line() == "gets ok 3", "a peer's get landed before its destination's work"
    for round_ in range(3):
        got = ordered_turn(torch, ep, local, region, 10.0 + round_, b"put %d" % round_)
        assert got, f"this side's get {round_} landed before its destination's work"
        assert ep.recv()[0] == b"checked"
    assert peer.line() == "puts seen 3", "this side's put came before its source's work"
    ep.send(b"bye", [])
    assert peer.wait() == 0
