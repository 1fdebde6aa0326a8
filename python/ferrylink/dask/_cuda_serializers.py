"""distributed's ``"cuda"`` serializers for PyTorch CUDA tensors.

distributed serializes a ``torch.Tensor`` only through its ``"dask"`` family, on the
host. These register a ``"cuda"`` pair (when PyTorch is first dispatched on, and only
where none is registered) so a CUDA tensor travels as one device frame and comes back a
CUDA tensor over that memory without a copy: from a ferrylink ``DeviceFrame`` through
DLPack, from an ``rmm.DeviceBuffer`` (or any CUDA Array Interface object) through the
interface. Tensors that need more (CPU tensors, gradients, empty tensors) raise
``NotImplementedError``, which sends distributed on to its next serializer.
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


def register() -> None:
    """Registers the pair, lazily: nothing imports PyTorch until a tensor is serialized."""
    from distributed.protocol.cuda import cuda_deserialize, cuda_serialize

    cuda_serialize.register_lazy("torch", _register_torch)
    cuda_deserialize.register_lazy("torch", _register_torch)
