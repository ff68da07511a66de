"""The same MoE layer in plain PyTorch (argsort permute + matmuls + autograd): the oracle of the
Python tests. It needs no extension and runs on any device, in `dtype` (float32 by default, so
that the comparison measures Caracal's bf16 rounding only).

With `round_like_kernels=True` (use dtype=torch.float64) it also rounds to bf16 exactly where the
kernels store bf16, forward and backward: the contract F1-F4 / B1-B5 of include/caracal/reference.hpp
(gate/up, hidden, each expert's output row, the scaled shared row, the g-weighted sum of a token's
rows on one rank of `experts_per_rank` experts (F4: combine pushes one row per (token, rank));
d_gate/d_up, each route's dx row; dW_down from bf16(g * hidden)). Outputs compared against it then differ only by fp32
accumulation order, and the final bf16 rounding of y and dx is left to the caller (round_bf16).

Weights use Caracal's layout: w_gate_up [E][2I][D] with gate and up rows interleaved in groups of
8 (see `split_gate_up`), w_down [E][D][I]. Expert parallelism does not change the math, so one call
over all ranks' tokens and all E experts is the reference of the expert-parallel layer.
"""
import torch
import torch.nn.functional as F

GATE_UP_INTERLEAVE = 8  # gemm::kGateUpInterleave


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


def round_bf16(t):
    """t rounded to the nearest bf16 (ties to even), kept in t's dtype."""
    return t.to(torch.bfloat16).to(t.dtype)


class _ContractExpert(torch.autograd.Function):
    """weight * E(x) per row, rounding where the kernels store bf16 (the contract of
    include/caracal/reference.hpp). `round_weighted`: the weighted row itself is stored as bf16
    (the shared expert's row with a per-token scale, F4)."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, weight, round_weighted):
        gate = round_bf16(x @ w_gate.t())                   # F1
        up = round_bf16(x @ w_up.t())                       # F1
        hidden = round_bf16(F.silu(gate) * up)              # F2
        out = round_bf16(hidden @ w_down.t())               # F3: the unweighted row
        ctx.save_for_backward(x, w_gate, w_up, w_down, weight, gate, up, hidden, out)
        ctx.round_weighted = round_weighted
        weighted = weight.unsqueeze(-1) * out
        return round_bf16(weighted) if round_weighted else weighted

    @staticmethod
    def backward(ctx, dy):
        x, w_gate, w_up, w_down, weight, gate, up, hidden, out = ctx.saved_tensors
        down_t_dy = dy @ w_down                                    # W_down^T dy, before the weight
        d_weight = (down_t_dy * hidden).sum(-1)                    # B1: <dy, E(x)>, exact at weight 0
        d_hidden = weight.unsqueeze(-1) * down_t_dy                # B1: not rounded
        sig = torch.sigmoid(gate)
        d_gate = round_bf16(d_hidden * up * sig * (1 + gate * (1 - sig)))   # B2
        d_up = round_bf16(d_hidden * F.silu(gate))                          # B2
        dx = round_bf16(d_gate @ w_gate + d_up @ w_up)                      # B3: the route's dx row
        d_w_gate = d_gate.t() @ x                                           # B5
        d_w_up = d_up.t() @ x
        d_w_down = dy.t() @ round_bf16(weight.unsqueeze(-1) * hidden)       # B5: bf16(w * hidden)
        return dx, d_w_gate, d_w_up, d_w_down, d_weight, None


def _contract_expert(x, w_gate_up, w_down, weight, round_weighted=False):
    gate, up = split_gate_up(w_gate_up)
    return _ContractExpert.apply(x, gate, up, w_down, weight, round_weighted)


def router_gates(topk_idx, topk_scores, normalize=True, router_scale=1.0):
    """g [T][k]: scale * s / (sum of the token's valid scores) or scale * s; 0 for -1 slots, and 0
    for every slot of a token whose valid scores sum to exactly 0 (with normalize)."""
    scores = torch.where(topk_idx >= 0, topk_scores, torch.zeros_like(topk_scores))
    if normalize:
        total = scores.sum(-1, keepdim=True)
        zero = total == 0
        scores = torch.where(zero, torch.zeros_like(scores), scores / torch.where(zero, torch.ones_like(total), total))
    return scores * router_scale


class _GatherGroupedGrad(torch.autograd.Function):
    """rows = x[token_of_row]; the backward sums the rows' gradients per group, rounds the sums of
    the groups marked `rounded` to bf16 (the fused backward's dx per (token, rank), B4 of
    include/caracal/reference.hpp), then sums the groups per token."""

    @staticmethod
    def forward(ctx, x, token_of_row, group_of_row, rounded):
        ctx.save_for_backward(token_of_row, group_of_row, rounded)
        ctx.tokens = x.shape[0]
        return x.index_select(0, token_of_row)

    @staticmethod
    def backward(ctx, grad):
        token_of_row, group_of_row, rounded = ctx.saved_tensors
        groups = rounded.shape[0]
        sums = torch.zeros(groups, grad.shape[-1], dtype=grad.dtype, device=grad.device).index_add(0, group_of_row, grad)
        sums = torch.where(rounded[:, None], round_bf16(sums), sums)
        token_of_group = torch.zeros(groups, dtype=torch.long, device=grad.device).scatter_(0, group_of_row, token_of_row)
        dx = torch.zeros(ctx.tokens, grad.shape[-1], dtype=grad.dtype, device=grad.device)
        return dx.index_add(0, token_of_group, sums), None, None, None


def moe_reference(x, topk_idx, topk_scores, w_gate_up, w_down, shared_w_gate_up=None, shared_w_down=None,
                  shared_scale=None, *, normalize=True, router_scale=1.0, dtype=torch.float32,
                  round_like_kernels=False, experts_per_rank=None, dx_tokens_per_rank=None):
    """y [T][D] in `dtype`: c_t * shared(x_t) + sum over valid slots j of g_j * E_{idx_j}(x_t).
    `round_like_kernels`: round where the kernels store bf16 (see the module's docstring), a
    token's routes to each rank's `experts_per_rank` experts (None: all on one rank) summed and
    rounded as one row; with `dx_tokens_per_rank` (the tokens of each home rank, in order) also a
    token's dx rows from each rank but its home, as the fused backward sums them at W > 1
    (MoELayer::groups_dx_rows)."""
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
    routed_rows = sum(counts[:experts])
    if round_like_kernels and dx_tokens_per_rank:
        per_rank = experts_per_rank or experts
        token = order[:routed_rows] // top_k
        rank = key.index_select(0, order[:routed_rows]) // per_rank
        remote = rank != token // dx_tokens_per_rank
        ranks = -(-experts // per_rank)
        # A group per (token, other rank); the routes to a token's home rank each one of their own.
        unique = tokens * ranks + torch.arange(routed_rows, device=x.device)
        group = torch.where(remote, token * ranks + rank, unique)
        rounded = torch.zeros(tokens * ranks + routed_rows, dtype=torch.bool, device=x.device)
        rounded[group[remote]] = True
        rows = _GatherGroupedGrad.apply(x, token, group, rounded)
    else:
        rows = x.index_select(0, order[:routed_rows] // top_k)
    routed_gates = gates.reshape(-1).index_select(0, order[:sum(counts[:experts])])
    outputs, start = [], 0
    for e in range(experts):
        n = counts[e]
        if round_like_kernels:
            outputs.append(_contract_expert(rows[start:start + n], w_gate_up[e], w_down[e], routed_gates[start:start + n]))
        else:
            outputs.append(_expert(rows[start:start + n], w_gate_up[e], w_down[e]) * routed_gates[start:start + n, None])
        start += n
    # Unpermute: each route's weighted output added to its token (the shared row first, F4).
    routed = torch.cat(outputs)
    y = torch.zeros_like(x)
    if shared_w_gate_up is not None:
        scale = shared_scale.to(dtype) if shared_scale is not None else torch.ones(tokens, dtype=dtype, device=x.device)
        if round_like_kernels:
            y = y + _contract_expert(x, shared_w_gate_up.to(dtype), shared_w_down.to(dtype), scale, True)
        else:
            y = y + _expert(x, shared_w_gate_up.to(dtype), shared_w_down.to(dtype)) * scale.unsqueeze(-1)
    if not round_like_kernels:
        return y.index_add(0, order[:start] // top_k, routed)
    # F4: one bf16 row per (token, rank), rounded in the forward only (the backward is exact: y's
    # rounding is not part of any gradient's contract).
    per_rank = experts_per_rank or experts
    ranks = -(-experts // per_rank)
    group = order[:start] // top_k * ranks + key.index_select(0, order[:start]) // per_rank
    sums = torch.zeros(tokens * ranks, x.shape[-1], dtype=dtype, device=x.device).index_add(0, group, routed)
    sums = sums + (round_bf16(sums) - sums).detach()
    return y + sums.view(tokens, ranks, -1).sum(1)
