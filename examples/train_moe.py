#!/usr/bin/env python3
"""Trains a small MoE language model on synthetic data on one GPU with caracal.MoE, twice, and
checks that the two loss curves are bitwise identical; writes a PNG of the loss.

The model: a frozen random token embedding, `--blocks` residual blocks of RMSNorm -> router
(softmax, top-k) -> caracal.MoE (routed experts + one shared expert), a final RMSNorm and a
linear head predicting the next token. The data: sequences of a fixed random "grammar" (each
token's successor is drawn from 4 tokens that depend on it), so the loss can fall from ln(vocab)
towards ln(4). Expert weights are fp32 masters (caracal.MoE casts them to bf16 for the kernels).

Usage: python3 examples/train_moe.py [--steps 300] [--plot loss.png] [--json loss.json]
"""
import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (torch docs)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import caracal  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, args, world):
        super().__init__()
        self.top_k = args.top_k
        self.norm = torch.nn.RMSNorm(args.hidden, device="cuda")
        self.router = torch.nn.Linear(args.hidden, args.experts, bias=False, device="cuda")
        self.moe = caracal.MoE(args.hidden, args.intermediate, args.experts, args.top_k, args.tokens, world=world,
                               shared_intermediate=args.intermediate, dtype=torch.float32)

    def forward(self, x):
        h = self.norm(x)
        scores, idx = torch.topk(F.softmax(self.router(h), dim=-1), self.top_k, dim=-1)
        return x + self.moe(h.to(torch.bfloat16), idx, scores).float()


class Model(torch.nn.Module):
    def __init__(self, args, world):
        super().__init__()
        self.register_buffer("embedding", torch.randn(args.vocab, args.hidden, device="cuda"))
        self.blocks = torch.nn.ModuleList(Block(args, world) for _ in range(args.blocks))
        self.norm = torch.nn.RMSNorm(args.hidden, device="cuda")
        self.head = torch.nn.Linear(args.hidden, args.vocab, bias=False, device="cuda")

    def forward(self, tokens):
        x = self.embedding[tokens]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def train(args):
    """One training run from args.seed; returns the loss of every step (Python floats)."""
    torch.manual_seed(args.seed)
    world = caracal.World.loopback(1)
    model = Model(args, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    data = torch.Generator(device="cuda").manual_seed(args.seed + 1)
    successors = torch.randint(0, args.vocab, (args.vocab, 4), device="cuda", generator=data)
    losses = []
    start = time.perf_counter()
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.tokens,), device="cuda", generator=data)
        choice = torch.randint(0, 4, (args.tokens,), device="cuda", generator=data)
        targets = successors[tokens, choice]
        loss = F.cross_entropy(model(tokens), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"  step {step:4d}  loss {losses[-1]:.4f}  ({time.perf_counter() - start:.1f} s)", flush=True)
    for block in model.blocks:
        block.moe.check()
    return losses


def plot(curves, path, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, losses in enumerate(curves):
        ax.plot(losses, label=f"run {i + 1}", linewidth=1.2, linestyle="-" if i == 0 else "--")
    ax.axhline(math.log(4), color="grey", linewidth=0.8, linestyle=":", label="ln 4 (the data's entropy)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title(f"caracal.MoE: {args.blocks} blocks, D={args.hidden}, I={args.intermediate}, "
                 f"{args.experts} experts, top-{args.top_k}, shared expert, T={args.tokens}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per step")
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--runs", type=int, default=2, help="identical runs whose losses must match bitwise")
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--plot", default="train_moe_loss.png")
    parser.add_argument("--json", help="write the loss curves here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("train_moe.py: error: needs a CUDA GPU (Hopper)")
    torch.use_deterministic_algorithms(True)

    curves = []
    for run in range(args.runs):
        print(f"run {run + 1}/{args.runs}", flush=True)
        curves.append(train(args))
    first, last = curves[0], curves[0][-1]
    identical = all(c == first for c in curves[1:])
    print(f"loss: {first[0]:.4f} at step 0 -> {last:.4f} at step {args.steps - 1} "
          f"(ln vocab = {math.log(args.vocab):.4f}, ln 4 = {math.log(4):.4f})")
    print(f"{args.runs} runs bitwise identical: {'yes' if identical else 'NO'}")
    plot(curves, args.plot, args)
    print(f"plot: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "losses": curves, "identical": identical}, f)
    falls = last < 0.5 * first[0]
    if not (identical and falls):
        sys.exit("train_moe.py: FAILED: " + ("loss did not fall by half; " if not falls else "") +
                 ("runs differ" if not identical else ""))


if __name__ == "__main__":
    main()
