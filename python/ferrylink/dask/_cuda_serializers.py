"""distributed's ``"cuda"`` serializers for PyTorch CUDA tensors and RMM buffers.

distributed serializes a ``torch.Tensor`` only through its ``"dask"`` family, on the
host. This registers a ``"cuda"`` pair (when PyTorch is first dispatched on, and only
where none is registered) so a CUDA tensor travels as one device frame and comes back a
CUDA tensor over that memory without a copy: from a ferrylink ``DeviceFrame`` through
DLPack, from an ``rmm.DeviceBuffer`` (or any CUDA Array Interface object) through the
interface. Tensors that need more (CPU tensors, gradients, empty tensors) raise
``NotImplementedError``, which sends distributed on to its next serializer.

distributed's own ``"cuda"`` pair for ``rmm.DeviceBuffer`` imports Numba; where Numba is
missing, the same pair without it is registered instead (the buffer is its one frame).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple


def _serialize(tensor: Any) -> Tuple[Dict[str, Any], List[Any]]:
    import torch

    if not tensor.is_cuda or tensor.requires_grad or tensor.grad is not None or tensor.numel() == 0:
        raise NotImplementedError("only CUDA tensors without gradients go as device frames")
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    header = {
        "dtype": str(tensor.dtype).replace("torch.", ""),
        "shape": list(tensor.shape),
        "device": tensor.device.index or 0,
    }
    return header, [flat]


def _deserialize(header: Dict[str, Any], frames: List[Any]) -> Any:
    import torch

    (frame,) = frames
    device = f"cuda:{header['device']}"
    if hasattr(frame, "__dlpack__") and not isinstance(frame, torch.Tensor):
        try:
            flat = torch.from_dlpack(frame)
        except (TypeError, RuntimeError, BufferError):
            flat = torch.as_tensor(frame, device=device)
    else:
        flat = torch.as_tensor(frame, device=device)
    dtype = getattr(torch, header["dtype"])
    return flat.view(torch.uint8).reshape(-1).view(dtype).reshape(header["shape"])


def _register_torch() -> None:
    import torch
    from distributed.protocol.cuda import cuda_deserialize, cuda_serialize

    if torch.Tensor not in cuda_serialize._lookup:
        cuda_serialize.register(torch.Tensor)(_serialize)
    if torch.Tensor not in cuda_deserialize._lookup:
        cuda_deserialize.register(torch.Tensor)(_deserialize)


def _serialize_rmm(buffer: Any) -> Tuple[Dict[str, Any], List[Any]]:
    header = dict(buffer.__cuda_array_interface__)
    header["strides"] = (1,)
    return header, [buffer]


def _deserialize_rmm(header: Dict[str, Any], frames: List[Any]) -> Any:
    import rmm  # type: ignore[import-not-found]

    (frame,) = frames
    if isinstance(frame, rmm.DeviceBuffer):
        return frame
    # A device frame of another kind (a comm without RMM on its side): copied once.
    pointer = frame.__cuda_array_interface__["data"][0]
    return rmm.DeviceBuffer(ptr=pointer, size=int(header["shape"][0]))


def _register_rmm() -> None:
    from distributed.protocol.cuda import cuda_deserialize, cuda_serialize

    try:
        from distributed.protocol import rmm as _distributed_rmm  # noqa: F401  (needs Numba)

        return
    except (ImportError, OSError, RuntimeError):
        pass
    import rmm

    cuda_serialize.register(rmm.DeviceBuffer)(_serialize_rmm)
    cuda_deserialize.register(rmm.DeviceBuffer)(_deserialize_rmm)


def register() -> None:
    """Registers the pairs, lazily: nothing imports PyTorch or RMM until one of their
    objects is serialized."""
    from distributed.protocol.cuda import cuda_deserialize, cuda_serialize

    for dispatch in (cuda_serialize, cuda_deserialize):
        dispatch.register_lazy("torch", _register_torch)
        # Replaces distributed's own lazy registration, which _register_rmm runs first.
        dispatch.register_lazy("rmm", _register_rmm)
