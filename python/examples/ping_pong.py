"""Two processes hand a buffer back and forth over ferrylink.

    python python/examples/ping_pong.py            # host memory
    python python/examples/ping_pong.py --device   # a CUDA tensor (needs torch and a GPU)

The script starts a listener, runs itself again as the peer (``--peer PATH``), which
echoes every message, sends a 64 MiB buffer a few times, checks what comes back and
prints how long each round trip took.
"""

from __future__ import annotations

import subprocess
import sys
import time

import ferrylink

NBYTES = 64 << 20
ROUNDS = 5


def peer(path: str) -> None:
    """Echo every message until the other side says stop."""
    with ferrylink.Context() as ctx:
        ep = ctx.connect(path)
        while True:
            header, frames = ep.recv()
            ep.send(header, frames)
            if header == b"stop":
                return


def main(argv: list) -> int:
    if argv[:1] == ["--peer"]:
        peer(argv[1])
        return 0
    on_device = "--device" in argv
    with ferrylink.Context() as ctx:
        listener = ctx.listen()
        child = subprocess.Popen([sys.executable, __file__, "--peer", listener.path])
        ep = listener.accept()
        print(f"connected to {ep.peer} over the {ep.lane} lane")
        if on_device:
            import torch

            frame = torch.arange(NBYTES // 4, dtype=torch.float32, device="cuda")
        else:
            frame = ferrylink.host_buffer(NBYTES)  # shared memory: sent without a copy
            frame[:] = bytes(range(256)) * (NBYTES // 256)
        for i in range(ROUNDS):
            start = time.perf_counter()
            ep.send(b"ping", [frame])
            header, (back,) = ep.recv()
            elapsed = time.perf_counter() - start
            print(f"round {i}: {NBYTES} bytes there and back in {elapsed * 1e6:.0f} us "
                  f"({2 * NBYTES / elapsed / 1e9:.2f} GB/s)")
            if on_device:
                same = bool(torch.equal(torch.from_dlpack(back).view(torch.float32), frame))
            else:
                same = back == frame
            if not same:
                print("error: the echo differs from what was sent", file=sys.stderr)
                return 1
        ep.send(b"stop", [])
        ep.recv()
        return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
