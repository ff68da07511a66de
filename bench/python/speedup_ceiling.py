#!/usr/bin/env python3
"""How far caracal.MoE's forward+backward can get ahead of the plain PyTorch layer on one GPU
(issue 15's target: 1.6x), from two benchmarks of the same day: bench/python/torch_layer_bench.py's JSON
(caracal through PyTorch and the plain layer) and `caracal-bench --bf16-weight-grads` JSONs (one per
model, W = 1, the PyTorch module's gradient precision). Per model it prints the plain layer's ms,
caracal's and their ratio; then the ratio caracal would reach if it took no more than its own
grouped GEMMs alone (the NCCL baseline's GEMMs: every byte moved for free), and no more than
cuBLAS dense GEMMs of equal FLOPs: where the first is below the target, no overlap of data
movement can reach it, only faster GEMMs.

Usage: python3 bench/python/speedup_ceiling.py TORCH.json BENCH.json [BENCH.json ...] [--target 1.6]
"""
import argparse
import json
import sys


def bench_rows(paths):
    """{model: (GEMMs-alone fwd+bwd ms, cuBLAS dense fwd+bwd ms, caracal-bench fwd+bwd ms)}"""
    rows = {}
    for path in paths:
        with open(path) as f:
            b = json.load(f)
        if b.get("weight_grads") != "bf16" or b.get("ep") != 1:
            sys.exit(f"speedup_ceiling.py: {path}: expected a caracal-bench run at --ep 1 with --bf16-weight-grads")
        run = b["runs"][0]
        base = run["baselines"]
        alone = base["nccl_exchange_plus_gemms"]
        rows[b["model"]] = (alone["gemms_alone_forward_ms"] + alone["gemms_alone_backward_ms"],
                            base["cublas_dense"]["fwd_bwd_ms"], run["fwd_bwd"]["ms"])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("torch_json")
    parser.add_argument("bench_json", nargs="+")
    parser.add_argument("--target", type=float, default=1.6)
    args = parser.parse_args()
    with open(args.torch_json) as f:
        torch_rows = {r["model"]: r for r in json.load(f)["rows"]}
    bench = bench_rows(args.bench_json)
    print(f"{'model':<16}{'plain ms':>9}{'caracal':>9}{'ratio':>7} | {'GEMMs alone':>11}{'ceiling':>8} | "
          f"{'cuBLAS':>7}{'ceiling':>8} | {args.target}x needs")
    for model, r in torch_rows.items():
        plain, ours = r["plain"]["fwd_bwd_ms"], r["caracal"]["fwd_bwd_ms"]
        line = f"{model:<16}{plain:9.2f}{ours:9.2f}{plain / ours:6.2f}x | "
        if model in bench:
            alone, cublas, _ = bench[model]
            line += f"{alone:11.2f}{plain / alone:7.2f}x | {cublas:7.2f}{plain / cublas:7.2f}x | "
        else:
            line += f"{'-':>11}{'-':>8} | {'-':>7}{'-':>8} | "
        print(line + f"{plain / args.target:.2f} ms")
    print("ceiling: the plain layer's ms over the GEMMs alone (ours, or cuBLAS dense of equal FLOPs), i.e. the ratio "
          "with every byte moved for free")


if __name__ == "__main__":
    main()
