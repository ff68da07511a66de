#!/usr/bin/env python3
"""Hugging Face models training with Caracal's experts against transformers' own (issue 48).

A causal LM of a few layers shaped like a real model's EP8 slice (every layer MoE, the experts one
GPU holds), bf16 on one device, built once per experts implementation ("caracal", "grouped_mm",
"eager") from the same seed, so every implementation trains the same weights on the same tokens:
  - the training step (forward, backward, AdamW step), median over --reps steps, as tokens/s;
  - the experts alone ("the MoE layers' time"): each layer's experts module forward + backward on
    the inputs the model gave it (captured from one step: hidden states, top_k_index,
    top_k_weights), median over --reps, summed over the layers.
Then each implementation against grouped_mm, and the experts' share of the step, a table last;
with --profile, one more step per implementation under torch.profiler: the GPU's busy time, the
span of its work and the idle time between (a step whose host cannot keep the GPU fed shows idle).

Usage: python3 bench/python/hf_train_bench.py [--model deepseek-v3|qwen3-30b-a3b|tiny] [--layers 3]
           [--batch 4] [--seq 1024] [--impls caracal,grouped_mm,eager] [--warmup 3] [--reps 10]
           [--device cuda] [--json OUT.json] [--profile]
Exit status 1 when an implementation failed to run, or "caracal" fell back to the model's own
experts on a GPU (its row says why).
"""
import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

VOCAB = 32768


def model_config(name, layers, seq):
    """The transformers config of `name`'s EP8 slice with `layers` MoE layers."""
    from transformers import DeepseekV3Config, Qwen3MoeConfig
    if name == "deepseek-v3":  # D 7168, I 2048, k 8, 32 of 256 experts, one shared expert
        return DeepseekV3Config(vocab_size=VOCAB, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                                num_hidden_layers=layers, first_k_dense_replace=0, n_routed_experts=32,
                                num_experts_per_tok=8, n_shared_experts=1, n_group=1, topk_group=1,
                                routed_scaling_factor=2.5, num_attention_heads=128, num_key_value_heads=128,
                                q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                                v_head_dim=128, max_position_embeddings=seq)
    if name == "qwen3-30b-a3b":  # D 2048, I 768, k 8, all 128 experts
        return Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                              num_hidden_layers=layers, num_experts=128, num_experts_per_tok=8, num_attention_heads=32,
                              num_key_value_heads=4, head_dim=128, max_position_embeddings=seq)
    if name == "tiny":  # the script's own smoke test (any device)
        return Qwen3MoeConfig(vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                              num_hidden_layers=layers, num_experts=8, num_experts_per_tok=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=32, max_position_embeddings=seq)
    raise ValueError(f"hf_train_bench: --model must be deepseek-v3, qwen3-30b-a3b or tiny, got {name!r}")


class Timer:
    """Milliseconds of a callable: CUDA events on a GPU, the host clock on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        begin = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - begin)


def gpu_timeline(step, device):
    """One step under torch.profiler: the GPU's busy time (the union of its kernels' and copies'
    intervals), the span from the first to the last, and their count; on the CPU, None."""
    if device.type != "cuda":
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy, span = busy_and_span(spans)
    return {"gpu_busy_ms": busy / 1e3, "gpu_span_ms": span / 1e3, "gpu_idle_ms": (span - busy) / 1e3,
            "gpu_events": len(spans)}


def busy_and_span(intervals):
    """The length of the union of [start, end) intervals, and from the first start to the last end."""
    busy, span, ordered = 0.0, 0.0, sorted(intervals)
    if ordered:
        open_start, open_end = ordered[0]
        for start, end in ordered[1:]:
            if start > open_end:
                busy += open_end - open_start
                open_start, open_end = start, end
            else:
                open_end = max(open_end, end)
        busy += open_end - open_start
        span = max(end for _, end in ordered) - ordered[0][0]
    return busy, span


def experts_modules(model):
    return [m for _, m in model.named_modules() if isinstance(getattr(m, "gate_up_proj", None), torch.Tensor)]


def capture_experts_inputs(model, ids):
    """Each experts module's (hidden_states, top_k_index, top_k_weights) in one forward of `ids`."""
    seen, hooks = [], []
    for module in experts_modules(model):
        def hook(m, args, kwargs):
            hidden, index, weights = (list(args) + [kwargs.get(k) for k in ("top_k_index", "top_k_weights")])[:3]
            seen.append((m, hidden.detach().clone(), index.clone(), weights.detach().clone()))
        hooks.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return seen


def bench_impl(impl, args, device, ids, timer):
    """One implementation's row: step and experts times, or the reason it could not run."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(args.seed)
    config = model_config(args.model, args.layers, args.seq)
    with torch.device(device), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = AutoModelForCausalLM.from_config(config, experts_implementation=impl, dtype=torch.bfloat16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def step():
            optimizer.zero_grad(set_to_none=True)
            model(ids, labels=ids).loss.backward()
            optimizer.step()

        for _ in range(args.warmup):
            step()
        steps = [timer(step) for _ in range(args.reps)]
        timeline = gpu_timeline(step, device) if args.profile else None

        layers = capture_experts_inputs(model, ids)
        dys = [torch.randn_like(hidden) for _, hidden, _, _ in layers]

        def experts_pass(i):
            module, hidden, index, weights = layers[i]
            h, w = hidden.clone().requires_grad_(), weights.clone().requires_grad_()
            module(h, index, w).backward(dys[i])

        for i in range(len(layers)):
            for _ in range(args.warmup):
                experts_pass(i)
        experts = sum(statistics.median(timer(lambda: experts_pass(i)) for _ in range(args.reps))
                      for i in range(len(layers)))
    fell_back = sorted({str(w.message) for w in caught if str(w.message).startswith("caracal:")})
    tokens = ids.numel()
    step_ms = statistics.median(steps)
    row = {"impl": impl, "step_ms": step_ms, "steps_ms": steps, "tokens_per_s": tokens / step_ms * 1e3,
           "experts_ms": experts, "experts_layers": len(layers), "fell_back": fell_back}
    if timeline is not None:
        row["timeline"] = timeline
    del model, optimizer, layers
    if device.type == "cuda":
        row["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="deepseek-v3")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--impls", default="caracal,grouped_mm,eager")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json")
    parser.add_argument("--profile", action="store_true",
                        help="one more step under torch.profiler: the GPU's busy and idle time in it")
    args = parser.parse_args()
    if args.layers < 1 or args.batch < 1 or args.seq < 1 or args.reps < 1 or args.warmup < 0:
        parser.error("--layers, --batch, --seq and --reps must be positive, --warmup non-negative")
    device = torch.device(args.device)
    import caracal.integrations.transformers  # noqa: F401  registers "caracal"
    model_config(args.model, args.layers, args.seq)  # a bad --model fails before any model is built
    # What the weights, their gradients and AdamW's two states take (bf16: 8 bytes a parameter),
    # counted on the meta device, against the GPU's memory: a run that cannot fit stops here.
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(
            model_config(args.model, args.layers, args.seq), dtype=torch.bfloat16).parameters())
    state_gib = 8 * params / 2**30
    print(f"{args.model}, {args.layers} layers: {params / 1e9:.2f} G parameters, {state_gib:.1f} GiB with their "
          f"gradients and AdamW's states (bf16), before activations")
    if device.type == "cuda":
        total_gib = torch.cuda.get_device_properties(device).total_memory / 2**30
        if state_gib > 0.8 * total_gib:
            print(f"hf_train_bench: {state_gib:.1f} GiB of weights and optimizer state will not fit beside the "
                  f"activations in {total_gib:.0f} GiB: give fewer --layers", file=sys.stderr)
            return 1
    timer = Timer(device)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    vocab = model_config(args.model, args.layers, args.seq).vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.seq), device=device, generator=gen)

    rows, failed = [], []
    for impl in [i for i in args.impls.split(",") if i]:
        try:
            rows.append(bench_impl(impl, args, device, ids, timer))
            if impl == "caracal" and rows[-1]["fell_back"] and device.type == "cuda":
                failed.append(impl)  # timed the model's own forward, not Caracal's: the row says why
        except Exception as e:  # an implementation that cannot run here (a package, the memory): its row says why
            rows.append({"impl": impl, "error": f"{type(e).__name__}: {e}"})
            failed.append(impl)
            if device.type == "cuda":
                torch.cuda.empty_cache()

    base = next((r for r in rows if r["impl"] == "grouped_mm" and "error" not in r), None)
    print(f"\n==== HF training step, {args.model}: {args.layers} MoE layers, {args.batch} x {args.seq} tokens, "
          f"{device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'host'})")
    print(f"{'impl':<12} {'step ms':>9} {'tokens/s':>10} {'experts ms':>11} {'share':>6} "
          f"{'step x':>7} {'experts x':>9}  (x: grouped_mm's time over this one's)")
    for r in rows:
        if "error" in r:
            print(f"{r['impl']:<12} FAILED: {r['error']}")
            continue
        share = r["experts_ms"] / r["step_ms"]
        step_x = base["step_ms"] / r["step_ms"] if base else float("nan")
        experts_x = base["experts_ms"] / r["experts_ms"] if base else float("nan")
        r.update(experts_share=share, step_speedup=step_x, experts_speedup=experts_x)
        note = f"  fell back: {'; '.join(r['fell_back'])}" if r["fell_back"] else ""
        print(f"{r['impl']:<12} {r['step_ms']:9.2f} {r['tokens_per_s']:10.0f} {r['experts_ms']:11.2f} {share:6.2f} "
              f"{step_x:7.3f} {experts_x:9.3f}{note}")
    if args.profile:
        print("\none step under torch.profiler (GPU kernels and copies; idle: the span's time no GPU work covers)")
        for r in rows:
            t = r.get("timeline")
            if "error" in r:
                continue
            if t is None:
                print(f"{r['impl']:<12} no GPU timeline on {device}")
            else:
                print(f"{r['impl']:<12} GPU busy {t['gpu_busy_ms']:8.2f} ms of a {t['gpu_span_ms']:8.2f} ms span, "
                      f"idle {t['gpu_idle_ms']:7.2f} ms, {t['gpu_events']} kernels and copies")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    print("FAILED: " + ", ".join(failed) if failed else "all ran")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
