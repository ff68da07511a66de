#!/usr/bin/env python3
"""A stack of caracal.MoE layers (residual, every layer routing its own way), forward+backward, in
the two ways a model can hold them, side by side in one run: all layers on one World (one engine:
one layer's buffers; every backward but the last one's replays its forward's dispatch and up/gate
GEMMs) and each layer on a World of its own (an engine each: no replay, the buffers times the
layers). Reports the median ms of a forward+backward of the stack, per layer, the bytes
torch.cuda.memory_allocated() gains from building the layers (weights and activation buffers) and
the engines' symmetric heap (outside PyTorch's allocator) for each.

Usage: python3 bench/stack_bench.py [--model deepseek-v3] [--experts 32] [--layers 4]
                                    [--tokens 4096] [--reps 10] [--json OUT.json]
"""
import argparse
import json
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "python"))
import caracal  # noqa: E402
from torch_moe_layer import MODELS, median_ms  # noqa: E402


def build(args, shared_world):
    d, inter, top_k, shared_inter, normalize, scale = MODELS[args.model]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    world = caracal.World.loopback(1) if shared_world else None
    layers = [caracal.MoE(d, inter, args.experts, top_k, args.tokens, world=world or caracal.World.loopback(1),
                          shared_intermediate=shared_inter, normalize=normalize, router_scale=scale)
              for _ in range(args.layers)]
    torch.cuda.synchronize()
    return layers, torch.cuda.memory_allocated() - before


def run(args, gen, shared_world):
    layers, built_bytes = build(args, shared_world)
    d, top_k = layers[0].hidden, layers[0].top_k
    x = (torch.randn(args.tokens, d, device="cuda", generator=gen) * 0.5).to(torch.bfloat16).requires_grad_()
    routes = [torch.rand(args.tokens, args.experts, device="cuda", generator=gen).argsort(-1)[:, :top_k]
              .to(torch.int32) for _ in layers]
    scores = [torch.rand(args.tokens, top_k, device="cuda", generator=gen).add_(0.05) for _ in layers]
    dy = (torch.randn(args.tokens, d, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
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
            "heap_bytes": sum(engines.values()), "engines": len(engines)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deepseek-v3", choices=sorted(MODELS))
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(2026)
    result = {"model": args.model, "experts": args.experts, "layers": args.layers, "tokens": args.tokens,
              "reps": args.reps, "gpu": torch.cuda.get_device_name()}
    for key, shared in (("one_engine", True), ("engine_per_layer", False)):
        result[key] = run(args, gen, shared)
        torch.cuda.empty_cache()
    print(f"stack of {args.layers} x {args.model} ({args.experts} experts, T = {args.tokens}), fwd+bwd, median of "
          f"{args.reps}")
    for key in ("one_engine", "engine_per_layer"):
        r = result[key]
        print(f"  {key:17s} {r['fwd_bwd_ms']:9.3f} ms  {r['per_layer_ms']:8.3f} ms/layer  "
              f"{r['built_bytes'] / 2**30:7.2f} GiB built + {r['heap_bytes'] / 2**30:6.2f} GiB heap  ({r['engines']} engines)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
