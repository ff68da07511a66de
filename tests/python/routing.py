"""Routings for the tests: uniform, Zipf-skewed and adversarial (global expert ids, -1 = empty)."""
import torch


def make_routing(kind, rows, top_k, experts, device, generator=None, tokens_per_rank=None):
    """topk_idx [rows, k] int32 of routing `kind`, on `device`."""
    g = generator
    if kind == "uniform":  # k distinct experts per token
        idx = torch.rand(rows, experts, generator=g).argsort(-1)[:, :top_k]
    elif kind == "zipf":  # popular experts first: weight 1/(rank+1)
        weights = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64)
        idx = torch.multinomial(weights.expand(rows, experts), top_k, replacement=False, generator=g)
    elif kind == "all_to_one":  # every route of every rank to expert 0 (repeated in all slots)
        idx = torch.zeros(rows, top_k, dtype=torch.int64)
    elif kind == "empty_slots":  # about a third of the slots are -1, some tokens have none
        idx = torch.rand(rows, experts, generator=g).argsort(-1)[:, :top_k]
        idx[torch.rand(rows, top_k, generator=g) < 0.35] = -1
        idx[::7] = -1
    elif kind == "empty_rank":  # only the first half of the experts are used (the last rank's are empty)
        idx = torch.rand(rows, max(experts // 2, top_k), generator=g).argsort(-1)[:, :top_k]
    else:
        raise ValueError(kind)
    return idx.to(torch.int32).to(device)
