#!/usr/bin/env python3
"""The plain PyTorch FP8 MoE layer (issue 47's baseline), timed on one GPU beside the plain bf16 one.

The torchao recipe for FP8 MoE training ("rowwise"), written with PyTorch ops only, as a framework
would run it without Caracal:
  argsort permute of the T*k routes by expert, each expert's rows padded to 16 (the FP8 grouped
  GEMM's alignment of the weight gradients' K, the tokens), into a buffer of the worst-case size
  (T*k + 15 E rows: no host sync);
  e4m3 codes with fp32 scales: activations and gradients one per row (along the GEMM's K), weights
  one per output row of each expert, the weight gradients' operands one per column and expert (per
  token group, along the tokens);
  torch._scaled_grouped_mm for the up/gate and down projections, both dgrads and both weight
  gradients (bf16 outputs), SwiGLU in bf16; unpermute, the gates and each token's weighted sum and
  the shared expert (bf16 dense) as bench/python/torch_moe_layer.py.
The quantizations (rows, and columns per token group) run through torch.compile (fused elementwise
kernels, as torchao's Triton casts are; `--eager`: PyTorch's ops one by one, several times slower).
`--check` first compares its y and every gradient with the bf16 layer's on the same inputs
(relative Frobenius; FP8 costs a few percent) and exits 1 past --check-bound (0.15).

Usage: python3 bench/python/torch_fp8_moe_layer.py [--model deepseek-v3] [--experts 32] [--tokens 4096]
                                            [--check] [--eager] [--warmup 5] [--reps 20] [--json OUT.json]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_moe_layer import MODELS, median_ms, moe_layer, swiglu  # noqa: E402

E4M3_MAX = 448.0
ALIGN = 16  # rows of a token group: the FP8 grouped GEMM's K alignment (16 bytes of e4m3)
FAST_ACCUM = True  # the tensor cores' own accumulation, as torchao runs its FP8 grouped GEMMs (the faster)


def rowwise(t):
    """e4m3 codes of t with one fp32 scale per row (its last dimension's amax / 448): codes
    t.shape, scales t.shape[:-1]; a value is code * scale."""
    scale = t.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / E4M3_MAX
    codes = (t.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, scale.squeeze(-1)


def per_group_columns(t, group, groups):
    """t [M, C] quantized per column and token group (`group`: each row's, [M]; `groups` for the
    rows past the last group, which no GEMM reads and which may hold anything: the grouped GEMMs
    leave their output rows past the last group unwritten): codes [M, C] and scales [groups, C]
    (the group's column amax / 448)."""
    amax = torch.zeros(groups + 1, t.shape[1], device=t.device, dtype=torch.float32)
    amax.scatter_reduce_(0, group[:, None].expand(-1, t.shape[1]), t.abs().float(), "amax")
    scale = amax.clamp_min(1e-12) / E4M3_MAX
    codes = (t.float() / scale[group]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, scale[:groups].contiguous()


class Fp8GroupedLinear(torch.autograd.Function):
    """y [M, N] = x · w[g]^T for the rows of token group g (rows grouped by `ends`, int32 ends of
    each group; `group` each row's group), w [G, N, K]: the three GEMMs in e4m3."""

    @staticmethod
    def forward(ctx, x, w, ends, group):
        xq, sx = rowwise(x)  # [M, K], [M]
        wq, sw = rowwise(w)  # [G, N, K], [G, N]: B = wq^T is [G, K, N] column-major
        ctx.save_for_backward(x, w, ends, group)
        return torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), sx, sw, offs=ends, out_dtype=torch.bfloat16,
                                        use_fast_accum=FAST_ACCUM)

    @staticmethod
    def backward(ctx, dy):
        x, w, ends, group = ctx.saved_tensors
        dy = dy.contiguous()
        # dx = dy · w[g]: B [G, N, K] column-major is w's transposed copy [G, K, N], one scale per (g, k).
        dyq, sdy = rowwise(dy)
        wtq, swt = rowwise(w.transpose(-2, -1).contiguous())
        dx = torch._scaled_grouped_mm(dyq, wtq.transpose(-2, -1), sdy, swt, offs=ends, out_dtype=torch.bfloat16,
                                      use_fast_accum=FAST_ACCUM)
        # dw[g] = dy_g^T x_g over the group's rows (the K of this GEMM): A = dy^T [N, M] row-major,
        # B = x [M, K] column-major, each scaled per column and group (scales group-major, [G * N]).
        groups = w.shape[0]
        dyc, sdyc = per_group_columns(dy, group, groups)
        xc, sxc = per_group_columns(x, group, groups)
        dw = torch._scaled_grouped_mm(dyc.t().contiguous(), xc.t().contiguous().t(), sdyc.reshape(-1),
                                      sxc.reshape(-1), offs=ends, out_dtype=torch.bfloat16, use_fast_accum=FAST_ACCUM)
        return dx, dw.to(w.dtype), None, None


def fp8_moe_layer(x, topk_idx, topk_scores, w_gate_up, w_down, shared_w_gate_up, shared_w_down, normalize, scale):
    """y[T][D] for one rank, the routed experts in FP8. w_gate_up [L][2I][D] (gate rows, then up
    rows), w_down [L][D][I]."""
    tokens, top_k = topk_idx.shape
    experts = w_gate_up.shape[0]
    inter = w_gate_up.shape[1] // 2
    # Every padded schedule fits; a multiple of 16 (the row strides of the weight gradients' operands).
    rows = (tokens * top_k + experts * (ALIGN - 1) + ALIGN - 1) // ALIGN * ALIGN
    flat = topk_idx.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    padded = (counts + ALIGN - 1) // ALIGN * ALIGN
    ends = padded.cumsum(0)
    sorted_experts = flat[order]
    rank = torch.arange(flat.numel(), device=flat.device) - (counts.cumsum(0) - counts)[sorted_experts]
    dest = (ends - padded)[sorted_experts] + rank  # each sorted route's padded row
    # Each buffer row's token group; `experts` past the last (rows that hold no route).
    group = torch.searchsorted(ends, torch.arange(rows, device=flat.device), right=True)
    xs = torch.zeros(rows, x.shape[1], dtype=x.dtype, device=x.device).index_copy(
        0, dest, x.index_select(0, order // top_k))
    ends = ends.to(torch.int32)
    gate_up = Fp8GroupedLinear.apply(xs, w_gate_up, ends, group)
    out = Fp8GroupedLinear.apply(swiglu(gate_up, inter), w_down, ends, group)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    routed = out.index_select(0, dest).index_select(0, inverse).view(tokens, top_k, -1)
    gates = topk_scores / topk_scores.sum(-1, keepdim=True) if normalize else topk_scores
    gates = gates * scale
    y = torch.bmm(gates.unsqueeze(1), routed.float()).squeeze(1)
    if shared_w_gate_up is not None:
        shared_inter = shared_w_gate_up.shape[0] // 2
        shared = torch.nn.functional.linear(
            swiglu(torch.nn.functional.linear(x, shared_w_gate_up), shared_inter), shared_w_down)
        y = y + shared.float()
    return y.to(torch.bfloat16)


def rel_error(a, b):
    b = b.double()
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deepseek-v3", choices=sorted(MODELS))
    parser.add_argument("--experts", type=int, default=32, help="local experts (all on this GPU)")
    parser.add_argument("--tokens", type=int, default=4096, help="T: tokens")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--check", action="store_true", help="compare with the bf16 layer first")
    parser.add_argument("--check-bound", type=float, default=0.15)
    parser.add_argument("--eager", action="store_true", help="the quantizations without torch.compile")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    d, inter, top_k, shared_inter, normalize, scale = MODELS[args.model]
    experts, tokens = args.experts, args.tokens
    if not torch.cuda.is_available():
        sys.exit("torch_fp8_moe_layer.py: error: needs a CUDA GPU")
    if not hasattr(torch, "_scaled_grouped_mm"):
        sys.exit(f"torch_fp8_moe_layer.py: error: torch {torch.__version__} has no torch._scaled_grouped_mm")
    if d % ALIGN or inter % ALIGN:
        sys.exit(f"torch_fp8_moe_layer.py: error: D ({d}) and I ({inter}) must be multiples of {ALIGN}")

    if not args.eager:  # Fp8GroupedLinear looks both up at each call
        global rowwise, per_group_columns
        rowwise, per_group_columns = torch.compile(rowwise), torch.compile(per_group_columns)

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)

    def normal(*shape, std=1.0):
        return (torch.randn(*shape, device=dev, generator=gen) * std).to(torch.bfloat16)

    w_gate_up = normal(experts, 2 * inter, d, std=d ** -0.5).requires_grad_()
    w_down = normal(experts, d, inter, std=inter ** -0.5).requires_grad_()
    shared_w_gate_up = shared_w_down = None
    if shared_inter > 0:
        shared_w_gate_up = normal(2 * shared_inter, d, std=d ** -0.5).requires_grad_()
        shared_w_down = normal(d, shared_inter, std=shared_inter ** -0.5).requires_grad_()
    x = normal(tokens, d).requires_grad_()
    dy = normal(tokens, d)
    topk_idx = torch.rand(tokens, experts, device=dev, generator=gen).argsort(-1)[:, :top_k].contiguous()
    topk_scores = (torch.rand(tokens, top_k, device=dev, generator=gen) * 0.95 + 0.05).requires_grad_()
    params = [p for p in (x, topk_scores, w_gate_up, w_down, shared_w_gate_up, shared_w_down) if p is not None]
    names = ["x", "topk_scores", "w_gate_up", "w_down", "shared_w_gate_up", "shared_w_down"][:len(params)]
    layer_args = (x, topk_idx, topk_scores, w_gate_up, w_down, shared_w_gate_up, shared_w_down, normalize, scale)

    results = {"tool": "torch_fp8_moe_layer.py", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
               "model": args.model, "hidden": d, "intermediate": inter, "experts": experts, "top_k": top_k,
               "shared_intermediate": shared_inter, "tokens": tokens, "warmup": args.warmup, "reps": args.reps,
               "quantizations": "eager" if args.eager else "torch.compile"}
    if args.check:
        y8 = fp8_moe_layer(*layer_args)
        g8 = torch.autograd.grad(y8, params, dy)
        y16 = moe_layer(*layer_args)
        g16 = torch.autograd.grad(y16, params, dy)
        errors = {"y": rel_error(y8, y16)}
        errors.update({name: rel_error(a, b) for name, a, b in zip(names, g8, g16)})
        results["fp8_over_bf16_error"] = errors
        print("FP8 against the bf16 layer (relative Frobenius): " +
              ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
        if not all(v <= args.check_bound for v in errors.values()):
            sys.exit(f"torch_fp8_moe_layer.py: FAILED: an error above {args.check_bound}")

    fwd_flops = 6.0 * tokens * top_k * d * inter + 6.0 * tokens * d * shared_inter
    for label, layer in (("fp8", fp8_moe_layer), ("bf16", moe_layer)):
        fwd_ms = median_ms(lambda: layer(*layer_args), args.warmup, args.reps)
        step_ms = median_ms(lambda: torch.autograd.grad(layer(*layer_args), params, dy), args.warmup, args.reps)
        results[label] = {"forward": {"ms": fwd_ms, "tflops": fwd_flops / (fwd_ms * 1e9)},
                          "fwd_bwd": {"ms": step_ms, "tflops": 3.0 * fwd_flops / (step_ms * 1e9)}}
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: plain PyTorch MoE layers, {args.model} "
          f"D={d} I={inter} k={top_k} shared I={shared_inter}, {experts} experts, T={tokens}; FP8 quantizations "
          f"{results['quantizations']}")
    for label in ("fp8", "bf16"):
        for name in ("forward", "fwd_bwd"):
            r = results[label][name]
            print(f"  {label:<4} {name:<8} {r['ms']:9.3f} ms  {r['tflops']:7.1f} TFLOP/s")
    print(f"  fp8 over bf16: forward {results['bf16']['forward']['ms'] / results['fp8']['forward']['ms']:.3f}x, "
          f"fwd+bwd {results['bf16']['fwd_bwd']['ms'] / results['fp8']['fwd_bwd']['ms']:.3f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
