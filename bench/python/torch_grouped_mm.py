#!/usr/bin/env python3
"""torch._grouped_mm baseline for caracal_gemm_bench, on the same cases and row counts.

Reads the JSON that `caracal_gemm_bench --json PATH` wrote (shapes and each case's per-expert row
counts), times torch._grouped_mm on the same rows (bf16, offs = cumulative real rows per expert,
weights [L][N][K] contiguous, passed transposed as torch expects), and prints the bench's table
columns, then a comparison with our kernels and cuBLAS from the same JSON.

Timed per case (median of --reps runs, CUDA events, after --warmup runs):
  up          x[rows, D] @ W_gate_up[L, 2I, D]^T                      (grouped_mm only)
  down        hidden[rows, I] @ W_down[L, D, I]^T                     (grouped_mm only)
  forward     up then down (down reads a ready hidden): the "grouped_mm alone" figure
  fwd+swiglu  up, SiLU(gate) * up (eager), down: the unfused equivalent of our forward
  backward    autograd through fwd+swiglu times g (a per-row weight, as the router applies it):
              dx, dW_gate_up, dW_down (bf16, as torch returns them) and dg, for a given dy; twice
              the forward's FLOPs, like ours
Usage: python3 bench/python/torch_grouped_mm.py BENCH.json [--reps 30] [--warmup 5] [--json OUT.json]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

from torch_moe_layer import median_ms


def run_case(case, warmup, reps, seed):
    d, i, experts = case["hidden"], case["intermediate"], case["num_experts"]
    counts = case["counts"]
    rows = sum(counts)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)

    def rand(*shape, scale):
        return (torch.rand(*shape, device=dev, generator=gen, dtype=torch.float32) * 2 - 1).mul_(
            scale).to(torch.bfloat16)

    x = rand(rows, d, scale=1.0)
    w_gate_up = rand(experts, 2 * i, d, scale=(3.0 / d) ** 0.5)  # [L][N][K], K contiguous
    w_down = rand(experts, d, i, scale=(3.0 / i) ** 0.5)
    hidden = rand(rows, i, scale=1.0)
    offs = torch.tensor(counts, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    w_gate_up_t = w_gate_up.transpose(-2, -1)  # [L][K][N] view, as torch._grouped_mm takes it
    w_down_t = w_down.transpose(-2, -1)

    def up():
        return torch._grouped_mm(x, w_gate_up_t, offs=offs)

    def down(h):
        return torch._grouped_mm(h, w_down_t, offs=offs)

    def forward():
        up()
        down(hidden)

    def forward_swiglu():
        gu = up()
        down(F.silu(gu[:, :i]) * gu[:, i:])

    up_flops = 2.0 * rows * d * 2 * i
    down_flops = 2.0 * rows * i * d
    results = {}
    for name, fn, flops in (("up", up, up_flops), ("down", lambda: down(hidden), down_flops),
                            ("forward", forward, up_flops + down_flops),
                            ("forward_swiglu", forward_swiglu, up_flops + down_flops)):
        ms = median_ms(fn, warmup, reps)
        results[name] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}

    # Backward: the graph of one forward, replayed for the gradients of x, g and both weights.
    try:
        xg = x.detach().requires_grad_()
        wgu = w_gate_up.detach().requires_grad_()
        wd = w_down.detach().requires_grad_()
        g = (torch.rand(rows, 1, device=dev, generator=gen, dtype=torch.float32)
             .to(torch.bfloat16).requires_grad_())
        gu = torch._grouped_mm(xg, wgu.transpose(-2, -1), offs=offs)
        y = torch._grouped_mm(F.silu(gu[:, :i]) * gu[:, i:], wd.transpose(-2, -1), offs=offs)
        out = y * g
        dy = rand(rows, d, scale=1.0)
        inputs = (xg, g, wgu, wd)

        def backward():
            torch.autograd.grad(out, inputs, dy, retain_graph=True)

        ms = median_ms(backward, warmup, reps)
        flops = 2.0 * (up_flops + down_flops)
        results["backward"] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}
    except Exception as e:  # keep the forward figures; report the backward's failure
        print(f"{case['name']:<26} torch backward failed: {type(e).__name__}: {e}")
    return results


# Our kernels' timing that each torch figure is compared with, and cuBLAS's.
OURS = {"up": "up_gate_swiglu", "down": "down", "forward": "forward",
        "forward_swiglu": "forward", "backward": "backward"}
CUBLAS = {"up": "cublas_up", "down": "cublas_down", "forward": "cublas_forward",
          "forward_swiglu": "cublas_forward", "backward": "cublas_backward"}


def fmt(value, spec):
    return format(value, spec) if value is not None else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", help="the JSON written by caracal_gemm_bench --json")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--json", help="also write the torch figures here")
    args = parser.parse_args()

    with open(args.bench_json) as f:
        bench = json.load(f)
    assert torch.cuda.is_available(), "torch_grouped_mm.py needs a CUDA GPU"
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: torch._grouped_mm, "
          f"median of {args.reps} runs after {args.warmup} warm-up")
    print(f"{'case':<26} {'rows':>6} {'padded':>6} {'kernel':<22} {'ms':>8} {'TFLOP/s':>8} "
          f"{'padded':>8} {'cuBLAS ms':>9} {'cuBLAS':>8} {'ratio':>7}")
    out_cases = []
    failed = False
    for case in bench["cases"]:
        try:
            results = run_case(case, args.warmup, args.reps, args.seed)
        except Exception as e:  # report and go on with the other cases
            print(f"{case['name']:<26} torch._grouped_mm failed: {type(e).__name__}: {e}")
            failed = True
            out_cases.append({"name": case["name"], "error": str(e)})
            continue
        for n, (kernel, r) in enumerate(results.items()):
            dense = case.get("results", {}).get(CUBLAS[kernel])
            print(f"{case['name'] if n == 0 else '':<26} {case['rows'] if n == 0 else '':>6} "
                  f"{case['padded_rows'] if n == 0 else '':>6} {'torch ' + kernel:<22} "
                  f"{r['ms']:>8.3f} {r['tflops']:>8.1f} {'-':>8} "
                  f"{fmt(dense and dense['ms'], '.3f'):>9} {fmt(dense and dense['tflops'], '.1f'):>8} "
                  f"{fmt(dense and r['tflops'] / dense['tflops'], '.3f'):>7}")
        out_cases.append({"name": case["name"], "results": results})
        case["torch"] = results

    print()
    print("comparison (TFLOP/s on real rows; ours = caracal_gemm_bench, same run)")
    print(f"{'case':<26} {'kernel':<16} {'ours':>7} {'torch':>7} {'cuBLAS':>7} {'ours/torch':>10} "
          f"{'ours/cuBLAS':>11}")
    for case in bench["cases"]:
        if "torch" not in case:
            continue
        for kernel, r in case["torch"].items():
            ours = case["results"].get(OURS[kernel])
            dense = case["results"].get(CUBLAS[kernel])
            o = ours["tflops"] if ours else None
            c = dense["tflops"] if dense else None
            print(f"{case['name']:<26} {kernel:<16} {fmt(o, '.1f'):>7} {r['tflops']:>7.1f} "
                  f"{fmt(c, '.1f'):>7} {fmt(o and o / r['tflops'], '.3f'):>10} "
                  f"{fmt(o and c and o / c, '.3f'):>11}")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                       "warmup": args.warmup, "reps": args.reps, "cases": out_cases}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
