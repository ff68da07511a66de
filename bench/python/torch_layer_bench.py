#!/usr/bin/env python3
"""caracal.MoE (the PyTorch module) against the plain PyTorch layer, side by side in one run, on
EP8-sized slices of five models (one GPU, all local experts, T tokens): forward and
forward+backward ms and TFLOP/s and the speed-up; caracal.MoE with the fused forward (its default) and
with v1's separate forward launches (fused_forward=False). The plain layer is bench/python/torch_moe_layer.py's
(argsort permute + torch._grouped_mm + autograd). Both run with autograd recording, backward via
torch.autograd.grad over the input, the scores and every weight; routing is uniform. The three
layers are timed in turn, round after round (--rounds), and each figure is the median over the rounds.

Usage: python3 bench/python/torch_layer_bench.py [--models deepseek-v3,kimi-k2,qwen3.5-397b,glm-5,deepseek-v4-pro]
                                          [--tokens 4096] [--reps 20] [--rounds 3] [--json OUT.json]
"""
import argparse
import json
import os
import statistics
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import caracal  # noqa: E402
from torch_moe_layer import MODELS, median_ms, moe_layer  # noqa: E402

# Local experts of an EP8 slice (issue 6).
LOCAL_EXPERTS = {"deepseek-v3": 32, "kimi-k2": 48, "qwen3.5-397b": 64, "glm-5": 32, "deepseek-v4-pro": 48}


def uniform_rand(gen):
    """rand(*shape, lo, hi, dtype): uniform values on the GPU from `gen`."""
    def rand(*shape, lo=-1.0, hi=1.0, dtype=torch.bfloat16):
        return (torch.rand(*shape, device="cuda", generator=gen) * (hi - lo) + lo).to(dtype)
    return rand


def step_inputs(name, tokens, gen):
    """One step's x and scores (requiring grad), dy and uniform routing for model `name`'s slice."""
    d, top_k, experts = MODELS[name][0], MODELS[name][2], LOCAL_EXPERTS[name]
    rand = uniform_rand(gen)
    x = rand(tokens, d).requires_grad_()
    dy = rand(tokens, d)
    idx = torch.rand(tokens, experts, device="cuda", generator=gen).argsort(-1)[:, :top_k].to(torch.int32)
    scores = rand(tokens, top_k, lo=0.05, hi=1.0, dtype=torch.float32).requires_grad_()
    return x, dy, idx, scores


def bench_model(name, tokens, warmup, reps, rounds, gen):
    d, inter, top_k, shared_inter, normalize, scale = MODELS[name]
    experts = LOCAL_EXPERTS[name]
    rand = uniform_rand(gen)
    x, dy, idx, scores = step_inputs(name, tokens, gen)
    fwd_flops = 6.0 * tokens * top_k * d * inter + 6.0 * tokens * d * shared_inter
    row = {"model": name, "experts": experts, "tokens": tokens, "hidden": d, "intermediate": inter,
           "top_k": top_k, "shared_intermediate": shared_inter}

    # The three layers side by side: caracal.MoE with the fused forward, with v1's launches, and the
    # plain layer, each a (forward, parameters) pair.
    variants, engines = {}, []
    for key, fused in (("caracal", True), ("caracal_v1", False)):
        moe = caracal.MoE(d, inter, experts, top_k, tokens, shared_intermediate=shared_inter, normalize=normalize,
                          router_scale=scale, fused_forward=fused)
        engines.append(moe)
        variants[key] = (lambda moe=moe: moe(x, idx, scores), [x, scores, *moe.parameters()])
    w_gate_up = rand(experts, 2 * inter, d, lo=-0.02, hi=0.02).requires_grad_()
    w_down = rand(experts, d, inter, lo=-0.02, hi=0.02).requires_grad_()
    shared = [rand(2 * shared_inter, d, lo=-0.02, hi=0.02).requires_grad_(),
              rand(d, shared_inter, lo=-0.02, hi=0.02).requires_grad_()] if shared_inter else [None, None]
    plain_idx = idx.long()
    variants["plain"] = (lambda: moe_layer(x, plain_idx, scores, w_gate_up, w_down, *shared, normalize, scale),
                         [x, scores, w_gate_up, w_down, *(p for p in shared if p is not None)])

    # Round by round, every layer in turn, so that the GPU's clock and power drift fall on all alike;
    # each figure is the median over the rounds of each round's median of `reps` runs.
    ms = {key: {"forward": [], "fwd_bwd": []} for key in variants}
    for _ in range(rounds):
        for key, (forward, params) in variants.items():
            ms[key]["forward"].append(median_ms(forward, warmup, reps))
            ms[key]["fwd_bwd"].append(median_ms(lambda: torch.autograd.grad(forward(), params, dy), warmup, reps))
    for key in variants:
        fwd, step = statistics.median(ms[key]["forward"]), statistics.median(ms[key]["fwd_bwd"])
        row[key] = {"forward_ms": fwd, "forward_tflops": fwd_flops / (fwd * 1e9),
                    "fwd_bwd_ms": step, "fwd_bwd_tflops": 3 * fwd_flops / (step * 1e9),
                    "rounds_ms": ms[key]}
    for moe in engines:
        moe.check()
        moe.close()
    del engines, variants
    torch.cuda.empty_cache()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(LOCAL_EXPERTS))
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three layers in turn (the median is reported)")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_layer_bench.py: error: needs a CUDA GPU (Hopper)")
    models = args.models.split(",")
    unknown = [m for m in models if m not in LOCAL_EXPERTS]
    if unknown:
        sys.exit(f"torch_layer_bench.py: error: unknown model(s) {unknown}; choose from {sorted(LOCAL_EXPERTS)}")
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    rows = []
    for name in models:
        print(f"{name}: timing caracal.MoE and the plain layer ...", flush=True)
        rows.append(bench_model(name, args.tokens, args.warmup, args.reps, args.rounds, gen))
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, T = {args.tokens}, uniform routing, "
          f"median of {args.rounds} alternated rounds of the median of {args.reps}")
    print(f"{'model':<14}{'experts':>8} | {'forward ms (TFLOP/s)':^38} | {'forward+backward ms (TFLOP/s)':^38}")
    print(f"{'':<22} | {'caracal':>15}{'plain':>15}{'speed-up':>8} | {'caracal':>15}{'plain':>15}{'speed-up':>8}")
    for r in rows:
        c, p = r["caracal"], r["plain"]
        cells = []
        for key in ("forward", "fwd_bwd"):
            ms_c, ms_p = c[f"{key}_ms"], p[f"{key}_ms"]
            cells.append(f"{ms_c:7.2f} ({c[f'{key}_tflops']:4.0f}){ms_p:8.2f} ({p[f'{key}_tflops']:4.0f})"
                         f"{ms_p / ms_c:7.2f}x")
        print(f"{r['model']:<14}{r['experts']:>8} | {cells[0]} | {cells[1]}")
        v = r["caracal_v1"]
        print(f"{'  caracal v1 forward':<22} | {v['forward_ms']:7.2f} ({v['forward_tflops']:4.0f}){'':>23} | "
              f"{v['fwd_bwd_ms']:7.2f} ({v['fwd_bwd_tflops']:4.0f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": args.rounds,
                       "reps": args.reps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
