"""The oracle itself (caracal.reference, plain PyTorch): checked on the CPU against a direct
per-token loop in float64, so the GPU tests compare against something known to be right."""
import pytest

from gpu_requirements import SKIP_MARKER

torch = pytest.importorskip("torch", reason=SKIP_MARKER + "PyTorch not installed")
import torch.nn.functional as F  # noqa: E402

from caracal.reference import join_gate_up, moe_reference, split_gate_up  # noqa: E402
from routing import make_routing  # noqa: E402


def test_split_and_join_gate_up_are_inverse():
    gate, up = torch.randn(3, 32, 5), torch.randn(3, 32, 5)
    w = join_gate_up(gate, up)
    assert w.shape == (3, 64, 5)
    assert torch.equal(w[1, 8:16], up[1, 0:8]) and torch.equal(w[1, 16:24], gate[1, 8:16])
    g, u = split_gate_up(w)
    assert torch.equal(g, gate) and torch.equal(u, up)


def direct_layer(x, idx, scores, w_gate_up, w_down, shared, scale, normalize, router_scale):
    """y_t = c_t * shared(x_t) + sum over valid slots of g_j * E_j(x_t), token by token."""
    def expert(v, wgu, wd):
        gate, up = split_gate_up(wgu)
        return wd @ (F.silu(gate @ v) * (up @ v))

    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        valid = [j for j in range(idx.shape[1]) if idx[t, j] >= 0]
        total = sum(scores[t, j] for j in valid) if normalize else 1.0
        for j in valid:
            y[t] += router_scale * scores[t, j] / total * expert(x[t], w_gate_up[idx[t, j]], w_down[idx[t, j]])
        if shared is not None:
            y[t] += (scale[t] if scale is not None else 1.0) * expert(x[t], *shared)
    return y


@pytest.mark.parametrize("kind", ["uniform", "zipf", "all_to_one", "empty_slots"])
@pytest.mark.parametrize("normalize", [True, False])
def test_reference_matches_direct_loop(kind, normalize):
    g = torch.Generator().manual_seed(7)
    tokens, top_k, experts, d, inter = 23, 3, 6, 16, 16
    f64 = dict(dtype=torch.float64)
    x = torch.randn(tokens, d, generator=g, **f64)
    idx = make_routing(kind, tokens, top_k, experts, "cpu", g)
    scores = torch.rand(tokens, top_k, generator=g, **f64) + 0.1
    w_gate_up = torch.randn(experts, 2 * inter, d, generator=g, **f64) / 4
    w_down = torch.randn(experts, d, inter, generator=g, **f64) / 4
    shared = (torch.randn(2 * inter, d, generator=g, **f64) / 4, torch.randn(d, inter, generator=g, **f64) / 4)
    scale = torch.rand(tokens, generator=g, **f64)
    y = moe_reference(x, idx, scores, w_gate_up, w_down, *shared, scale, normalize=normalize, router_scale=2.5,
                      dtype=torch.float64)
    expected = direct_layer(x, idx, scores, w_gate_up, w_down, shared, scale, normalize, 2.5)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


def test_round_like_kernels_rounds_but_stays_the_same_layer():
    """The contract mode differs from the exact layer only by bf16 roundings (~1e-3 relative) and
    runs backward through its own formulas: the gradients stay that close too."""
    torch.manual_seed(3)
    t, d, i, e, k = 24, 32, 16, 4, 2
    x = torch.randn(t, d, dtype=torch.float64)
    idx = make_routing("uniform", t, k, e, "cpu", None)
    scores = torch.rand(t, k, dtype=torch.float64) + 0.1
    w_gate_up = torch.randn(e, 2 * i, d, dtype=torch.float64) / d ** 0.5
    w_down = torch.randn(e, d, i, dtype=torch.float64) / i ** 0.5
    shared = (torch.randn(2 * i, d, dtype=torch.float64) / d ** 0.5, torch.randn(d, i, dtype=torch.float64) / i ** 0.5)
    scale = torch.rand(t, dtype=torch.float64) + 0.5
    runs = []
    for contract in (False, True):
        leaves = [v.clone().requires_grad_() for v in (x, scores, w_gate_up, w_down, *shared, scale)]
        y = moe_reference(leaves[0], idx, leaves[1], *leaves[2:6], leaves[6], dtype=torch.float64,
                          round_like_kernels=contract)
        y.backward(torch.ones_like(y))
        runs.append([y.detach()] + [v.grad for v in leaves])
    for exact, rounded in zip(*runs):
        rel = ((rounded - exact).norm() / exact.norm()).item()
        assert 0 < rel < 2e-2, rel


def test_round_like_kernels_rounds_one_row_per_token_and_rank():
    """F4: a token's weighted rows on one rank (experts_per_rank experts each) are summed and rounded
    to bf16 once, as combine pushes them; each rank's row is then added. Unnormalized gates, so
    that a slot can be left out without changing the other's weight."""
    torch.manual_seed(5)
    t, d, i, e = 16, 32, 16, 4
    x = torch.randn(t, d, dtype=torch.float64)
    idx = torch.stack([torch.randint(0, 2, (t,)), torch.randint(2, 4, (t,))], dim=1).int()  # ranks 0 and 1
    scores = torch.rand(t, 2, dtype=torch.float64) + 0.1
    w_gate_up = torch.randn(e, 2 * i, d, dtype=torch.float64) / d ** 0.5
    w_down = torch.randn(e, d, i, dtype=torch.float64) / i ** 0.5
    run = dict(normalize=False, router_scale=1.5, dtype=torch.float64, round_like_kernels=True)

    def y(ids, experts_per_rank):
        return moe_reference(x, ids, scores, w_gate_up, w_down, experts_per_rank=experts_per_rank, **run)

    alone = [y(torch.where(torch.arange(2) == j, idx, torch.full_like(idx, -1)), 1) for j in range(2)]
    for a in alone:  # one route: its row rounded to bf16
        assert torch.equal(a, a.to(torch.bfloat16).double())
    two_ranks = y(idx, 2)
    assert torch.equal(two_ranks, alone[0] + alone[1])
    one_rank = y(idx, None)  # both routes on one rank: one rounding of their sum
    assert torch.equal(one_rank, one_rank.to(torch.bfloat16).double())
    assert not torch.equal(one_rank, two_ranks)
    # Both round the same two rows' sum, at most a few bf16 steps of those rows apart.
    assert ((one_rank - two_ranks).abs() <= 2.0 ** -7 * (alone[0].abs() + alone[1].abs())).all()
