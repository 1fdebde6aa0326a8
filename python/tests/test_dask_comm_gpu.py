"""Device objects through a two-worker ``ferrylink://`` cluster, on a GPU machine.

Each test skips without a CUDA device and torch, and fails instead when
``FERRYLINK_REQUIRE_GPU=1`` (``python/tools/dask_gpu_run.sh`` sets it; RMM is then
required too). Worker A makes the object from a seed, worker B receives it over a comm
and compares every byte with the same object made there.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("distributed")

from distributed import Client, LocalCluster, get_worker  # noqa: E402

from conftest import require_gpu  # noqa: E402

BOUND_S = 180
SIZES = [8, 1 << 20, 64 << 20]


@pytest.fixture(scope="module")
def client():
    require_gpu()
    with LocalCluster(
        protocol="ferrylink",
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        host="127.0.0.1",
        timeout=BOUND_S,
    ) as local, Client(local, timeout=BOUND_S) as c:
        yield c


def require_rmm() -> None:
    try:
        import rmm  # noqa: F401
    except ImportError:
        if os.environ.get("FERRYLINK_REQUIRE_GPU") == "1":
            pytest.fail("FERRYLINK_REQUIRE_GPU=1 but rmm is not installed")
        pytest.skip("needs rmm")


def seeded_tensor(nbytes: int, seed: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda", generator=g)


def make_tensor(nbytes: int, seed: int):
    import torch

    # A float32 view with a 2-D shape: the dtype and shape travel in the header.
    return seeded_tensor(nbytes, seed).view(torch.float32).reshape(2, -1)


def check_tensor(received, nbytes: int, seed: int):
    import torch

    expected = make_tensor(nbytes, seed)
    return (
        get_worker().address,
        type(received).__name__,
        bool(received.is_cuda),
        received.dtype == expected.dtype and tuple(received.shape) == tuple(expected.shape),
        bool(torch.equal(received.view(torch.uint8), expected.view(torch.uint8))),
    )


def make_device_buffer(nbytes: int, seed: int):
    import rmm

    return rmm.DeviceBuffer.to_device(seeded_tensor(nbytes, seed).cpu().numpy().tobytes())


def check_device_buffer(received, nbytes: int, seed: int):
    expected = seeded_tensor(nbytes, seed).cpu().numpy().tobytes()
    return (
        get_worker().address,
        type(received).__name__,
        received.size == nbytes,
        bytes(received.copy_to_host()) == expected,
    )


def serializer_of(obj):
    from distributed.protocol import serialize

    import ferrylink.dask._comm  # noqa: F401  (registers the torch "cuda" pair)

    header, frames = serialize(obj, serializers=("cuda", "dask", "pickle"))
    return header["serializer"], [hasattr(f, "__cuda_array_interface__") for f in frames]


@pytest.mark.parametrize("nbytes", SIZES)
def test_torch_cuda_tensors_between_workers(client, nbytes):
    a, b = sorted(client.scheduler_info()["workers"])
    made = client.submit(make_tensor, nbytes, nbytes + 1, workers=[a], pure=False)
    assert client.submit(serializer_of, made, workers=[a], pure=False).result(BOUND_S) == ("cuda", [True])
    where, kind, on_device, same_layout, same_bytes = client.submit(
        check_tensor, made, nbytes, nbytes + 1, workers=[b], pure=False
    ).result(BOUND_S)
    assert (where, kind, on_device, same_layout, same_bytes) == (b, "Tensor", True, True, True)


@pytest.mark.parametrize("nbytes", SIZES)
def test_rmm_device_buffers_between_workers(client, nbytes):
    require_rmm()
    a, b = sorted(client.scheduler_info()["workers"])
    made = client.submit(make_device_buffer, nbytes, nbytes + 3, workers=[a], pure=False)
    assert client.submit(serializer_of, made, workers=[a], pure=False).result(BOUND_S) == ("cuda", [True])
    result = client.submit(check_device_buffer, made, nbytes, nbytes + 3, workers=[b], pure=False).result(BOUND_S)
    assert result == (b, "DeviceBuffer", True, True)
