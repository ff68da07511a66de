#!/usr/bin/env python3
"""A stack of caracal.MoE layers (residual, every layer routing its own way), forward+backward, in
the two ways a model can hold them, side by side in one run: all layers on one World (one engine:
one layer's buffers; every backward but the last one's replays its forward's dispatch and up/gate
GEMMs) and each layer on a World of its own (an engine each: no replay, the buffers times the
layers). Reports the median ms of a forward+backward of the stack, per layer, the bytes
torch.cuda.memory_allocated() gains from building the layers (weights and activation buffers) and
the engines' symmetric heap (outside PyTorch's allocator) for each.

With the caracal tool at hand (CARACAL_CLI or build/caracal) it also prints the planner's
prediction of the one-engine stack's memory: one layer's buffers (heap + activations of every
local rank) plus the layers' weights and their gradients (bf16).

Usage: python3 bench/python/stack_bench.py [--model deepseek-v3] [--experts 32] [--ep 1] [--layers 4]
                                    [--tokens 4096] [--reps 10] [--ways one_engine,engine_per_layer]
                                    [--json OUT.json]
"""
import argparse
import json
import os
import subprocess
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import caracal  # noqa: E402
from torch_moe_layer import MODELS, median_ms  # noqa: E402


def build(args, shared_world):
    d, inter, top_k, shared_inter, normalize, scale = MODELS[args.model]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    world = caracal.World.loopback(args.ep) if shared_world else None
    layers = [caracal.MoE(d, inter, args.experts, top_k, args.tokens, world=world or caracal.World.loopback(args.ep),
                          shared_intermediate=shared_inter, normalize=normalize, router_scale=scale)
              for _ in range(args.layers)]
    torch.cuda.synchronize()
    return layers, torch.cuda.memory_allocated() - before


def run(args, gen, shared_world):
    torch.cuda.reset_peak_memory_stats()
    layers, built_bytes = build(args, shared_world)
    d, top_k, rows = layers[0].hidden, layers[0].top_k, args.tokens * args.ep
    x = (torch.randn(rows, d, device="cuda", generator=gen) * 0.5).to(torch.bfloat16).requires_grad_()
    routes = [torch.rand(rows, args.experts, device="cuda", generator=gen).argsort(-1)[:, :top_k]
              .to(torch.int32) for _ in layers]
    scores = [torch.rand(rows, top_k, device="cuda", generator=gen).add_(0.05) for _ in layers]
    dy = (torch.randn(rows, d, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
    params = [x] + [p for layer in layers for p in layer.parameters()]

    def step():
        h = x
        for layer, idx, s in zip(layers, routes, scores):
            h = h + layer(h, idx, s)
        return torch.autograd.grad(h, params, dy)

    ms = median_ms(step, 3, args.reps)
    for layer in layers:
        layer.check()
    engines = {id(layer._engine): layer.memory()["heap"] for layer in layers}
    return {"fwd_bwd_ms": ms, "per_layer_ms": ms / args.layers, "built_bytes": built_bytes,
            "peak_allocated": torch.cuda.max_memory_allocated(), "heap_bytes": sum(engines.values()),
            "engines": len(engines)}


def planned_bytes(args):
    """The planner's bytes for the one-engine stack on this GPU, or None without the tool."""
    cli = os.environ.get("CARACAL_CLI") or os.path.join(here, "..", "..", "build", "caracal")
    if not os.path.exists(cli):
        return None
    cmd = [cli, "plan", "--model", args.model, "--experts", str(args.experts), "--ep", str(args.ep), "--tokens",
           str(args.tokens), "--json", "--quiet"]
    m = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["memory_bytes"]
    return {"heap": m["layer_heap"], "local": args.ep * m["layer_local"],
            "weights_and_grads": 2 * args.layers * args.ep * m["weights"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deepseek-v3", choices=sorted(MODELS))
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--ep", type=int, default=1, help="ranks of the loopback world (all on this GPU)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--ways", default="one_engine,engine_per_layer")
    parser.add_argument("--json")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(2026)
    ways = args.ways.split(",")
    result = {"model": args.model, "experts": args.experts, "ep": args.ep, "layers": args.layers,
              "tokens": args.tokens, "reps": args.reps, "gpu": torch.cuda.get_device_name(),
              "planner": planned_bytes(args)}
    for key in ways:
        result[key] = run(args, gen, key == "one_engine")
        torch.cuda.empty_cache()
    print(f"stack of {args.layers} x {args.model} ({args.experts} experts, loopback W = {args.ep}, T = {args.tokens}), "
          f"fwd+bwd, median of {args.reps}")
    for key in ways:
        r = result[key]
        print(f"  {key:17s} {r['fwd_bwd_ms']:9.3f} ms  {r['per_layer_ms']:8.3f} ms/layer  "
              f"{r['built_bytes'] / 2**30:7.2f} GiB built, peak {r['peak_allocated'] / 2**30:7.2f} GiB + "
              f"{r['heap_bytes'] / 2**30:6.2f} GiB heap  ({r['engines']} engines)")
    plan = result["planner"]
    if plan and "one_engine" in ways:
        print(f"  planner, one engine: heap {plan['heap'] / 2**30:.2f} GiB + activations {plan['local'] / 2**30:.2f} "
              f"+ weights and gradients {plan['weights_and_grads'] / 2**30:.2f} GiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
