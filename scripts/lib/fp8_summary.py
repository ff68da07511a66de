#!/usr/bin/env python3
"""Issue 47's targets against one run's figures (scripts/fp8-check.sh): two markdown tables, a
JSON of every figure and verdict, and the misses.

    fp8_summary.py --gemm GEMM.json [--gemm ...] --layer NAME=BENCH.json [--layer ...]
                   [--plain NAME=PLAIN.json ...] [--json OUT]

GEMM.json: caracal_gemm_bench --json (its FP8 cases: those with fp8_* results). Per case, our FP8
kernel's time over our bf16 one's (up/gate + SwiGLU storing gate_up, down, dgrad + SwiGLU, dx, the
weight gradients in fp32) and CUTLASS's blockwise FP8 over ours (up, down; the weight gradients'
faster schedule beside them, no target); targets: up/gate and down >= 1.6x bf16, the weight
gradients >= 1.5x, CUTLASS FP8 over ours <= 1.0 (ours at least as fast).
BENCH.json: caracal-bench --precision fp8 --json. Per layer: the FP8 layer's forward, backward and
fwd+bwd ms, the weights' quantization, the bf16 fused layer's over the FP8 one's and NCCL + GEMMs'
over the FP8 one's; targets (issue 47, DeepSeek-V3 at W = 1, held to on every shape here): forward
>= 1.5x bf16, fwd+bwd >= 1.35x bf16. PLAIN.json: bench/python/torch_fp8_moe_layer.py --json on the
layer NAME's shape: the plain PyTorch FP8 and bf16 layers' fwd+bwd over the FP8 layer's; targets
>= 1.5x the plain FP8 layer, >= 2.0x the plain bf16 one; beside them (no target) the same ratios
for the FP8 layer's fwd+bwd on weights quantized before (a step's micro-batches after its first,
BENCH.json's fp8_fwd_bwd_weights_ready_ms). The last line printed is "all targets met" or "MISS: <what>";
the exit status is 0 either way once the inputs were read (1 when one is missing or malformed), so
that the caller decides what a miss means.
"""
import argparse
import json
import sys

GEMM_TARGETS = {"up": 1.6, "down": 1.6, "wgrad": 1.5}  # FP8 over our bf16, at least
CUTLASS_TARGET = 1.0  # ours over CUTLASS's FP8, at least
LAYER_TARGETS = {"forward": 1.5, "fwd_bwd": 1.35}  # FP8 over the bf16 fused layer, at least
PLAIN_TARGETS = {"fp8": 1.5, "bf16": 2.0}  # fwd+bwd over the plain PyTorch layers', at least

# Our FP8 kernel and the bf16 kernel it is measured against (the same outputs stored).
GEMM_PAIRS = {
    "up": ("fp8_up_gate_swiglu", "up_gate_swiglu"),
    "down": ("fp8_down", "down"),
    "dgrad": ("fp8_dgrad_swiglu", "dgrad_swiglu"),
    "dx": ("fp8_dx", "dx"),
    "wgrad": ("fp8_wgrad", "wgrad"),
}
CUTLASS_PAIRS = {"up": ("fp8_up_gate_swiglu", "cutlass_fp8_up"), "down": ("fp8_down", "cutlass_fp8_down")}
CUTLASS_WGRAD = ("cutlass_fp8_wgrad_cooperative", "cutlass_fp8_wgrad_pingpong")  # the faster one, no target


def ms(results, kernel):
    entry = results.get(kernel)
    return entry["ms"] if isinstance(entry, dict) and entry.get("ms") else None


def ratio(num, den):
    return num / den if num is not None and den else None


def gemm_rows(run):
    rows = []
    for case in run.get("cases", []):
        results = case.get("results", {})
        if "fp8_up_gate_swiglu" not in results:
            continue
        row = {"case": case["name"], "over_bf16": {}, "over_cutlass": {}, "ms": {}, "misses": []}
        for kind, (fp8, bf16) in GEMM_PAIRS.items():
            row["ms"][kind] = ms(results, fp8)
            row["over_bf16"][kind] = ratio(ms(results, bf16), ms(results, fp8))
        for kind, (ours, theirs) in CUTLASS_PAIRS.items():
            row["over_cutlass"][kind] = ratio(ms(results, theirs), ms(results, ours))
        theirs = [t for t in (ms(results, k) for k in CUTLASS_WGRAD) if t is not None]
        row["wgrad_over_cutlass"] = ratio(min(theirs), ms(results, "fp8_wgrad")) if theirs else None
        row["quantize_wgrad_operands_ms"] = ms(results, "fp8_quantize_wgrad_operands")
        for kind, target in GEMM_TARGETS.items():
            got = row["over_bf16"][kind]
            if got is None or got < target:
                row["misses"].append(f"{case['name']} {kind} {fmt(got)}x bf16 (target {target})")
        for kind, got in row["over_cutlass"].items():
            if got is None or got < CUTLASS_TARGET:
                row["misses"].append(f"{case['name']} {kind} {fmt(got)}x CUTLASS FP8 (target {CUTLASS_TARGET})")
        rows.append(row)
    return rows


def add_plain(row, plain):
    """The plain PyTorch layers' fwd+bwd over the FP8 layer's, and their misses."""
    row["over_plain"] = {}
    row["over_plain_weights_ready"] = {}
    for label, target in PLAIN_TARGETS.items():
        plain_ms = plain.get(label, {}).get("fwd_bwd", {}).get("ms")
        got = ratio(plain_ms, row["ms"]["fwd_bwd"])
        row["over_plain"][label] = got
        row["over_plain_weights_ready"][label] = ratio(plain_ms, row["fwd_bwd_weights_ready_ms"])
        if got is None or got < target:
            row["misses"].append(f"{row['layer']} fwd_bwd {fmt(got)}x the plain {label} layer (target {target})")


def layer_row(name, bench):
    run = bench["runs"][0]
    if bench.get("precision") != "fp8" or "bf16_fused" not in run:
        raise ValueError(f"{name}: not a caracal-bench --precision fp8 run")
    fp8 = {p: run[p]["ms"] for p in ("forward", "backward", "fwd_bwd")}
    bf16 = {p: run["bf16_fused"][p]["ms"] for p in ("forward", "backward", "fwd_bwd")}
    nccl = run.get("baselines", {}).get("nccl_exchange_plus_gemms", {})
    nccl_ms = {p: nccl.get(f"{p}_ms") for p in ("forward", "backward", "fwd_bwd")} if nccl.get("available") else {}
    row = {
        "layer": name,
        "model": bench.get("model"),
        "experts": bench.get("layer", {}).get("local_experts"),
        "tokens": run.get("tokens_per_rank"),
        "weight_grads": "fp8" if bench.get("layer_options", {}).get("fp8", {}).get("fp8_weight_gradients") else "bf16",
        "device": bench.get("device", {}).get("name"),
        "ms": fp8,
        "weights_quantized_ms": run.get("fp8_weight_quantization_ms"),
        "fwd_bwd_weights_ready_ms": run.get("fp8_fwd_bwd_weights_ready_ms"),  # absent from older runs
        "over_bf16": {p: ratio(bf16[p], fp8[p]) for p in fp8},
        "over_nccl": {p: ratio(nccl_ms.get(p), fp8[p]) for p in fp8},
        "over_plain": None,
        "over_plain_weights_ready": None,
        "misses": [],
    }
    for p, target in LAYER_TARGETS.items():
        got = row["over_bf16"][p]
        if got is None or got < target:
            row["misses"].append(f"{name} {p} {fmt(got)}x bf16 (target {target})")
    return row


def fmt(v, digits=3):
    return "-" if v is None else f"{v:.{digits}f}"


def weights_ready(r):
    """The weights-ready cell: its ms, and its ratios over the plain layers where they ran."""
    if r["fwd_bwd_weights_ready_ms"] is None:
        return "-"
    over = r["over_plain_weights_ready"]
    return fmt(r["fwd_bwd_weights_ready_ms"]) + (
        ", " + " / ".join(fmt(over[k], 2) for k in PLAIN_TARGETS) if over else "")


def print_tables(gemms, layers):
    if layers:
        print("| layer | weight gradients | FP8 fwd / bwd / fwd+bwd ms | weights quantized ms | over bf16 fused: "
              "fwd / bwd / fwd+bwd | over NCCL + GEMMs | fwd+bwd over plain FP8 / bf16 | targets | "
              "fwd+bwd on weights quantized before: ms, over plain FP8 / bf16 |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in layers:
            shape = f"{r['model']} E{r['experts']} T{r['tokens']}"
            print(f"| {shape} | {r['weight_grads']} | {' / '.join(fmt(r['ms'][p]) for p in r['ms'])} | "
                  f"{fmt(r['weights_quantized_ms'])} | {' / '.join(fmt(r['over_bf16'][p]) for p in r['ms'])} | "
                  f"{' / '.join(fmt(r['over_nccl'][p], 2) for p in r['ms'])} | "
                  f"{' / '.join(fmt(r['over_plain'][k], 2) for k in PLAIN_TARGETS) if r['over_plain'] else '-'} | "
                  f"{'PASS' if not r['misses'] else 'MISS'} | {weights_ready(r)} |")
    if gemms:
        print()
        print("| GEMM case | FP8 over bf16: up / down / dgrad / dx / wgrad | over CUTLASS FP8: up / down | "
              "wgrad over CUTLASS FP8 | wgrad operands quantized ms | targets |")
        print("|---|---|---|---|---|---|")
        for r in gemms:
            print(f"| {r['case']} | {' / '.join(fmt(r['over_bf16'][k]) for k in GEMM_PAIRS)} | "
                  f"{' / '.join(fmt(r['over_cutlass'][k]) for k in CUTLASS_PAIRS)} | {fmt(r['wgrad_over_cutlass'])} | "
                  f"{fmt(r['quantize_wgrad_operands_ms'])} | {'PASS' if not r['misses'] else 'MISS'} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemm", action="append", default=[], help="caracal_gemm_bench --json output")
    parser.add_argument("--layer", action="append", default=[], help="NAME=caracal-bench --json output")
    parser.add_argument("--plain", action="append", default=[],
                        help="NAME=bench/python/torch_fp8_moe_layer.py --json output on layer NAME's shape")
    parser.add_argument("--json", help="write every figure and verdict here")
    args = parser.parse_args()
    try:
        gemms = [row for path in args.gemm for row in gemm_rows(json.load(open(path)))]
        layers = []
        for spec in args.layer:
            name, sep, path = spec.partition("=")
            if not sep:
                raise ValueError(f"--layer {spec!r}: expected NAME=PATH")
            layers.append(layer_row(name, json.load(open(path))))
        for spec in args.plain:
            name, sep, path = spec.partition("=")
            row = next((r for r in layers if r["layer"] == name), None)
            if not sep or row is None:
                raise ValueError(f"--plain {spec!r}: expected NAME=PATH with NAME a --layer's")
            add_plain(row, json.load(open(path)))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        print(f"fp8_summary: error: {e}", file=sys.stderr)
        return 1
    if not gemms and not layers:
        print("fp8_summary: error: no FP8 figures in the inputs", file=sys.stderr)
        return 1
    print_tables(gemms, layers)
    misses = [m for r in layers + gemms for m in r["misses"]]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"layers": layers, "gemms": gemms, "misses": misses}, f, indent=1)
    print()
    print("all targets met" if not misses else "MISS: " + "; ".join(misses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
