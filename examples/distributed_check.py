#!/usr/bin/env python3
"""caracal.MoE across processes: one rank per GPU under torchrun, over NCCL symmetric memory,
checked against the plain-PyTorch layer. Every rank builds the same global experts and every
rank's inputs from shared seeds, runs its own slice through caracal.MoE, and compares its output,
dx, d_scores and its experts' weight gradients (which sum over all ranks' tokens) with the
reference over all W*T tokens. Then it runs the step twice more and checks bitwise equality.

Usage: NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=N examples/distributed_check.py [--tokens 256]
"""
import argparse
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # Caracal never uses NVLink multicast
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import caracal  # noqa: E402
from caracal.reference import moe_reference  # noqa: E402


def rel_error(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=128)
    parser.add_argument("--experts-per-rank", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--shared-intermediate", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, size = dist.get_rank(), dist.get_world_size()
    d, inter, k, t, shared_inter = args.hidden, args.intermediate, args.top_k, args.tokens, args.shared_intermediate
    experts = args.experts_per_rank * size
    world = caracal.World.from_process_group()
    moe = caracal.MoE(d, inter, experts, k, t, world=world, shared_intermediate=shared_inter, router_scale=2.5)

    # The global weights and every rank's inputs, identical on all ranks.
    g = torch.Generator().manual_seed(args.seed)
    w_gate_up = (torch.rand(experts, 2 * inter, d, generator=g) - 0.5) / d ** 0.5
    w_down = (torch.rand(experts, d, inter, generator=g) - 0.5) / inter ** 0.5
    shared = [(torch.rand(2 * shared_inter, d, generator=g) - 0.5) / d ** 0.5,
              (torch.rand(d, shared_inter, generator=g) - 0.5) / shared_inter ** 0.5]
    x = torch.randn(size * t, d, generator=g).to(torch.bfloat16)
    weights = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64)  # Zipf-skewed routing
    idx = torch.multinomial(weights.expand(size * t, experts), k, generator=g).to(torch.int32)
    idx[torch.rand(size * t, k, generator=g) < 0.1] = -1
    scores = torch.rand(size * t, k, generator=g) + 0.05
    dy = torch.randn(size * t, d, generator=g).to(torch.bfloat16)
    mine = slice(rank * t, (rank + 1) * t)
    experts_mine = slice(rank * args.experts_per_rank, (rank + 1) * args.experts_per_rank)
    with torch.no_grad():
        moe.w_gate_up.copy_(w_gate_up[experts_mine])
        moe.w_down.copy_(w_down[experts_mine])
        moe.shared_w_gate_up.copy_(shared[0])
        moe.shared_w_down.copy_(shared[1])

    def step():
        xr = x[mine].cuda().requires_grad_()
        sr = scores[mine].cuda().requires_grad_()
        y = moe(xr, idx[mine].cuda(), sr)
        grads = torch.autograd.grad(y, [xr, sr, moe.w_gate_up, moe.w_down], dy[mine].cuda())
        moe.check()
        return [y.detach(), *grads]

    ours = step()
    # The reference from the bf16 weights the kernels read, over all ranks' tokens.
    ref_w = [w.to(torch.bfloat16).float().requires_grad_() for w in (w_gate_up, w_down, *shared)]
    ref_x, ref_s = x.float().requires_grad_(), scores.clone().requires_grad_()
    y_ref = moe_reference(ref_x, idx, ref_s, *ref_w, normalize=True, router_scale=2.5)
    ref = [y_ref.detach(), *torch.autograd.grad(y_ref, [ref_x, ref_s, ref_w[0], ref_w[1]], dy.float())]
    expected = [ref[0][mine], ref[1][mine], ref[2][mine], ref[3][experts_mine], ref[4][experts_mine]]
    names = ["y", "dx", "d_topk_scores", "d_w_gate_up", "d_w_down"]
    errors = {n: rel_error(a.cpu(), b) for n, a, b in zip(names, ours, expected)}
    identical = all(all(torch.equal(a, b) for a, b in zip(ours, step())) for _ in range(2))
    ok = all(e <= 1e-2 for e in errors.values()) and identical
    print(f"rank {rank}/{size}: " + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()) +
          f"; 3 runs bitwise identical: {'yes' if identical else 'NO'}; {'ok' if ok else 'FAILED'}", flush=True)
    failed = torch.tensor([0 if ok else 1], device="cuda")
    dist.all_reduce(failed)
    world.close()  # collective: the engines' communicators and windows
    dist.destroy_process_group()
    sys.exit(1 if failed.item() else 0)


if __name__ == "__main__":
    main()
