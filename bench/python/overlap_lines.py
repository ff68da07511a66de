#!/usr/bin/env python3
"""How much of the epilogue-heavy grouped GEMMs' bytes run under their tensor-core time, from
caracal_gemm_bench's JSON (issues 47 and 49: the weight gradients and the dgrad + SwiGLU).

Per case and kernel: the time its FLOPs take at the dense rate (bf16: the same run's cuBLAS GEMM of
that kind, a measured rate; FP8: --fp8-tflops, as no dense FP8 GEMM runs in the bench), the time its
compulsory HBM bytes take at --tbs (every operand read once, every output written once: the
gradients in fp32 or bf16, the dgrad's gate_up read and d_gate_up / g·activation written), and the
two lines a kernel sits between: the floor max(FLOP time, byte time) (bytes wholly under the
wgmmas) and the no-overlap line FLOP time + byte time. "overlap" places the measured kernel between
them: (FLOP + byte - measured) / min(FLOP, byte), clamped to [0, 1]; 0 on the no-overlap line (its
loads and stores after its wgmmas rather than beside them), 1 at the floor. FLOPs count the padded rows
the kernels run (CUTLASS's bf16 baselines run the real rows); scales and the dL/dg sums are left out.

Usage: python3 bench/python/overlap_lines.py --gemm GEMM.json [--gemm ...] [--fp8-tflops 1100]
       [--tbs 3.0] [--case SUBSTRING]
       (several JSONs of one build: each figure the median over them). Prints a markdown table;
       exits 1 when a JSON lacks a figure it needs.
"""
import argparse
import json
import statistics
import sys


def fail(message):
    sys.exit(f"overlap_lines.py: {message}")


def medians(paths, only):
    """{case name: (the case, {kernel: median ms over the runs})}."""
    cases = {}
    for path in paths:
        with open(path) as f:
            for case in json.load(f)["cases"]:
                if only and only not in case["name"]:
                    continue
                entry = cases.setdefault(case["name"], (case, {}))
                for kernel, t in case.get("results", {}).items():
                    entry[1].setdefault(kernel, []).append(t["ms"])
    return {name: (case, {k: statistics.median(v) for k, v in ms.items()}) for name, (case, ms) in cases.items()}


def kernels(case):
    """(label, kernel, rate kernel or None for FP8, FLOPs, bytes) of each epilogue-heavy kernel."""
    D, I, L = case["hidden"], case["intermediate"], case["num_experts"]
    P = case["padded_rows"]
    wgrad_flops = 2.0 * P * D * 3 * I
    dgrad_flops = 2.0 * P * D * I
    grads = L * 3 * I * D  # dW_gate_up and dW_down elements
    wgrad_operands = P * (D + 2 * I + D + I)  # x, d_gate_up, dy, g·activation columns
    dgrad_common = P * 2 * I * 2 + P * 2 * I * 2 + P * I * 2  # gate_up read, d_gate_up and g·act written
    return [
        ("weight gradients, fp32", "wgrad", "cublas_wgrad", wgrad_flops, grads * 4 + wgrad_operands * 2),
        ("weight gradients, bf16", "wgrad_bf16", "cublas_wgrad", wgrad_flops, grads * 2 + wgrad_operands * 2),
        ("FP8 weight gradients, fp32", "fp8_wgrad", None, wgrad_flops, grads * 4 + wgrad_operands),
        ("FP8 weight gradients, bf16", "fp8_wgrad_bf16", None, wgrad_flops, grads * 2 + wgrad_operands),
        ("dgrad + SwiGLU", "dgrad_swiglu", "cublas_dgrad", dgrad_flops, P * D * 2 + L * D * I * 2 + dgrad_common),
        ("FP8 dgrad + SwiGLU", "fp8_dgrad_swiglu", None, dgrad_flops,
         P * D + L * D * I + dgrad_common + P * 2 * I),  # and d_gate_up's e4m3 copy
    ]


def rows(cases, fp8_tflops, tbs):
    out = []
    for name, (case, ms) in cases.items():
        useful = 2.0 * case["rows"] * case["hidden"]
        for label, kernel, rate_kernel, flops, nbytes in kernels(case):
            if kernel not in ms:
                if kernel.startswith("fp8_"):
                    continue  # a run without the FP8 GEMMs
                fail(f"case {name}: no '{kernel}' figure")
            if rate_kernel is None:
                tflops = fp8_tflops
            else:
                if rate_kernel not in ms:
                    fail(f"case {name}: no '{rate_kernel}' figure")
                per_row = 3 * case["intermediate"] if "wgrad" in kernel else case["intermediate"]
                tflops = useful * per_row / (ms[rate_kernel] * 1e-3) / 1e12
            flop_ms = flops / (tflops * 1e12) * 1e3
            byte_ms = nbytes / (tbs * 1e12) * 1e3
            measured = ms[kernel]
            overlap = min(1.0, max(0.0, (flop_ms + byte_ms - measured) / min(flop_ms, byte_ms)))
            out.append({"case": name, "kernel": label, "ms": measured, "tflops": tflops, "flop_ms": flop_ms,
                        "byte_ms": byte_ms, "floor_ms": max(flop_ms, byte_ms), "no_overlap_ms": flop_ms + byte_ms,
                        "overlap": overlap})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemm", action="append", required=True, help="caracal_gemm_bench --json output")
    parser.add_argument("--fp8-tflops", type=float, default=1100.0,
                        help="dense FP8 rate (default 1100: dense cuBLAS FP8 on an H200, issue 47)")
    parser.add_argument("--tbs", type=float, default=3.0, help="HBM bandwidth in TB/s (default 3.0: an H100's)")
    parser.add_argument("--case", help="only cases whose name contains this")
    args = parser.parse_args()
    if args.fp8_tflops <= 0 or args.tbs <= 0:
        fail(f"--fp8-tflops and --tbs must be positive, got {args.fp8_tflops} and {args.tbs}")
    cases = medians(args.gemm, args.case)
    if not cases:
        fail("no case in the inputs" + (f" matches --case {args.case!r}" if args.case else ""))
    print(f"FLOPs at the dense rate (bf16: the run's cuBLAS; FP8: {args.fp8_tflops:.0f} TFLOP/s), "
          f"bytes at {args.tbs:.2f} TB/s")
    print()
    print("| case | kernel | ms | FLOP ms (TFLOP/s) | byte ms | floor | no-overlap line | measured / line | overlap |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows(cases, args.fp8_tflops, args.tbs):
        print(f"| {r['case']} | {r['kernel']} | {r['ms']:.3f} | {r['flop_ms']:.3f} ({r['tflops']:.0f}) | "
              f"{r['byte_ms']:.3f} | {r['floor_ms']:.3f} | {r['no_overlap_ms']:.3f} | "
              f"{r['ms'] / r['no_overlap_ms']:.2f} | {100 * r['overlap']:.0f}% |")


if __name__ == "__main__":
    main()
