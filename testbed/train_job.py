"""A small real training-shaped job for the testbed: PyTorch with the gloo
backend on the CPU, one rank per container, two pipeline stages of two
data-parallel replicas each.

Per iteration: stage 0 sends activations to its stage-1 partner, stage 1
sends gradients back, then each stage all-reduces within its data-parallel
group; then the rest of the iteration is compute (a sleep). Run as
`python -m testbed.train_job RANK WORLD MASTER_ADDR ITERATIONS`."""

from __future__ import annotations

import os
import sys
import time


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    rank, world, master, iters = int(argv[0]), int(argv[1]), argv[2], int(argv[3])
    os.environ.setdefault("MASTER_ADDR", master)
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    half = world // 2
    stage = rank // half
    groups = [dist.new_group(list(range(s * half, (s + 1) * half))) for s in range(2)]
    partner = rank + half if stage == 0 else rank - half
    act = torch.ones(256 * 1024)            # 1 MiB of activations
    grad = torch.ones(1024 * 1024)           # 4 MiB of gradients
    period = 2.0
    start = time.monotonic()
    for i in range(iters):
        t0 = start + i * period
        if stage == 0:
            dist.send(act, partner)
            dist.recv(act, partner)
            time.sleep(0.3)   # stage 0's own backward before its all-reduce
        else:
            dist.recv(act, partner)
            time.sleep(0.3)   # stage 1's forward and backward
            dist.send(act, partner)
        dist.all_reduce(grad, group=groups[stage])
        time.sleep(max(0.0, t0 + period - time.monotonic()))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
