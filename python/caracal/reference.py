"""The same MoE layer in plain PyTorch (argsort permute + matmuls + autograd): the oracle of the
Python tests. It needs no extension and runs on any device, in `dtype` (float32 by default, so
that the comparison measures Caracal's bf16 rounding only).

Weights use Caracal's layout: w_gate_up [E][2I][D] with gate and up rows interleaved in groups of
8 (see `split_gate_up`), w_down [E][D][I]. Expert parallelism does not change the math, so one call
over all ranks' tokens and all E experts is the reference of the expert-parallel layer.
"""
import torch
import torch.nn.functional as F

GATE_UP_INTERLEAVE = 8  # kernels::kGateUpInterleave


def split_gate_up(w_gate_up):
    """(gate, up) views of an interleaved [..., 2I, D] matrix, each [..., I, D]."""
    *lead, two_i, d = w_gate_up.shape
    groups = w_gate_up.reshape(*lead, two_i // (2 * GATE_UP_INTERLEAVE), 2, GATE_UP_INTERLEAVE, d)
    return (groups.select(-3, 0).reshape(*lead, two_i // 2, d),
            groups.select(-3, 1).reshape(*lead, two_i // 2, d))


def join_gate_up(w_gate, w_up):
    """The interleaved [..., 2I, D] matrix of separate gate and up [..., I, D] (inverse of split)."""
    *lead, inter, d = w_gate.shape
    g = w_gate.reshape(*lead, inter // GATE_UP_INTERLEAVE, 1, GATE_UP_INTERLEAVE, d)
    u = w_up.reshape(*lead, inter // GATE_UP_INTERLEAVE, 1, GATE_UP_INTERLEAVE, d)
    return torch.cat([g, u], dim=-3).reshape(*lead, 2 * inter, d)


def _expert(x, w_gate_up, w_down):
    gate, up = split_gate_up(w_gate_up)
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), w_down)


def router_gates(topk_idx, topk_scores, normalize=True, router_scale=1.0):
    """g [T][k]: scale * s / (sum of the token's valid scores) or scale * s; 0 for -1 slots."""
    scores = torch.where(topk_idx >= 0, topk_scores, torch.zeros_like(topk_scores))
    if normalize:
        total = scores.sum(-1, keepdim=True)
        scores = scores / torch.where(total == 0, torch.ones_like(total), total)
    return scores * router_scale


def moe_reference(x, topk_idx, topk_scores, w_gate_up, w_down, shared_w_gate_up=None, shared_w_down=None,
                  shared_scale=None, *, normalize=True, router_scale=1.0, dtype=torch.float32):
    """y [T][D] in `dtype`: c_t * shared(x_t) + sum over valid slots j of g_j * E_{idx_j}(x_t)."""
    tokens, top_k = topk_idx.shape
    experts = w_gate_up.shape[0]
    x, w_gate_up, w_down = x.to(dtype), w_gate_up.to(dtype), w_down.to(dtype)
    gates = router_gates(topk_idx, topk_scores.to(dtype), normalize, router_scale)
    # Permute: routes sorted by expert (stable: (token, slot) order within an expert); empty
    # slots (-1) sort last and are dropped.
    flat = topk_idx.reshape(-1).long()
    key = torch.where(flat >= 0, flat, torch.full_like(flat, experts))
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=experts + 1).tolist()
    rows = x.index_select(0, order // top_k)
    outputs, start = [], 0
    for e in range(experts):
        outputs.append(_expert(rows[start:start + counts[e]], w_gate_up[e], w_down[e]))
        start += counts[e]
    routed = torch.cat(outputs) * gates.reshape(-1).index_select(0, order[:start]).unsqueeze(-1)
    # Unpermute: each route's weighted output added to its token.
    y = torch.zeros_like(x).index_add(0, order[:start] // top_k, routed)
    if shared_w_gate_up is not None:
        shared = _expert(x, shared_w_gate_up.to(dtype), shared_w_down.to(dtype))
        if shared_scale is not None:
            shared = shared * shared_scale.to(dtype).unsqueeze(-1)
        y = y + shared
    return y
