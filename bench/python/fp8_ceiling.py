#!/usr/bin/env python3
"""How far the FP8 layer can get ahead of the bf16 fused layer at W = 1 (issue 47's layer targets:
forward >= 1.5x, fwd+bwd >= 1.35x), from two benchmarks of one run: `caracal-bench --precision fp8`'s
JSON (the bf16 fused layer beside the FP8 one, the weights' quantization) and `caracal_gemm_bench`'s
JSON (the FP8 and bf16 grouped GEMMs of the routed experts, same model, uniform routing).

The FP8 layer can take no less than its GEMMs: the routed experts' FP8 GEMMs as measured, the shared
expert's GEMMs at the routed GEMMs' measured rate in its precision (the layer JSON's
layer.shared_precision: FP8 since 3fb4d8e; bf16 for runs that do not say), and in fwd+bwd the
weights' quantization (once a step: a step of one micro-batch pays all of it). Every
other byte (dispatch, combine, the quantizations of x, dy and the activations) counted free. The
ceiling is the bf16 fused layer's time over that sum: where it is below a target, no fusion reaches
the target, only faster GEMMs (the second ceiling takes them at issue 47's GEMM targets: 1.6x our
bf16 for up/gate, down, dgrad and dx, 1.5x for the weight gradients) or weights quantized once for
several micro-batches (the third: the quantization left out).

Usage: python3 bench/python/fp8_ceiling.py --layer LAYER.json --gemm GEMM.json [--layer ... --gemm ...]
       (each --layer is matched to the --gemm case of its model, uniform routing). Prints a markdown
       table; exits 1 when a JSON lacks a figure it needs.
"""
import argparse
import json
import sys

GEMM_TARGET, WGRAD_TARGET = 1.6, 1.5
FWD_TARGET, FWD_BWD_TARGET = 1.5, 1.35


def fail(message):
    sys.exit(f"fp8_ceiling.py: {message}")


def gemm_cases(paths):
    """{model: the case's results} for the uniform-routing cases of the GEMM bench JSONs."""
    cases = {}
    for path in paths:
        with open(path) as f:
            for case in json.load(f)["cases"]:
                if case["name"].split("/")[1] == "uniform":
                    cases.setdefault(case["model"], case)
    return cases


def ms(results, name, where):
    if name not in results:
        fail(f"{where}: no '{name}' figure")
    return results[name]["ms"]


def ceiling_row(layer_path, cases):
    with open(layer_path) as f:
        layer = json.load(f)
    if layer.get("precision") != "fp8" or layer.get("ep") != 1:
        fail(f"{layer_path}: expected a caracal-bench run at --ep 1 with --precision fp8")
    model, run, shape = layer["model"], layer["runs"][0], layer["layer"]
    if model not in cases:
        fail(f"{layer_path}: no uniform GEMM case of {model} in the --gemm JSONs")
    case = cases[model]
    g = case["results"]
    where = f"GEMM case {case['name']}"
    wgrad_kind = "fp8_wgrad" if layer["layer_options"]["fp8"]["fp8_weight_gradients"] else "wgrad"
    fp8 = {k: ms(g, f"fp8_{k}", where) for k in ("up_gate_swiglu", "down", "dgrad_swiglu", "dx")}
    fp8["wgrad"] = ms(g, wgrad_kind, where)
    bf16 = {k: ms(g, k, where) for k in ("up_gate_swiglu", "down", "dgrad_swiglu", "dx", "wgrad")}
    # The shared expert's GEMMs at the routed GEMMs' rate in its precision (FLOPs over ms, per pass).
    shared_fp8 = shape.get("shared_precision", "bf16") == "fp8"
    rates = fp8 if shared_fp8 else bf16
    rows = sum(case["counts"])
    d, i, si = shape["hidden"], shape["intermediate"], shape["shared_intermediate"] * shape["shared_experts"]
    tokens = run["tokens_per_rank"]  # W = 1: every routed row is one of this rank's tokens
    shared_share = tokens * si / (rows * i)  # shared FLOPs over routed FLOPs, both passes
    shared_fwd = shared_share * (rates["up_gate_swiglu"] + rates["down"])
    shared_bwd = shared_share * (rates["dgrad_swiglu"] + rates["dx"] + rates["wgrad"])
    quant = run["fp8_weight_quantization_ms"]
    bf16_layer = run["bf16_fused"]
    fwd_floor = fp8["up_gate_swiglu"] + fp8["down"] + shared_fwd
    bwd_floor = fp8["dgrad_swiglu"] + fp8["dx"] + fp8["wgrad"] + shared_bwd
    # At the GEMM targets (an FP8 shared expert's GEMMs too).
    routed_at_targets = (sum(bf16[k] for k in ("up_gate_swiglu", "down", "dgrad_swiglu", "dx")) / GEMM_TARGET +
                         bf16["wgrad"] / WGRAD_TARGET)
    routed_fwd_at_targets = (bf16["up_gate_swiglu"] + bf16["down"]) / GEMM_TARGET
    at_targets = routed_at_targets + (shared_share * routed_at_targets if shared_fp8 else shared_fwd + shared_bwd)
    fwd_at_targets = routed_fwd_at_targets + (shared_share * routed_fwd_at_targets if shared_fp8 else shared_fwd)
    b_fwd, b_fb = bf16_layer["forward"]["ms"], bf16_layer["fwd_bwd"]["ms"]
    return {
        "model": model, "experts": shape["local_experts"], "tokens": run["tokens_per_rank"], "device": layer["device"]["name"],
        "bf16_forward_ms": b_fwd, "bf16_fwd_bwd_ms": b_fb,
        "fp8_forward_ms": run["forward"]["ms"], "fp8_fwd_bwd_ms": run["fwd_bwd"]["ms"],
        "gemms_forward_ms": fwd_floor, "gemms_backward_ms": bwd_floor, "shared_fwd_bwd_ms": shared_fwd + shared_bwd,
        "shared_precision": "fp8" if shared_fp8 else "bf16",
        "weights_quantized_ms": quant,
        "measured": (b_fwd / run["forward"]["ms"], b_fb / run["fwd_bwd"]["ms"]),
        "ceiling": (b_fwd / fwd_floor, b_fb / (fwd_floor + bwd_floor + quant)),
        "ceiling_gemm_targets": (b_fwd / fwd_at_targets, b_fb / (at_targets + quant)),
        "ceiling_quantization_amortized": (b_fwd / fwd_floor, b_fb / (fwd_floor + bwd_floor)),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", action="append", required=True, help="caracal-bench --precision fp8 JSON")
    parser.add_argument("--gemm", action="append", required=True, help="caracal_gemm_bench JSON")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    cases = gemm_cases(args.gemm)
    rows = [ceiling_row(path, cases) for path in args.layer]
    print("| layer | FP8 over bf16 fused, measured: fwd / fwd+bwd | ceiling: FP8 GEMMs as measured | at the GEMM "
          "targets | weights quantized once for many micro-batches | FP8 GEMMs fwd / bwd, shared (its precision), "
          "weights quantized ms |")
    print("|---|---|---|---|---|---|")
    fmt = lambda pair: f"{pair[0]:.3f} / {pair[1]:.3f}"  # noqa: E731
    for r in rows:
        print(f"| {r['model']} E{r['experts']} T{r['tokens']} | {fmt(r['measured'])} | {fmt(r['ceiling'])} | "
              f"{fmt(r['ceiling_gemm_targets'])} | {fmt(r['ceiling_quantization_amortized'])} | "
              f"{r['gemms_forward_ms']:.3f} / {r['gemms_backward_ms']:.3f}, {r['shared_fwd_bwd_ms']:.3f} "
              f"{r['shared_precision']}, "
              f"{r['weights_quantized_ms']:.3f} |")
    print(f"\nTargets: forward >= {FWD_TARGET}x, fwd+bwd >= {FWD_BWD_TARGET}x the bf16 fused layer. A ceiling is "
          "the bf16 fused layer's ms over the FP8 layer's GEMMs alone (routed FP8, the shared expert at the "
          "routed GEMMs' rate in its precision, fwd+bwd with the weights' quantization), every other byte free.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "fp8_ceiling.py", "rows": rows}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
