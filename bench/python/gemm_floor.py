#!/usr/bin/env python3
"""The floor of each grouped GEMM of the layer at W = 1, from FLOPs and compulsory HBM bytes alone
(issue 49: "count FLOPs and bytes first; know the floor"). Per GEMM kind it prints the FLOPs, the
bytes every operand and output must cross HBM at least once (bf16 rows and weights, weight
gradients in fp32 or bf16), the time of each at the machine's dense tensor rate and copy bandwidth,
and the fraction of the dense rate the GEMM reaches with its bytes wholly under its FLOPs, at best
min(1, FLOP time / byte time), and with none of them overlapped, FLOP / (FLOP + byte time). A GEMM
whose best is below the target fraction cannot reach it by any tiling: only fewer bytes can; one
whose no-overlap figure is below it needs its loads and stores under its tensor-core time.

Then the layer's data movement at W = 1 that is no GEMM's (the forward's combine; the backward's
copies of x and dy into expert order and the reverse dispatch's dx sums), its compulsory bytes and
their time as a share of the pass's GEMM time (the FLOP time over --gemm-efficiency, the fraction
of the dense rate the GEMMs reach: 1 for ideal GEMMs, ~0.62 measured on the fine-grained shape).
A pass held to --pass-target (1.06) x its GEMMs alone cannot meet it with those bytes run apart
once their share exceeds pass-target - 1: they must run under the GEMMs.

Uniform routing: every local expert gets T*k/L rows, padded to the 128-row tile.

Usage: python3 bench/python/gemm_floor.py [--shape NAME | --hidden D --intermediate I --experts L --tokens T --top-k k]
                                  [--tflops 806] [--tbs 4.28] [--bf16-weight-grads] [--target 0.8]
                                  [--gemm-efficiency 1] [--pass-target 1.06] [--json FILE]
"""
import argparse
import json
import math

# name: (D, I, local experts at W = 1, T, k): the fine-grained shapes of issue 49 and two references.
SHAPES = {
    "qwen3-30b-a3b": (2048, 768, 128, 8192, 8),
    "qwen3-30b-a3b-16": (2048, 768, 16, 8192, 8),
    "qwen3-30b-a3b-16-t4096": (2048, 768, 16, 4096, 8),
    "qwen3-235b-16": (4096, 1536, 16, 8192, 8),
    "deepseek-v3-32": (7168, 2048, 32, 4096, 8),
}


def gemms(D, I, L, T, k, weight_grad_bytes):
    """[(name, FLOPs, HBM bytes)] of the layer's grouped GEMMs (bf16 = 2 bytes)."""
    R = math.ceil(T * k / L / 128) * 128  # rows per expert, padded to the tile
    b = 2
    return R, [
        ("up_gate_swiglu", 2 * R * D * 2 * I * L, L * (R * D * b + 2 * I * D * b + R * 2 * I * b + R * I * b)),
        ("down_proj", 2 * R * I * D * L, L * (R * I * b + D * I * b + R * D * b)),
        ("down_dgrad_swiglu", 2 * R * D * I * L, L * (R * D * b + D * I * b + 2 * R * 2 * I * b + R * I * b)),
        ("gate_up_dgrad (dx)", 2 * R * 2 * I * D * L, L * (R * 2 * I * b + 2 * I * D * b + R * D * b)),
        ("weight_grad gate_up", 2 * 2 * I * R * D * L, L * (R * 2 * I * b + R * D * b + 2 * I * D * weight_grad_bytes)),
        ("weight_grad down", 2 * D * R * I * L, L * (R * D * b + R * I * b + D * I * weight_grad_bytes)),
    ]


def data_movement(D, T, k):
    """[(pass, name, HBM bytes)] of the layer's non-GEMM transfers at W = 1 (bf16 rows): each reads
    or writes T*k expert rows and T token rows of D once."""
    token_rows, expert_rows = T * D * 2, T * k * D * 2
    return [
        ("forward", "combine (sum of a token's k rows)", expert_rows + token_rows),
        ("backward", "dy rows into expert order", token_rows + expert_rows),
        ("backward", "x rows into expert order", token_rows + expert_rows),
        ("backward", "reverse dispatch (dx sums)", expert_rows + token_rows),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append",
                        help="a named shape (repeatable; default: all of them)")
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--intermediate", type=int)
    parser.add_argument("--experts", type=int, help="local experts (W = 1: all of them)")
    parser.add_argument("--tokens", type=int)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--tflops", type=float, default=806.0, help="dense bf16 tensor rate (cuBLAS, one H200)")
    parser.add_argument("--tbs", type=float, default=4.28, help="HBM copy bandwidth, read + write, TB/s")
    parser.add_argument("--bf16-weight-grads", action="store_true")
    parser.add_argument("--target", type=float, default=0.80, help="fraction of the dense rate asked for")
    parser.add_argument("--gemm-efficiency", type=float, default=1.0,
                        help="fraction of the dense rate the GEMMs reach, for the passes' shares (1: ideal)")
    parser.add_argument("--pass-target", type=float, default=1.06, help="a pass over its GEMMs alone, at most")
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args()

    custom = [args.hidden, args.intermediate, args.experts, args.tokens]
    if any(v is not None for v in custom):
        if not all(v is not None and v > 0 for v in custom):
            parser.error("--hidden, --intermediate, --experts and --tokens go together, each positive")
        shapes = {"custom": (*custom, args.top_k)}
    else:
        shapes = {name: SHAPES[name] for name in (args.shape or SHAPES)}
    if not 0.0 < args.gemm_efficiency <= 1.0:
        parser.error(f"--gemm-efficiency must be in (0, 1], got {args.gemm_efficiency}")
    wg_bytes = 2 if args.bf16_weight_grads else 4
    flop_rate, byte_rate = args.tflops * 1e12, args.tbs * 1e12
    out = {"tflops": args.tflops, "tbs": args.tbs, "weight_grads": "bf16" if wg_bytes == 2 else "fp32",
           "target": args.target, "gemm_efficiency": args.gemm_efficiency, "pass_target": args.pass_target,
           "shapes": []}
    below = []
    for name, (D, I, L, T, k) in shapes.items():
        R, rows = gemms(D, I, L, T, k, wg_bytes)
        print(f"{name}: D {D}, I {I}, {L} local experts, T {T}, k {k}: {R} rows per expert")
        print(f"  {'GEMM':<22}{'GFLOP':>8}{'MB':>9}{'flop us':>9}{'byte us':>9}{'best of dense':>15}{'no overlap':>12}")
        shape = {"name": name, "hidden": D, "intermediate": I, "local_experts": L, "tokens": T, "top_k": k,
                 "rows_per_expert": R, "gemms": []}
        for gemm, flops, nbytes in rows:
            t_flop, t_byte = flops / flop_rate * 1e6, nbytes / byte_rate * 1e6
            best, serial = min(1.0, t_flop / t_byte), t_flop / (t_flop + t_byte)
            mark = "  below target" if best < args.target else ""
            if best < args.target:
                below.append(f"{name} {gemm}")
            print(f"  {gemm:<22}{flops / 1e9:8.1f}{nbytes / 1e6:9.1f}{t_flop:9.1f}{t_byte:9.1f}{best:15.2f}"
                  f"{serial:12.2f}{mark}")
            shape["gemms"].append({"gemm": gemm, "flops": flops, "bytes": nbytes, "flop_us": t_flop,
                                   "byte_us": t_byte, "best_fraction_of_dense": best,
                                   "no_overlap_fraction_of_dense": serial})
        gemm_us = {"forward": sum(f for g, f, _ in rows[:2]) / flop_rate * 1e6 / args.gemm_efficiency,
                   "backward": sum(f for g, f, _ in rows[2:]) / flop_rate * 1e6 / args.gemm_efficiency}
        moved = {"forward": 0.0, "backward": 0.0}
        shape["data_movement"] = []
        for phase, what, nbytes in data_movement(D, T, k):
            t_byte = nbytes / byte_rate * 1e6
            moved[phase] += t_byte
            shape["data_movement"].append({"pass": phase, "what": what, "bytes": nbytes, "byte_us": t_byte})
        for phase in ("forward", "backward"):
            share = moved[phase] / gemm_us[phase]
            verdict = "must run under the GEMMs" if share > args.pass_target - 1.0 else "may run apart"
            if share > args.pass_target - 1.0:
                below.append(f"{name} {phase} data movement apart")
            print(f"  {phase} data movement (not GEMMs): {moved[phase]:.1f} us = {share:.1%} of its GEMMs' "
                  f"{gemm_us[phase]:.1f} us: {verdict} for {args.pass_target:g}x")
            shape[f"{phase}_gemm_us"] = gemm_us[phase]
            shape[f"{phase}_data_movement_share"] = share
        out["shapes"].append(shape)
    print(f"best of dense: FLOP time over max(FLOP time, byte time); no overlap: over their sum; at {args.tflops:g} "
          f"TFLOP/s and {args.tbs:g} TB/s, {out['weight_grads']} weight gradients; passes' GEMMs at "
          f"{args.gemm_efficiency:g} of the dense rate")
    print("below target (or data movement that cannot run apart): " + (", ".join(below) if below else "none"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
