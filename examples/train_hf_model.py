#!/usr/bin/env python3
"""Trains a small Hugging Face MoE model with its experts on Caracal, and the same model with
transformers' own experts, on the same data (issue 48).

    import caracal.integrations.transformers   # registers "caracal" with transformers
    model = AutoModelForCausalLM.from_config(config, experts_implementation="caracal")

The model: DeepSeek-V3's or Qwen3-MoE's architecture (transformers' own classes, their routers),
random init, a few layers, bf16 on one GPU, AdamW. The data: sequences of a fixed random Markov
"grammar" (each token's successor one of 4 that depend on it; every batch fresh), so the loss falls
from ln(vocab) towards ln(4). Every implementation in --impls trains from the same seed on the
same batches; "caracal" twice, whose two runs must be bitwise equal; its final loss (the mean of
the last 10 steps) must be within --tolerance of grouped_mm's. A PNG of the curves with --plot.

    python3 examples/train_hf_model.py [--arch deepseek-v3|qwen3-moe] [--steps 100]
        [--impls caracal,grouped_mm,eager] [--plot hf_loss.png] [--json hf_loss.json]

Exit status 1 when a check failed or an implementation could not run.
"""
import argparse
import json
import math
import os
import sys
import warnings

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (torch docs)
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import caracal.integrations.transformers  # noqa: E402,F401  registers "caracal"


def model_config(args):
    from transformers import DeepseekV3Config, Qwen3MoeConfig
    common = dict(vocab_size=args.vocab, hidden_size=args.hidden, moe_intermediate_size=args.intermediate,
                  num_hidden_layers=args.layers, num_experts_per_tok=args.top_k, num_attention_heads=4,
                  max_position_embeddings=args.seq_len)
    if args.arch == "deepseek-v3":  # a shared expert, sigmoid router with bias, every layer MoE
        return DeepseekV3Config(**common, intermediate_size=2 * args.hidden, first_k_dense_replace=0,
                                n_routed_experts=args.experts, n_shared_experts=1, n_group=1, topk_group=1,
                                num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16,
                                qk_nope_head_dim=32, v_head_dim=32)
    if args.arch == "qwen3-moe":
        return Qwen3MoeConfig(**common, intermediate_size=2 * args.hidden, num_experts=args.experts,
                              num_key_value_heads=2, head_dim=args.hidden // 4)
    raise ValueError(f"train_hf_model: --arch must be deepseek-v3 or qwen3-moe, got {args.arch!r}")


def synthetic_batches(args, device):
    """[steps] batches of (batch, seq_len + 1) tokens from the Markov grammar."""
    grammar = torch.Generator(device=device).manual_seed(args.seed)
    successors = torch.randint(0, args.vocab, (args.vocab, 4), device=device, generator=grammar)
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    seq = torch.empty(args.steps * args.batch, args.seq_len, dtype=torch.long, device=device)
    seq[:, 0] = torch.randint(0, args.vocab, (seq.shape[0],), device=device, generator=gen)
    for t in range(args.seq_len - 1):
        seq[:, t + 1] = successors[seq[:, t], torch.randint(0, 4, (seq.shape[0],), device=device, generator=gen)]
    return seq.reshape(args.steps, args.batch, args.seq_len)


def train(impl, args, batches, device):
    """The losses of one run; the Caracal warnings it raised (a fallback names why)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(args.seed)
    with torch.device(device), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = AutoModelForCausalLM.from_config(model_config(args), experts_implementation=impl,
                                                 dtype=torch.bfloat16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        losses = []
        for ids in batches:
            optimizer.zero_grad(set_to_none=True)
            loss = model(ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        losses = [x.item() for x in losses]
    return losses, sorted({str(w.message) for w in caught if str(w.message).startswith("caracal:")})


def plot(runs, path, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, losses in runs.items():
        ax.plot(losses, label=label, linewidth=1.2, linestyle="--" if label.endswith("run 2") else "-")
    ax.axhline(math.log(4), color="grey", linewidth=0.8, linestyle=":", label="ln 4")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title(f"{args.arch}: {args.layers} layers, D={args.hidden}, I={args.intermediate}, {args.experts} experts, "
                 f"top-{args.top_k}, {args.batch} x {args.seq_len} tokens/step, bf16, AdamW", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="deepseek-v3")
    p.add_argument("--impls", default="caracal,grouped_mm,eager")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=128)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--tolerance", type=float, default=0.02, help="caracal's final loss against grouped_mm's")
    p.add_argument("--device", default="cuda")
    p.add_argument("--plot", default="")
    p.add_argument("--json", default="")
    args = p.parse_args()
    if args.steps < 10:
        p.error("--steps must be at least 10 (the final loss is the mean of the last 10)")
    model_config(args)  # a bad --arch fails before any training
    device = torch.device(args.device)
    batches = synthetic_batches(args, device)

    runs, notes, failed = {}, {}, []
    for impl in [i for i in args.impls.split(",") if i]:
        for run in (1, 2) if impl == "caracal" else (1,):
            label = f"{impl}, run {run}" if impl == "caracal" else impl
            try:
                runs[label], notes[label] = train(impl, args, batches, device)
            except Exception as e:  # an implementation that cannot run here: say why
                notes[label] = [f"{type(e).__name__}: {e}"]
                failed.append(f"{label} could not run")
            if impl == "caracal" and notes.get(label) and device.type == "cuda":
                failed.append(f"{label} fell back or failed")

    final = {label: sum(losses[-10:]) / 10 for label, losses in runs.items()}
    print(f"\n==== {args.arch}, {args.steps} steps, {device}")
    for label, losses in runs.items():
        note = f"  ({'; '.join(notes[label])})" if notes[label] else ""
        print(f"{label:<18} loss {losses[0]:.4f} -> {losses[-1]:.4f}, last 10 steps {final[label]:.4f}{note}")
    for label, note in notes.items():
        if label not in runs:
            print(f"{label:<18} FAILED: {'; '.join(note)}")
    if "caracal, run 1" in runs and "caracal, run 2" in runs:
        identical = runs["caracal, run 1"] == runs["caracal, run 2"]
        print(f"two caracal runs bitwise equal: {'yes' if identical else 'NO'}")
        if not identical:
            failed.append("caracal's two runs differ")
    if "caracal, run 1" in final and "grouped_mm" in final:
        gap = final["caracal, run 1"] / final["grouped_mm"] - 1
        print(f"caracal's final loss against grouped_mm's: {gap:+.2%} (tolerance {args.tolerance:.0%})")
        if abs(gap) > args.tolerance:
            failed.append(f"final loss {gap:+.2%} from grouped_mm's")
    if args.plot and runs:
        plot(runs, args.plot, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "losses": runs, "notes": notes, "final": final}, f, indent=1)
    print("FAILED: " + ", ".join(failed) if failed else "all passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
