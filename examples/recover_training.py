#!/usr/bin/env python3
"""The training loop that survives a stalled rank without a host sync per step (README: "When a rank
stalls"), on one GPU with a loopback world of two ranks:

    opt = torch.optim.AdamW(model.parameters(), fused=True)
    opt.found_inf = moe.fault_flag()       # 1.0 on the GPU once a cross-rank wait timed out
    for batch in batches:
        while True:
            try:
                train_step(batch)           # forward, backward, opt.step() (skipped on the GPU
                break                       #   when the flag reads 1.0), zero_grad
            except RuntimeError:
                if not moe.faulted():       # not Caracal's abort: a real error
                    raise
                moe.reset()                 # collective; zeroes the flag in stream order
                opt.zero_grad(set_to_none=True)

A stall shows up as a RuntimeError at the first forward or backward the host enqueues after the GPU
recorded it: in the step that stalled (that step is then retried) or in a later one (the stalled
step's update was skipped on the GPU, its batch is lost, the step that raised is retried). Either
way no NaN gradient reaches the weights or the optimizer state, and every update applied is exact.

Here rank 1 is made to arrive late at one barrier of step --stall-at (a test hook standing in for a
rank stalled on the host). The run records, per step, whether the optimizer applied it (read after
the run, not during it), then trains a second model from the same start on exactly the applied
batches without any stall: the two models' weights must be bitwise equal and finite.

Usage: python examples/recover_training.py [--steps 12] [--stall-at 5] [--json out.json]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import caracal  # noqa: E402

HIDDEN, INTERMEDIATE, EXPERTS, TOP_K, TOKENS = 256, 128, 8, 2, 128


class Model(torch.nn.Module):
    """A router and a caracal.MoE on a loopback world of two ranks."""

    def __init__(self, world):
        super().__init__()
        self.router = torch.nn.Linear(HIDDEN, EXPERTS, bias=False, device="cuda", dtype=torch.bfloat16)
        self.moe = caracal.MoE(HIDDEN, INTERMEDIATE, EXPERTS, TOP_K, TOKENS, world=world,
                               shared_intermediate=INTERMEDIATE)

    def forward(self, x):
        scores, idx = torch.topk(torch.softmax(self.router(x).float(), -1), TOP_K)
        return self.moe(x, idx, scores)


def batch(step, ranks):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(ranks * TOKENS, HIDDEN, generator=g).to(torch.bfloat16).cuda()
    target = torch.randn(ranks * TOKENS, HIDDEN, generator=g).to(torch.bfloat16).cuda()
    return x, target


def train_step(model, opt, x, target):
    loss = (model(x).float() - target.float()).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def make(world, state=None):
    model = Model(world)
    if state is not None:
        model.load_state_dict(state)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    opt.found_inf = model.moe.fault_flag()
    return model, opt


def run_with_stall(world, state, steps, stall_at):
    """The loop of the docstring; returns the model and, per step, whether its update was applied."""
    model, opt = make(world, state)
    flag = model.moe.fault_flag()
    applied, retried = [], 0
    for step in range(steps):
        if step == stall_at:
            model.moe.set_timeout(0.2)
            torch.ops.caracal.stall_next_barrier(model.moe._engine.handle, 1, 30.0)
        x, target = batch(step, world.local_ranks)
        while True:
            try:
                train_step(model, opt, x, target)
                applied.append(1.0 - flag)  # in stream order, after the optimizer read the flag
                break
            except RuntimeError:
                if not model.moe.faulted():
                    raise
                model.moe.reset()
                opt.zero_grad(set_to_none=True)
                retried += 1
    model.moe.set_timeout(caracal.world.DEFAULT_TIMEOUT)
    return model, [bool(a.item()) for a in applied], retried


def run_clean(world, state, steps, applied):
    model, opt = make(world, state)
    for step in range(steps):
        if applied[step]:
            train_step(model, opt, *batch(step, world.local_ranks))
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--stall-at", type=int, default=5)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    if not 0 <= args.stall_at < args.steps:
        parser.error(f"--stall-at must be in [0, --steps = {args.steps}), got {args.stall_at}")

    torch.manual_seed(0)
    world = caracal.World.loopback(2)
    state = {k: v.clone() for k, v in Model(world).state_dict().items()}
    stalled, applied, retried = run_with_stall(world, state, args.steps, args.stall_at)
    clean = run_clean(world, state, args.steps, applied)
    torch.cuda.synchronize()

    finite = all(torch.isfinite(p).all().item() for p in stalled.parameters())
    same = all(torch.equal(a, b) for a, b in zip(stalled.state_dict().values(), clean.state_dict().values()))
    skipped = [step for step, a in enumerate(applied) if not a]
    print(f"steps {args.steps}, stall at step {args.stall_at}: updates skipped on the GPU at steps {skipped}, "
          f"{retried} step(s) retried after reset()")
    print(f"weights finite: {finite}; bitwise equal to a clean run on the applied batches: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "stall_at": args.stall_at, "applied": applied, "retried": retried,
                       "skipped": skipped, "finite": finite, "same": same}, f)
    ok = finite and same and retried >= 1 and len(skipped) <= 1 and all(applied[:args.stall_at])
    print("recover training: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
