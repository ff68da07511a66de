#!/usr/bin/env python3
"""Trains a small DeepSeek-V3-style MoE transformer on synthetic data with caracal.MoE, twice, and
checks that the two loss curves are bitwise identical; reports tokens/s, memory against the
planner's prediction and (optionally) the same model with the NCCL + PyTorch expert layer of
bench/python/torch_ep_bench.py, or with caracal.MoE in FP8 (`--compare-fp8`: DeepSeek-V3's
block-scaled e4m3 recipe for the routed experts, its final loss within `--fp8-tolerance` of the
bf16 run's); writes a PNG of the losses.

The model: a frozen random token embedding, `--blocks` residual blocks of RMSNorm -> causal
self-attention -> RMSNorm -> router -> caracal.MoE (routed experts + one shared expert), a final
RMSNorm and a linear head predicting the next token. The router is DeepSeek-V3's: sigmoid scores,
the top k of score + balancing bias, gates = the chosen scores normalized (caracal.MoE's
normalize=True) times router_scale, and the bias nudged after every optimizer step towards even
expert loads (auxiliary-loss-free balancing). The data: sequences of a fixed random Markov
"grammar" (each token's successor is one of 4 tokens that depend on it; every micro-batch fresh), so
the loss can fall from ln(vocab) towards ln(4) (or a little below, where a token's 4 successors
repeat one). Expert weights are fp32 masters (cast to bf16 for the kernels); every
optimizer step accumulates `--accum` micro-batches; `--compile` compiles each block on its own.

One process (a loopback world of `--ep` virtual ranks on one GPU):
    python3 examples/train_moe.py [--steps 300] [--plot loss.png] [--json loss.json]
FP8 against bf16 (same seed, same data; the final loss is the mean of the last 10 steps):
    python3 examples/train_moe.py --compare-fp8 --plot fp8_vs_bf16.png
One process per GPU (each rank its own data; replicated parameters' gradients all-reduced):
    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 examples/train_moe.py --compare-torch-ep
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (torch docs)
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # Caracal never uses NVLink multicast
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
sys.path.insert(0, os.path.join(here, "..", "bench", "python"))
import caracal  # noqa: E402


class Attention(torch.nn.Module):
    """Causal multi-head self-attention over [sequences * seq_len, D] rows (plain matmuls:
    deterministic under torch.use_deterministic_algorithms)."""

    def __init__(self, args):
        super().__init__()
        self.heads, self.seq_len = args.heads, args.seq_len
        self.qkv = torch.nn.Linear(args.hidden, 3 * args.hidden, bias=False, device="cuda")
        self.out = torch.nn.Linear(args.hidden, args.hidden, bias=False, device="cuda")
        mask = torch.full((args.seq_len, args.seq_len), float("-inf"), device="cuda").triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        rows, d = x.shape
        q, k, v = self.qkv(x).view(rows // self.seq_len, self.seq_len, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [sequences, heads, seq_len, head_dim]
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + self.mask, dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(rows, d))


class Router(torch.nn.Module):
    """DeepSeek-V3's router: sigmoid scores, experts chosen by score + bias (the bias only
    chooses; the gates come from the scores), the bias balanced outside the gradient."""

    def __init__(self, args):
        super().__init__()
        self.top_k = args.top_k
        self.proj = torch.nn.Linear(args.hidden, args.experts, bias=False, device="cuda")
        self.register_buffer("bias", torch.zeros(args.experts, device="cuda"))

    def forward(self, h):
        scores = torch.sigmoid(self.proj(h))
        idx = torch.topk(scores.detach() + self.bias, self.top_k, dim=-1).indices
        load = F.one_hot(idx, self.bias.numel()).sum((0, 1)).float()  # routes per expert (exact)
        return idx, scores.gather(1, idx), load

    @torch.no_grad()
    def balance(self, load, rate):
        self.bias += rate * torch.sign(load.mean() - load)


class TorchEPExperts(torch.nn.Module):
    """The NCCL + PyTorch expert layer of bench/python/torch_ep_bench.py (all_to_all, torch._grouped_mm),
    with the same parameters as caracal.MoE in its layout (gate rows, then up rows)."""

    def __init__(self, args, world):
        super().__init__()
        local, d, inter = args.experts // world.size, args.hidden, args.intermediate
        self.world, self.scale = world, args.router_scale

        def param(*shape, fan_in):
            return torch.nn.Parameter(torch.empty(*shape, device="cuda").uniform_(-fan_in ** -0.5, fan_in ** -0.5))
        self.w_gate_up, self.w_down = param(local, 2 * inter, d, fan_in=d), param(local, d, inter, fan_in=inter)
        self.shared_w_gate_up, self.shared_w_down = param(2 * inter, d, fan_in=d), param(d, inter, fan_in=inter)

    def forward(self, x, idx, scores):
        from torch_ep_bench import nccl_pytorch_moe
        bf16 = [w.to(torch.bfloat16) for w in (self.w_gate_up, self.w_down, self.shared_w_gate_up, self.shared_w_down)]
        return nccl_pytorch_moe(x, idx.to(torch.int32), scores, bf16[0], bf16[1], bf16[2:], self.world.size, True,
                                self.scale)


class Block(torch.nn.Module):
    def __init__(self, args, world, experts, precision):
        super().__init__()
        self.attn_norm = torch.nn.RMSNorm(args.hidden, device="cuda")
        self.attention = Attention(args)
        self.moe_norm = torch.nn.RMSNorm(args.hidden, device="cuda")
        self.router = Router(args)
        if experts == "caracal":
            self.experts = caracal.MoE(args.hidden, args.intermediate, args.experts, args.top_k, args.tokens,
                                       world=world, shared_intermediate=args.intermediate,
                                       router_scale=args.router_scale, dtype=torch.float32, precision=precision)
        else:
            self.experts = TorchEPExperts(args, world)

    def forward(self, x):
        x = x + self.attention(self.attn_norm(x))
        h = self.moe_norm(x)
        idx, scores, load = self.router(h)
        return x + self.experts(h.to(torch.bfloat16), idx, scores).float(), load


class Model(torch.nn.Module):
    def __init__(self, args, world, experts, precision):
        super().__init__()
        self.register_buffer("embedding", torch.randn(args.vocab, args.hidden, device="cuda"))
        self.blocks = torch.nn.ModuleList(Block(args, world, experts, precision) for _ in range(args.blocks))
        self.norm = torch.nn.RMSNorm(args.hidden, device="cuda")
        self.head = torch.nn.Linear(args.hidden, args.vocab, bias=False, device="cuda")
        self.run_blocks = [torch.compile(b) for b in self.blocks] if args.compile else list(self.blocks)

    def forward(self, tokens):
        x, loads = self.embedding[tokens], []
        for block in self.run_blocks:
            x, load = block(x)
            loads.append(load)
        return self.head(self.norm(x)), torch.stack(loads)


def synthetic_data(args, rank, rows):
    """A fresh micro-batch for every micro-batch of the run (nothing seen twice, so the loss
    cannot fall below the data's entropy by memorizing): next-token pairs from the Markov grammar,
    (inputs, targets), each [micro-batches, rows] (sequences of seq_len one after another). The
    grammar is the same on every rank; the sequences are this rank's."""
    batches = args.steps * args.accum
    grammar = torch.Generator(device="cuda").manual_seed(args.seed)
    successors = torch.randint(0, args.vocab, (args.vocab, 4), device="cuda", generator=grammar)
    gen = torch.Generator(device="cuda").manual_seed(args.seed + 1 + rank)
    sequences = batches * rows // args.seq_len
    seq = torch.empty(sequences, args.seq_len + 1, dtype=torch.long, device="cuda")
    seq[:, 0] = torch.randint(0, args.vocab, (sequences,), device="cuda", generator=gen)
    for t in range(args.seq_len):
        choice = torch.randint(0, 4, (sequences,), device="cuda", generator=gen)
        seq[:, t + 1] = successors[seq[:, t], choice]
    inputs = seq[:, :-1].reshape(batches, rows)
    targets = seq[:, 1:].reshape(batches, rows)
    return inputs, targets


def all_reduce_replicated(model, world):
    """Averages the gradients of the parameters every rank holds a copy of (all but the routed
    experts, which are each rank's own) and sums the expert loads, over the process group."""
    if world.backend != "nccl" or world.size == 1:
        return
    for name, p in model.named_parameters():
        if p.grad is not None and not name.endswith(("experts.w_gate_up", "experts.w_down")):
            dist.all_reduce(p.grad)
            p.grad /= world.size


def train(args, world, experts, precision="bf16"):
    """One training run from args.seed: the loss of every step (this rank's, as Python floats),
    tokens/s over the steps after the first 5, and the peak memory. precision: caracal.MoE's
    (the same parameters and data in either)."""
    torch.manual_seed(args.seed)  # the same replicated parameters on every rank
    model = Model(args, world, experts, precision)
    torch.manual_seed(args.seed + 7919 * (world.rank + 1))  # each rank's own routed experts
    with torch.no_grad():
        for block in model.blocks:
            for w in (block.experts.w_gate_up, block.experts.w_down):
                w.uniform_(-w.shape[-1] ** -0.5, w.shape[-1] ** -0.5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    inputs, targets = synthetic_data(args, world.rank, args.tokens * world.local_ranks)
    torch.cuda.reset_peak_memory_stats()
    losses, start = [], None
    for step in range(args.steps):
        if step == 5:
            torch.cuda.synchronize()
            start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        step_loss, loads = 0.0, 0
        for micro in range(args.accum):
            batch = step * args.accum + micro
            logits, load = model(inputs[batch])
            loss = F.cross_entropy(logits, targets[batch]) / args.accum
            loss.backward()
            step_loss, loads = step_loss + loss.detach(), loads + load
        all_reduce_replicated(model, world)
        optimizer.step()
        if world.backend == "nccl" and world.size > 1:
            dist.all_reduce(loads)
        for block, load in zip(model.blocks, loads):
            block.router.balance(load, args.balance_rate)
        losses.append(step_loss.item())
        if world.rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"  step {step:4d}  loss {losses[-1]:.4f}", flush=True)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = (args.steps - 5) * args.accum * args.tokens * world.local_ranks
    if experts == "caracal":
        for block in model.blocks:
            block.experts.check()
    memory = {"peak_allocated": torch.cuda.max_memory_allocated()}
    if experts == "caracal":
        engines = {id(b.experts._engine): b.experts.memory() for b in model.blocks}
        memory.update(engines=len(engines), engine_heap=sum(m["heap"] for m in engines.values()),
                      engine_local=sum(m["local"] for m in engines.values()) * world.local_ranks)
    return {"losses": losses, "tokens_per_s": tokens / seconds, "memory": memory}


def planner_memory(args, world):
    """`caracal plan`'s bytes on this GPU for one layer of this shape (v1's buffers: the heap per
    rank, the activations of every local rank), or None when the caracal tool is not found
    (CARACAL_CLI or build/caracal)."""
    cli = os.environ.get("CARACAL_CLI") or os.path.join(here, "..", "build", "caracal")
    if not os.path.exists(cli):
        return None
    cmd = [cli, "plan", "--hidden", str(args.hidden), "--intermediate", str(args.intermediate), "--experts",
           str(args.experts), "--top-k", str(args.top_k), "--shared-intermediate", str(args.intermediate), "--ep",
           str(world.size), "--tokens", str(args.tokens), "--json", "--quiet"]
    plan = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["memory_bytes"]
    return {"layer_heap": plan["layer_heap"], "layer_local": plan["layer_local"] * world.local_ranks}


def plot(curves, path, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, losses in curves:
        ax.plot(losses, label=label, linewidth=1.2, linestyle="--" if "run 2" in label else "-")
    ax.axhline(math.log(4), color="grey", linewidth=0.8, linestyle=":", label="ln 4 (the data's entropy is at most this)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title(f"{args.blocks} blocks (attention + MoE), D={args.hidden}, I={args.intermediate}, {args.experts} "
                 f"experts, top-{args.top_k}, shared expert, {args.accum} x {args.tokens} tokens/step/rank",
                 fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def make_world(args):
    if "WORLD_SIZE" in os.environ:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
        return caracal.World.from_process_group()
    if args.compare_torch_ep:
        sys.exit("train_moe.py: error: --compare-torch-ep needs torch.distributed: run under torchrun")
    return caracal.World.loopback(args.ep)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--experts", type=int, default=32, help="routed experts, all ranks together")
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--router-scale", type=float, default=2.5)
    parser.add_argument("--balance-rate", type=float, default=1e-3, help="the router bias's step per update")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per micro-batch per rank")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--ep", type=int, default=1, help="virtual ranks of the loopback world (one process)")
    parser.add_argument("--compile", action="store_true", help="torch.compile each block on its own")
    parser.add_argument("--runs", type=int, default=2, help="identical runs whose losses must match bitwise")
    parser.add_argument("--compare-torch-ep", action="store_true",
                        help="one more run with the NCCL + PyTorch expert layer (torchrun only)")
    parser.add_argument("--compare-fp8", action="store_true",
                        help="one more run with caracal.MoE in FP8 (precision='fp8'), its final loss compared")
    parser.add_argument("--fp8-tolerance", type=float, default=0.01,
                        help="the FP8 run's final loss (mean of the last 10 steps) within this fraction of bf16's")
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--plot", default="train_moe_loss.png", help="the loss plot's path; empty: none")
    parser.add_argument("--json", help="write the loss curves and figures here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("train_moe.py: error: needs a CUDA GPU (Hopper)")
    if args.tokens % args.seq_len or args.hidden % args.heads:
        sys.exit("train_moe.py: error: --tokens must be a multiple of --seq-len and --hidden of --heads")
    torch.use_deterministic_algorithms(True)
    world = make_world(args)
    lead = world.rank == 0

    runs = []
    for run in range(args.runs):
        if lead:
            print(f"run {run + 1}/{args.runs} (caracal.MoE, {world})", flush=True)
        runs.append(train(args, world, "caracal"))
    baseline = None
    if args.compare_torch_ep:
        if lead:
            print("run with the NCCL + PyTorch expert layer", flush=True)
        torch.use_deterministic_algorithms(False)  # its index_select backward has no deterministic kernel
        baseline = train(args, world, "torch_ep")
    fp8 = None
    if args.compare_fp8:
        if lead:
            print(f"run with caracal.MoE in FP8 (precision='fp8', {world})", flush=True)
        fp8 = train(args, world, "caracal", "fp8")

    first = runs[0]["losses"]
    identical = all(r["losses"] == first for r in runs[1:])
    if world.backend == "nccl" and world.size > 1:  # every rank's runs must agree
        flag = torch.tensor([int(identical)], device="cuda")
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        identical = bool(flag.item())
    plan = planner_memory(args, world)
    memory = runs[-1]["memory"]
    falls = first[-1] < 0.5 * first[0]
    fp8_gap = None  # the FP8 run's final loss over bf16's, minus 1 (final: the mean of the last 10 steps)
    if fp8:
        def final(losses):
            return sum(losses[-10:]) / len(losses[-10:])
        fp8_gap = final(fp8["losses"]) / final(first) - 1
    fp8_close = fp8_gap is None or abs(fp8_gap) <= args.fp8_tolerance
    if lead:
        print(f"loss: {first[0]:.4f} at step 0 -> {first[-1]:.4f} at step {args.steps - 1} "
              f"(ln vocab = {math.log(args.vocab):.4f}, ln 4 = {math.log(4):.4f})")
        print(f"{args.runs} runs bitwise identical: {'yes' if identical else 'NO'}")
        print(f"tokens/s per GPU: caracal.MoE {runs[-1]['tokens_per_s']:,.0f}" +
              (f", NCCL + PyTorch experts {baseline['tokens_per_s']:,.0f} "
               f"({runs[-1]['tokens_per_s'] / baseline['tokens_per_s']:.2f}x)" if baseline else ""))
        print(f"memory per GPU: peak allocated {memory['peak_allocated'] / 2**20:,.0f} MiB; the MoE layers' "
              f"{memory['engines']} engine(s): heap {memory['engine_heap'] / 2**20:,.1f} MiB per rank + activations "
              f"{memory['engine_local'] / 2**20:,.1f} MiB" +
              (f" (planner, one layer: heap {plan['layer_heap'] / 2**20:,.1f} MiB per rank + "
               f"{plan['layer_local'] / 2**20:,.1f} MiB)" if plan else " (planner: caracal tool not found)"))
        if fp8:
            print(f"FP8: loss {fp8['losses'][0]:.4f} -> {fp8['losses'][-1]:.4f}; final (mean of the last 10 steps) "
                  f"{fp8_gap:+.3%} of bf16's (tolerance {args.fp8_tolerance:.1%}): "
                  f"{'within' if fp8_close else 'OUTSIDE'}; tokens/s {fp8['tokens_per_s']:,.0f} "
                  f"({fp8['tokens_per_s'] / runs[-1]['tokens_per_s']:.2f}x bf16)")
        curves = [(f"caracal.MoE run {i + 1}", r["losses"]) for i, r in enumerate(runs)]
        if baseline:
            curves.append(("NCCL + PyTorch experts", baseline["losses"]))
        if fp8:
            curves.append(("caracal.MoE FP8", fp8["losses"]))
        if args.plot:
            plot(curves, args.plot, args)
            print(f"plot: {args.plot}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "world": repr(world), "runs": runs, "torch_ep": baseline,
                           "fp8": fp8, "fp8_final_over_bf16": None if fp8_gap is None else 1 + fp8_gap,
                           "identical": identical, "planner": plan}, f)
    world.close()  # collective for NCCL: the engines' communicators and windows
    if world.backend == "nccl":
        dist.destroy_process_group()
    if not (identical and falls and fp8_close):
        sys.exit("train_moe.py: FAILED: " + ("loss did not fall by half; " if not falls else "") +
                 ("runs differ; " if not identical else "") +
                 (f"the FP8 run's final loss is {fp8_gap:+.3%} of bf16's" if not fp8_close else ""))


if __name__ == "__main__":
    main()
