#!/usr/bin/env python3
"""A rank that stalls on the host, as in real training (a checkpoint save, an eval, a first-step
compile), one process per GPU under torchrun:

  1. rank 1 sleeps 7 s before its forward; with the default timeout (10 minutes) nothing fails and
     the step's outputs are kept;
  2. the timeout is lowered to 2 s and rank 1 sleeps 5 s: every rank's outputs are NaN, check(),
     forward and backward raise on every rank until every rank has called reset();
  3. after reset() the same step again gives bitwise the outputs of step 1.

Usage: NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 examples/stall_recovery.py
"""
import os
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # Caracal never uses NVLink multicast
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import caracal  # noqa: E402


def step(moe, x, idx, scores, dy):
    x = x.clone().requires_grad_()
    moe.zero_grad(set_to_none=True)
    y = moe(x, idx, scores)
    y.backward(dy)
    torch.cuda.synchronize()
    moe.check()
    return [y.detach(), x.grad] + [p.grad for p in moe.parameters()]


def raises(call, part):
    try:
        call()
    except RuntimeError as e:
        assert part in str(e), str(e)
        return True
    return False


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, size = dist.get_rank(), dist.get_world_size()
    assert size >= 2, "run with --nproc_per_node=2 (or more)"
    world = caracal.World.from_process_group()
    d, inter, experts, k, t = 512, 256, 4 * size, 4, 256
    moe = caracal.MoE(d, inter, experts, k, t, world=world, shared_intermediate=256)
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(t, d, generator=g).to(torch.bfloat16).cuda()
    idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(t)]).int().cuda()
    scores = torch.rand(t, k, generator=g).add_(0.05).cuda()
    dy = torch.randn(t, d, generator=g).to(torch.bfloat16).cuda()

    # 1. A 7 s stall under the default timeout: nothing happens.
    if rank == 1:
        time.sleep(7)
    first = step(moe, x, idx, scores, dy)
    assert all(torch.isfinite(v.float()).all() for v in first), "step 1 has non-finite outputs"
    print(f"rank {rank}: a 7 s stall with the default timeout ({world.timeout:.0f} s): no error", flush=True)

    # 2. A 5 s stall over a 2 s timeout: the world aborts.
    moe.set_timeout(2.0)
    dist.barrier()
    if rank == 1:
        time.sleep(5)
    xg = x.clone().requires_grad_()
    y = moe(xg, idx, scores)
    torch.cuda.synchronize()
    assert torch.isnan(y.float()).all(), "the aborted step's output is not poisoned"
    assert raises(moe.check, "reset"), "check() did not raise"
    assert raises(moe.check, "reset"), "check() did not keep raising"
    assert raises(lambda: moe(x, idx, scores), "reset"), "forward ran on an aborted world"
    print(f"rank {rank}: a 5 s stall over a 2 s timeout: outputs NaN, check() and forward raise", flush=True)

    # 3. reset() on every rank, then the first step again: bitwise the same.
    moe.reset()
    moe.set_timeout(600.0)
    again = step(moe, x, idx, scores, dy)
    same = all(torch.equal(a, b) for a, b in zip(first, again))
    assert same, "the step after reset() differs from the step before the stall"
    print(f"rank {rank}: after reset() the step is bitwise the first one", flush=True)
    dist.barrier()
    if rank == 0:
        print("stall recovery: ok")
    world.close()  # collective: the engines' communicators and windows
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
