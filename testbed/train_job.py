"""A small real training job for the testbed: PyTorch with the gloo backend
on the CPU, one rank per container, pipeline and data parallelism shaped
like Megatron's (rank = d + DP * s: data-parallel fastest, then stages).

Each replica runs a 1F1B schedule of MICROBATCHES microbatches through its
PP stages: activations go forward and gradients back with gloo send/recv
(posted together, as Megatron's batched p2p does, so neither side blocks
the other). Compute is a sleep (the CPU is shared by every rank and agent).
When a stage's last backward ends it all-reduces its gradients with its
data-parallel peers, so the last stage reduces first and stage 0 last, and
the gradient bytes dominate the activations, as in real training. Nothing
paces the iterations: the next one starts after stage 0's reduction and an
optimizer step, so iteration times wander with the machine's load.

With EP > 1 the job is a mixture of experts: each stage's replicas form
expert-parallel groups of EP consecutive replicas, and every microbatch's
forward and backward ends with an all-to-all inside the group (the token
dispatch of an MoE layer, A2A_SHARE times the activations each way). The
all-to-all waits for every member, so a group's replicas move in lockstep:
what makes pipeline partners hard to tell apart by timing.

Run as `python -m testbed.train_job RANK WORLD PP MASTER_ADDR ITERATIONS [EP]`;
it prints one JSON line of its own byte counts and iteration times."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

MICROBATCHES = 4
FORWARD_S = 0.1       # one microbatch's forward on one stage
BACKWARD_S = 0.2      # one microbatch's backward (about twice the forward)
OPTIMIZER_S = 0.15
ACT_FLOATS = 64 * 1024        # 256 KiB of activations per microbatch
GRAD_FLOATS = 5 * 1024 * 1024  # 20 MiB of gradients per stage: ~90 % of a NIC's bytes
A2A_SHARE = 2  # an MoE layer's all-to-all moves a few times the activations


def one_f_one_b(stage: int, pp: int, m: int) -> list[tuple[str, int]]:
    """The 1F1B schedule of one stage as (kind, microbatch) steps: kind is
    'F' or 'B'. Warm-up forwards fill the pipeline, then one forward and one
    backward alternate, then the backwards drain it."""
    warm = min(pp - stage - 1, m)
    steps = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        steps += [("F", warm + i), ("B", i)]
    steps += [("B", i) for i in range(m - warm, m)]
    return steps


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    rank, world, pp, master, iters = (int(argv[0]), int(argv[1]), int(argv[2]), argv[3],
                                      int(argv[4]))
    ep = int(argv[5]) if len(argv) > 5 else 1
    os.environ.setdefault("MASTER_ADDR", master)
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dp = world // pp
    stage, replica = divmod(rank, dp)
    if ep < 1 or dp % ep:
        raise SystemExit(f"EP {ep} must divide DP {dp}")
    groups = [dist.new_group([d + dp * s for d in range(dp)]) for s in range(pp)]
    # Every rank creates every group, in one order (gloo's rule).
    experts = {(s, b): dist.new_group([d + dp * s for d in range(b, b + ep)])
               for s in range(pp) for b in range(0, dp, ep)} if ep > 1 else {}
    expert_group = experts.get((stage, replica - replica % ep))
    a2a_in, a2a_out = torch.zeros(A2A_SHARE * ACT_FLOATS), torch.ones(A2A_SHARE * ACT_FLOATS)
    prev = rank - dp if stage > 0 else None
    nxt = rank + dp if stage < pp - 1 else None
    act_in, act_out = torch.zeros(ACT_FLOATS), torch.ones(ACT_FLOATS)
    grad_in, grad_out = torch.zeros(ACT_FLOATS), torch.ones(ACT_FLOATS)
    grads = torch.ones(GRAD_FLOATS)
    sent = {"activations": 0, "gradients": 0, "all_to_all": 0}
    times: list[float] = []

    def exchange(sends: list[tuple[Any, int | None]], recvs: list[tuple[Any, int | None]]
                 ) -> None:
        reqs = [dist.isend(t, p) for t, p in sends if p is not None]
        reqs += [dist.irecv(t, p) for t, p in recvs if p is not None]
        for r in reqs:
            if r is not None:  # typed optional; gloo always returns work
                r.wait()

    steps = one_f_one_b(stage, pp, MICROBATCHES)
    for _ in range(iters):
        t0 = time.monotonic()
        for k, (kind, _mb) in enumerate(steps):
            after = steps[k + 1][0] if k + 1 < len(steps) else None
            if kind == "F":
                if k == 0 or steps[k - 1][0] == "F":
                    exchange([], [(act_in, prev)])
                time.sleep(FORWARD_S)
                if expert_group is not None:
                    dist.all_to_all_single(a2a_in, a2a_out, group=expert_group)
                # Send the activation; in steady state the backward's
                # gradient comes back in the same exchange.
                exchange([(act_out, nxt)], [(grad_in, nxt)] if after == "B" else [])
            else:
                if k > 0 and steps[k - 1][0] == "B":
                    exchange([], [(grad_in, nxt)])
                time.sleep(BACKWARD_S)
                if expert_group is not None:
                    dist.all_to_all_single(a2a_in, a2a_out, group=expert_group)
                exchange([(grad_out, prev)], [(act_in, prev)] if after == "F" else [])
            sent["activations"] += 4 * ACT_FLOATS * (kind == "F" and nxt is not None)
            sent["activations"] += 4 * ACT_FLOATS * (kind == "B" and prev is not None)
            sent["all_to_all"] += int(4 * A2A_SHARE * ACT_FLOATS * (ep - 1) / ep)
        if dp > 1:
            dist.all_reduce(grads, group=groups[stage])
            sent["gradients"] += int(4 * GRAD_FLOATS * 2 * (dp - 1) / dp)
        time.sleep(OPTIMIZER_S)
        times.append(time.monotonic() - t0)
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "stage": stage, "replica": replica, "sent": sent,
                      "iteration_s": times}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
