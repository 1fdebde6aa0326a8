"""One-sided transfers between two processes: the owner registers a buffer of blocks and
ships its key; the peer imports it, writes blocks into it with a notification, and
reads one back.

    python python/examples/one_sided.py            # host memory
    python python/examples/one_sided.py --device   # CUDA tensors (needs torch and a GPU)
"""

from __future__ import annotations

import subprocess
import sys

import ferrylink

BLOCK = 4096
BLOCKS = 16


def buffer(on_device: bool, fill: int):
    if on_device:
        import torch

        return torch.full((BLOCK * BLOCKS,), fill, dtype=torch.uint8, device="cuda")
    view = ferrylink.host_buffer(BLOCK * BLOCKS)  # shared memory, which a peer can map
    view[:] = bytes([fill]) * len(view)
    return view


def as_bytes(frame) -> bytes:
    if hasattr(frame, "cpu"):
        return bytes(frame.cpu().numpy())
    return bytes(frame)


def peer(path: str, on_device: bool) -> None:
    """Writes its blocks 0..3 into the owner's blocks 12..15 in one request, with a
    notification; then reads the owner's block 0 into its block 0."""
    with ferrylink.Context() as ctx:
        ep = ctx.connect(path)
        key, _ = ep.recv()
        region = ep.import_region(key)
        mine = ctx.register(buffer(on_device, 7), "rw")
        spans = [(i * BLOCK, (12 + i) * BLOCK, BLOCK) for i in range(4)]
        ep.put(mine, region, spans=spans, notify=b"blocks 12-15 written")
        ep.get(mine, region, nbytes=BLOCK)
        print(f"peer: read the owner's block 0: {as_bytes(mine.frame)[:4]!r}...")
        ep.recv()


def main(argv: list) -> int:
    on_device = "--device" in argv
    if argv[:1] == ["--peer"]:
        peer(argv[1], on_device)
        return 0
    with ferrylink.Context() as ctx:
        listener = ctx.listen()
        extra = ["--device"] if on_device else []
        child = subprocess.Popen([sys.executable, __file__, "--peer", listener.path, *extra])
        ep = listener.accept()
        blocks = buffer(on_device, 1)
        with ctx.register(blocks, "rw") as reg:
            ep.send(reg.key, [])  # 48 bytes: any channel would do
            note = ep.recv_notification()  # the data is in place once this arrives
            data = as_bytes(blocks)
            print(f"owner: notified {note!r}; block 11 holds {data[11 * BLOCK]}, block 12 holds {data[12 * BLOCK]}")
            ok = data[: 12 * BLOCK] == bytes([1]) * (12 * BLOCK) and data[12 * BLOCK :] == bytes([7]) * (4 * BLOCK)
            ep.send(b"bye", [])
            status = child.wait()
        if not ok:
            print("error: the owner's blocks are not what the peer wrote", file=sys.stderr)
            return 1
        return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
