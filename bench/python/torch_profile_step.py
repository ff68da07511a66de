"""One forward+backward step of caracal.MoE through PyTorch between cudaProfilerStart and
cudaProfilerStop (for `ncu --profile-from-start off`: scripts/torch-kernel-times.sh), as
bench/python/torch_layer_bench.py times it (autograd.grad over x, the scores and every parameter; uniform
routing on an EP8-sized slice of a model). Before the profiled step it prints the step's median ms
without a profiler, so that the kernels' sum can be set against the step's time (what is left is
the GPU waiting on the host or on itself).

Usage: python3 bench/python/torch_profile_step.py --model deepseek-v3 [--v1] [--tokens 4096] [--side-stream]
"""
import argparse
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import caracal  # noqa: E402
from torch_layer_bench import LOCAL_EXPERTS, step_inputs  # noqa: E402
from torch_moe_layer import MODELS, median_ms  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deepseek-v3", choices=sorted(LOCAL_EXPERTS))
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--v1", action="store_true", help="v1's separate forward launches (fused_forward=False)")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--side-stream", action="store_true",
                        help="run on a stream of its own instead of PyTorch's default (legacy) stream, as caracal-bench does")
    args = parser.parse_args()

    d, inter, top_k, shared_inter, normalize, scale = MODELS[args.model]
    experts, tokens = LOCAL_EXPERTS[args.model], args.tokens
    x, dy, idx, scores = step_inputs(args.model, tokens, torch.Generator(device="cuda").manual_seed(args.seed))
    moe = caracal.MoE(d, inter, experts, top_k, tokens, shared_intermediate=shared_inter, normalize=normalize,
                      router_scale=scale, fused_forward=not args.v1)
    params = [x, scores, *moe.parameters()]

    def step():
        return torch.autograd.grad(moe(x, idx, scores), params, dy)

    if args.side_stream:
        torch.cuda.synchronize()  # the inputs and weights, made on the default stream
        torch.cuda.set_stream(torch.cuda.Stream())
    variant = ("v1" if args.v1 else "fused") + (", side stream" if args.side_stream else "")
    print(f"{args.model} ({variant}): step {median_ms(step, 10, 20):.3f} ms (median of 20, no profiler)", flush=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    step()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    moe.check()
    moe.close()


if __name__ == "__main__":
    main()
