"""Caracal: the expert-parallel MoE layer for Hopper GPUs, from PyTorch.

    world = caracal.World.loopback(1)                      # or World.from_process_group()
    moe = caracal.MoE(hidden, intermediate, num_experts, top_k, tokens_per_rank, world=world,
                      shared_intermediate=...)
    y = moe(x, topk_idx, topk_scores)                      # autograd: x, scores, weights

The compiled operators (torch.ops.caracal.*) load on first use; caracal.reference (the same layer
in plain PyTorch) needs no extension.
"""
from . import reference
from .module import MoE
from .world import World

__all__ = ["MoE", "World", "reference"]
__version__ = "0.1.0"
