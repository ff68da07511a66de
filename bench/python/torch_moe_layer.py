#!/usr/bin/env python3
"""The plain PyTorch MoE layer (DESIGN §6), timed on one GPU: the baseline of `caracal bench`.

One rank's layer as frameworks write it today, with autograd for the backward:
  argsort permute (stable sort of the T*k routes by expert, rows gathered in that order),
  torch._grouped_mm for the routed experts' up/gate and down projections (bf16),
  SwiGLU, unpermute, the weighted sum of each token's k outputs (fp32, one batched product; router
  normalization and scale as the model does), plus the shared expert (dense matmuls).
Default shape: DeepSeek-V3 with 32 local experts and T = 4096 tokens (issue 5's target case,
W = 1). Reports the median forward and forward+backward ms and TFLOP/s, with the FLOPs of
DESIGN §1 (forward 6*T*k*D*I + 6*T*D*Is, backward twice that), as `caracal bench` counts them.

Usage: python3 bench/python/torch_moe_layer.py [--model deepseek-v3] [--experts 32] [--tokens 4096]
                                        [--warmup 5] [--reps 20] [--json OUT.json]
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

# name: (hidden D, intermediate I, top-k, shared I, normalize top-k scores, routed scale)
MODELS = {
    "deepseek-v3": (7168, 2048, 8, 2048, True, 2.5),
    "kimi-k2": (7168, 2048, 8, 2048, True, 2.827),
    "glm-5": (6144, 2048, 8, 2048, True, 2.5),
    "qwen3.5-397b": (4096, 1024, 10, 1024, True, 1.0),
    "qwen3-235b": (4096, 1536, 8, 0, True, 1.0),
    "qwen3-30b-a3b": (2048, 768, 8, 0, True, 1.0),
    "deepseek-v4-pro": (7168, 3072, 6, 3072, True, 2.5),
    "gpt-oss-120b": (2880, 2880, 4, 0, True, 1.0),
}


def median_ms(fn, warmup, reps, warmup_ms=200.0):
    """Median ms of `reps` event-timed calls of fn, after at least `warmup` calls and at least
    `warmup_ms` of them (a GPU coming out of idle needs tens of milliseconds of work to reach its
    boost clock; as bench/baselines/event_timer.hpp warms caracal bench)."""
    calls, warmed_ms, batch = 0, 0.0, max(warmup, 1)
    while calls < warmup or warmed_ms < warmup_ms:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(batch):
            fn()
        end.record()
        end.synchronize()
        calls += batch
        warmed_ms += begin.elapsed_time(end)
        batch *= 2
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, stop in zip(starts, stops):
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(stop) for start, stop in zip(starts, stops))


def swiglu(gate_up, inter):
    return F.silu(gate_up[:, :inter]) * gate_up[:, inter:]


def moe_layer(x, topk_idx, topk_scores, w_gate_up, w_down, shared_w_gate_up, shared_w_down,
              normalize, scale):
    """y[T][D] for one rank. w_gate_up [L][2I][D] (gate rows, then up rows), w_down [L][D][I]."""
    tokens, top_k = topk_idx.shape
    experts, two_i, _ = w_gate_up.shape
    inter = two_i // 2
    # Permute: routes sorted by expert (stable: (token, slot) order within an expert).
    flat = topk_idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    offs = counts.cumsum(0, dtype=torch.int32)
    xs = x.index_select(0, order // top_k)
    # Routed experts: grouped up/gate, SwiGLU, grouped down.
    gate_up = torch._grouped_mm(xs, w_gate_up.transpose(-2, -1), offs=offs)
    out = torch._grouped_mm(swiglu(gate_up, inter), w_down.transpose(-2, -1), offs=offs)
    # Unpermute: back to (token, slot) order.
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    routed = out.index_select(0, inverse).view(tokens, top_k, -1)
    # Gates and each token's weighted sum of its k rows in fp32: one batched product (no loop over
    # the slots; deterministic, unlike an index_add_ of the permuted rows).
    gates = topk_scores / topk_scores.sum(-1, keepdim=True) if normalize else topk_scores
    gates = gates * scale
    y = torch.bmm(gates.unsqueeze(1), routed.float()).squeeze(1)
    if shared_w_gate_up is not None:
        shared_inter = shared_w_gate_up.shape[0] // 2
        shared = F.linear(swiglu(F.linear(x, shared_w_gate_up), shared_inter), shared_w_down)
        y = y + shared.float()
    return y.to(torch.bfloat16)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deepseek-v3", choices=sorted(MODELS))
    parser.add_argument("--experts", type=int, default=32, help="local experts (all on this GPU)")
    parser.add_argument("--tokens", type=int, default=4096, help="T: tokens")
    parser.add_argument("--hidden", type=int, help="D (overrides the model)")
    parser.add_argument("--intermediate", type=int, help="I (overrides the model)")
    parser.add_argument("--top-k", type=int, help="k (overrides the model)")
    parser.add_argument("--shared-intermediate", type=int, help="shared expert I; 0 = none")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    d, inter, top_k, shared_inter, normalize, scale = MODELS[args.model]
    d = args.hidden or d
    inter = args.intermediate or inter
    top_k = args.top_k or top_k
    if args.shared_intermediate is not None:
        shared_inter = args.shared_intermediate
    experts, tokens = args.experts, args.tokens
    if top_k > experts:
        sys.exit(f"torch_moe_layer.py: error: top-k {top_k} > {experts} experts")
    if not torch.cuda.is_available():
        sys.exit("torch_moe_layer.py: error: needs a CUDA GPU")
    if not hasattr(torch, "_grouped_mm"):
        sys.exit(f"torch_moe_layer.py: error: torch {torch.__version__} has no torch._grouped_mm")

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)

    def rand(*shape, lo=-1.0, hi=1.0, dtype=torch.bfloat16):
        return (torch.rand(*shape, device=dev, generator=gen, dtype=torch.float32) * (hi - lo) + lo).to(dtype)

    wd, wi = (3.0 / d) ** 0.5, (3.0 / inter) ** 0.5
    w_gate_up = rand(experts, 2 * inter, d, lo=-wd, hi=wd).requires_grad_()
    w_down = rand(experts, d, inter, lo=-wi, hi=wi).requires_grad_()
    shared_w_gate_up = shared_w_down = None
    if shared_inter > 0:
        ws = (3.0 / shared_inter) ** 0.5
        shared_w_gate_up = rand(2 * shared_inter, d, lo=-wd, hi=wd).requires_grad_()
        shared_w_down = rand(d, shared_inter, lo=-ws, hi=ws).requires_grad_()
    x = rand(tokens, d).requires_grad_()
    dy = rand(tokens, d)
    # Uniform routing: k distinct experts per token.
    topk_idx = torch.rand(tokens, experts, device=dev, generator=gen).argsort(-1)[:, :top_k].contiguous()
    topk_scores = rand(tokens, top_k, lo=0.05, hi=1.0, dtype=torch.float32).requires_grad_()
    params = [p for p in (x, topk_scores, w_gate_up, w_down, shared_w_gate_up, shared_w_down) if p is not None]

    def forward():
        return moe_layer(x, topk_idx, topk_scores, w_gate_up, w_down, shared_w_gate_up, shared_w_down,
                         normalize, scale)

    def forward_backward():
        torch.autograd.grad(forward(), params, dy)

    fwd_flops = 6.0 * tokens * top_k * d * inter + 6.0 * tokens * d * shared_inter
    results = {"tool": "torch_moe_layer.py", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
               "model": args.model, "hidden": d, "intermediate": inter, "experts": experts, "top_k": top_k,
               "shared_intermediate": shared_inter, "tokens": tokens, "warmup": args.warmup, "reps": args.reps}
    fwd_ms = median_ms(forward, args.warmup, args.reps)  # with autograd recording, as in training
    results["forward"] = {"ms": fwd_ms, "tflops": fwd_flops / (fwd_ms * 1e9)}
    try:
        step_ms = median_ms(forward_backward, args.warmup, args.reps)
        results["fwd_bwd"] = {"ms": step_ms, "tflops": 3.0 * fwd_flops / (step_ms * 1e9)}
        results["backward_derived"] = {"ms": step_ms - fwd_ms,
                                       "tflops": 2.0 * fwd_flops / (max(step_ms - fwd_ms, 1e-9) * 1e9)}
    except Exception as e:  # keep the forward figures; report the backward's failure
        results["fwd_bwd"] = None
        results["backward_derived"] = None
        results["fwd_bwd_error"] = f"{type(e).__name__}: {e}"
        print(f"torch_moe_layer.py: error: forward+backward failed: {type(e).__name__}: {e}", file=sys.stderr)

    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: plain PyTorch MoE layer, {args.model} "
          f"D={d} I={inter} k={top_k} shared I={shared_inter}, {experts} experts, T={tokens}")
    for name in ("forward", "fwd_bwd"):
        r = results[name]
        if r:
            print(f"  {name:<8} {r['ms']:9.3f} ms  {r['tflops']:7.1f} TFLOP/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    if results["fwd_bwd"] is None:
        sys.exit(1)


if __name__ == "__main__":
    main()
