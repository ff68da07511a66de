#!/usr/bin/env python3
"""caracal.MoE against NCCL + PyTorch expert parallelism, one process per GPU under torchrun.

The baseline is expert parallelism as PyTorch code does it today: the routes sorted by expert,
per-rank counts exchanged (the host learns them: a synchronization), the rows sent with
torch.distributed.nn.functional.all_to_all_single (autograd), regrouped by local expert,
torch._grouped_mm experts with SwiGLU, sent back the same way, unsorted, and summed with the
router gates in fp32; plus the shared expert (dense). Both layers get the same weights and inputs;
forward outputs are compared first. Then forward and forward+backward (autograd over x, the scores
and every weight) are timed, median of --reps after --warmup, every rank in lock-step; the table
shows the slowest rank's median.

Each rank holds --experts-per-rank experts (default: the EP8 slice of the model: 32 for
DeepSeek-V3), so the global expert count is that times the world size.

Usage: NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=N bench/python/torch_ep_bench.py
           [--models deepseek-v3,kimi-k2] [--tokens 4096] [--reps 20] [--json OUT.json]
"""
import argparse
import json
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # Caracal never uses NVLink multicast
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.nn.functional as dist_fn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import caracal  # noqa: E402
from caracal.reference import router_gates, split_gate_up  # noqa: E402
from torch_layer_bench import LOCAL_EXPERTS  # noqa: E402
from torch_moe_layer import MODELS, median_ms, swiglu  # noqa: E402


def nccl_pytorch_moe(x, idx, scores, w_gate_up, w_down, shared, world, normalize, scale):
    """y [T][D] of this rank; w_gate_up [L][2I][D] (gate rows, then up rows), w_down [L][D][I]."""
    tokens, top_k = idx.shape
    local, two_i, _ = w_gate_up.shape
    experts = local * world
    flat = idx.reshape(-1).long()
    order = torch.argsort(flat, stable=True)  # routes by global expert: by destination rank too
    counts = torch.bincount(flat, minlength=experts)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)  # [source rank][local expert] on the receiver
    send_split = counts.view(world, local).sum(1).tolist()  # the host learns the counts
    recv_split = recv_counts.view(world, local).sum(1).tolist()
    xs = x.index_select(0, order // top_k)
    recv_x = dist_fn.all_to_all_single(xs.new_empty(sum(recv_split), x.shape[1]), xs, recv_split, send_split)
    # Received rows come by source rank, then expert: regroup them by local expert.
    local_id = torch.arange(local, device=x.device).repeat(world).repeat_interleave(recv_counts)
    regroup = torch.argsort(local_id, stable=True)
    offs = recv_counts.view(world, local).sum(0).cumsum(0).to(torch.int32)
    rows = recv_x.index_select(0, regroup)
    hidden = swiglu(torch._grouped_mm(rows, w_gate_up.transpose(-2, -1), offs=offs), two_i // 2)
    out = torch._grouped_mm(hidden, w_down.transpose(-2, -1), offs=offs)
    out = out.index_select(0, torch.argsort(regroup))
    back = dist_fn.all_to_all_single(out.new_empty(sum(send_split), out.shape[1]), out, send_split, recv_split)
    routed = back.index_select(0, torch.argsort(order)).view(tokens, top_k, -1)
    gates = router_gates(idx, scores, normalize, scale)
    y = torch.bmm(gates.unsqueeze(1), routed.float()).squeeze(1)  # each token's k rows, fp32, no slot loop
    if shared is not None:
        shared_inter = shared[0].shape[0] // 2
        y = y + F.linear(swiglu(F.linear(x, shared[0]), shared_inter), shared[1]).float()
    return y.to(torch.bfloat16)


def bench_model(name, args, world, rank):
    d, inter, top_k, shared_inter, normalize, scale = MODELS[name]
    local = args.experts_per_rank or LOCAL_EXPERTS[name]
    experts, tokens = local * world.size, args.tokens
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(args.seed + 7919 * rank)
    moe = caracal.MoE(d, inter, experts, top_k, tokens, world=world, shared_intermediate=shared_inter,
                      normalize=normalize, router_scale=scale)
    # The same weights in the baseline's layout (gate rows, then up rows).
    gate, up = split_gate_up(moe.w_gate_up.detach())
    w_gate_up = torch.cat([gate, up], dim=1).requires_grad_()
    w_down = moe.w_down.detach().clone().requires_grad_()
    shared = None
    if shared_inter:
        s_gate, s_up = split_gate_up(moe.shared_w_gate_up.detach())
        shared = [torch.cat([s_gate, s_up], dim=0).requires_grad_(), moe.shared_w_down.detach().clone().requires_grad_()]
    x = (torch.rand(tokens, d, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16).requires_grad_()
    dy = (torch.rand(tokens, d, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
    idx = torch.rand(tokens, experts, device=dev, generator=gen).argsort(-1)[:, :top_k].to(torch.int32)
    scores = (torch.rand(tokens, top_k, device=dev, generator=gen) * 0.95 + 0.05).requires_grad_()

    def ours():
        return moe(x, idx, scores)

    def baseline():
        return nccl_pytorch_moe(x, idx, scores, w_gate_up, w_down, shared, world.size, normalize, scale)

    with torch.no_grad():
        y_ours, y_base = ours().float(), baseline().float()
    rel = ((y_ours - y_base).norm() / y_base.norm()).item()
    fwd_flops = 6.0 * tokens * top_k * d * inter + 6.0 * tokens * d * shared_inter
    row = {"model": name, "world": world.size, "experts_per_rank": local, "tokens": tokens,
           "forward_rel_diff": rel}
    for label, fn, params in (("caracal", ours, [x, scores, *moe.parameters()]),
                              ("nccl_pytorch", baseline, [x, scores, w_gate_up, w_down, *(shared or [])])):
        fwd = median_ms(fn, args.warmup, args.reps)
        step = median_ms(lambda: torch.autograd.grad(fn(), params, dy), args.warmup, args.reps)
        slowest = torch.tensor([fwd, step], device=dev)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        fwd, step = slowest.tolist()
        row[label] = {"forward_ms": fwd, "forward_tflops": fwd_flops / (fwd * 1e9),
                      "fwd_bwd_ms": step, "fwd_bwd_tflops": 3 * fwd_flops / (step * 1e9)}
    moe.check()
    moe.close()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="deepseek-v3,kimi-k2")
    parser.add_argument("--experts-per-rank", type=int, help="default: the model's EP8 slice")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--json", help="write the figures here (rank 0)")
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank = dist.get_rank()
    size = dist.get_world_size()
    models = args.models.split(",")
    unknown = [m for m in models if m not in LOCAL_EXPERTS]
    if unknown:
        sys.exit(f"torch_ep_bench.py: error: unknown model(s) {unknown}; choose from {sorted(LOCAL_EXPERTS)}")
    rows = []
    for name in models:
        if rank == 0:
            print(f"{name}: W = {size}, timing caracal.MoE and NCCL + PyTorch ...", flush=True)
        world = caracal.World.from_process_group()  # a world per model: close() frees its engine
        rows.append(bench_model(name, args, world, rank))
        world.close()
    if rank == 0:
        print(f"\n{torch.cuda.get_device_name()} x {size}, torch {torch.__version__}, T = {args.tokens} per rank, "
              f"uniform routing, slowest rank's median of {args.reps}")
        print(f"{'model':<14}{'W':>3}{'E/rank':>7} | {'forward ms (TFLOP/s per GPU)':^38} | "
              f"{'forward+backward ms (TFLOP/s per GPU)':^38} | y diff")
        print(f"{'':<24} | {'caracal':>15}{'NCCL+torch':>15}{'speed-up':>8} | {'caracal':>15}{'NCCL+torch':>15}"
              f"{'speed-up':>8} |")
        for r in rows:
            c, b = r["caracal"], r["nccl_pytorch"]
            cells = [f"{c[k + '_ms']:7.2f} ({c[k + '_tflops']:4.0f}){b[k + '_ms']:8.2f} ({b[k + '_tflops']:4.0f})"
                     f"{b[k + '_ms'] / c[k + '_ms']:7.2f}x" for k in ("forward", "fwd_bwd")]
            print(f"{r['model']:<14}{r['world']:>3}{r['experts_per_rank']:>7} | {cells[0]} | {cells[1]} | "
                  f"{r['forward_rel_diff']:.1e}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f,
                          indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
