"""caracal.MoE against the plain-PyTorch layer (caracal.reference): outputs and every gradient,
loopback worlds of 1, 2 and 4 ranks, uniform / Zipf / adversarial routing; bitwise determinism."""
import pytest

torch = pytest.importorskip("torch", reason="skipped: PyTorch not installed")

import caracal  # noqa: E402
from caracal.reference import moe_reference, router_gates  # noqa: E402
from routing import make_routing  # noqa: E402

pytestmark = pytest.mark.gpu

SMALL = dict(hidden=128, intermediate=128, num_experts=8, top_k=2, shared_intermediate=64)


def rel_error(actual, expected):
    expected = expected.double()
    return ((actual.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def random_inputs(moe, kind, generator=None, shared_scale=False):
    rows = moe.world.local_ranks * moe.tokens_per_rank
    dev = moe.world.device
    x = (torch.randn(rows, moe.hidden, generator=generator) * 0.5).to(torch.bfloat16).to(dev)
    idx = make_routing(kind, rows, moe.top_k, moe.num_experts, dev, generator)
    scores = torch.rand(rows, moe.top_k, generator=generator).add_(0.05).to(dev)
    dy = (torch.randn(rows, moe.hidden, generator=generator) * 0.5).to(torch.bfloat16).to(dev)
    scale = torch.rand(rows, generator=generator).add_(0.5).to(dev) if shared_scale else None
    return x, idx, scores, dy, scale


def run_caracal(moe, x, idx, scores, dy, scale=None):
    x = x.clone().requires_grad_()
    scores = scores.clone().requires_grad_()
    scale = scale.clone().requires_grad_() if scale is not None else None
    moe.zero_grad(set_to_none=True)
    y = moe(x, idx, scores, scale)
    y.backward(dy)
    moe.check()
    grads = {"x": x.grad, "topk_scores": scores.grad}
    grads.update({name: p.grad for name, p in moe.named_parameters()})
    if scale is not None:
        grads["shared_scale"] = scale.grad
    return y.detach(), grads


def run_reference(moe, x, idx, scores, dy, scale=None):
    x = x.float().requires_grad_()
    scores = scores.clone().requires_grad_()
    scale = scale.clone().requires_grad_() if scale is not None else None
    params = {name: p.detach().float().requires_grad_() for name, p in moe.named_parameters()}
    weights = (params["w_gate_up"], params["w_down"], params.get("shared_w_gate_up"), params.get("shared_w_down"))
    y = moe_reference(x, idx, scores, *weights, scale, normalize=moe.normalize, router_scale=moe.router_scale)
    y.backward(dy.float())
    grads = {"x": x.grad, "topk_scores": scores.grad}
    grads.update({name: p.grad for name, p in params.items()})
    if scale is not None:
        grads["shared_scale"] = scale.grad
    # dL/dg per slot (the gates given directly): the natural size of d_topk_scores, whose own norm
    # can be ~0 (all slots of a token on one expert cancel through the normalization).
    gates = router_gates(idx, scores.detach(), moe.normalize, moe.router_scale).requires_grad_()
    y_gates = moe_reference(x.detach(), idx, gates, *(w.detach() if w is not None else None for w in weights),
                            scale.detach() if scale is not None else None, normalize=False)
    y_gates.backward(dy.float())
    return y.detach(), grads, gates.grad


def poison_allocator():
    """Fills freed blocks of PyTorch's caching allocator with NaN, so that an output element the
    layer fails to write shows up as NaN."""
    blocks = [torch.full((n,), float("nan"), device="cuda") for n in [1 << s for s in range(8, 24)] for _ in range(4)]
    del blocks


def assert_matches(moe, inputs, tol=1e-2):
    poison_allocator()
    y, grads = run_caracal(moe, *inputs)
    y_ref, grads_ref, d_gates = run_reference(moe, *inputs)
    errors = {"y": rel_error(y, y_ref)}
    for name, expected in grads_ref.items():
        floor = d_gates.norm() if name == "topk_scores" else 0.0
        if expected.norm() == 0 and floor == 0:  # exactly zero in the reference (unused experts)
            assert grads[name].abs().max() == 0, name
            continue
        errors[name] = ((grads[name].double() - expected.double()).norm() / max(expected.norm(), floor)).item()
    print({k: f"{v:.2e}" for k, v in errors.items()})
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"relative errors above {tol}: {bad}"


@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("kind", ["uniform", "zipf", "all_to_one", "empty_slots", "empty_rank"])
def test_matches_plain_pytorch(ranks, kind, seed):
    moe = caracal.MoE(tokens_per_rank=96, world=caracal.World.loopback(ranks), router_scale=2.5, **SMALL)
    assert_matches(moe, random_inputs(moe, kind))


@pytest.mark.parametrize("tokens", [1, 37])
def test_odd_sizes_without_shared_expert_or_normalization(tokens, seed):
    moe = caracal.MoE(64, 64, 4, 3, tokens, world=caracal.World.loopback(2), normalize=False)
    assert_matches(moe, random_inputs(moe, "uniform"))


def test_shared_scale_gradient(seed):
    moe = caracal.MoE(tokens_per_rank=64, world=caracal.World.loopback(2), **SMALL)
    assert_matches(moe, random_inputs(moe, "zipf", shared_scale=True))


def test_fp32_parameters(seed):
    moe = caracal.MoE(tokens_per_rank=64, dtype=torch.float32, **SMALL)
    with torch.no_grad():  # bf16-representable, so that the reference sees the kernels' operands
        for p in moe.parameters():
            p.copy_(p.to(torch.bfloat16))
    assert_matches(moe, random_inputs(moe, "uniform"))
    assert all(p.grad.dtype == torch.float32 for p in moe.parameters())


@pytest.mark.parametrize("ranks", [1, 2])
def test_bf16_weight_gradients_are_the_fp32_ones_rounded(ranks, seed):
    world = caracal.World.loopback(ranks)
    bf16 = caracal.MoE(tokens_per_rank=64, world=world, **SMALL)
    fp32 = caracal.MoE(tokens_per_rank=64, world=world, dtype=torch.float32, **SMALL)
    with torch.no_grad():
        for a, b in zip(bf16.parameters(), fp32.parameters()):
            b.copy_(a.float())
    inputs = random_inputs(bf16, "zipf")
    y_bf16, g_bf16 = run_caracal(bf16, *inputs)
    y_fp32, g_fp32 = run_caracal(fp32, *inputs)
    assert torch.equal(y_bf16, y_fp32)
    for name in g_bf16:
        expected = g_fp32[name].to(g_bf16[name].dtype)
        assert torch.equal(g_bf16[name], expected), name


@pytest.mark.parametrize("ranks", [1, 4])
def test_bitwise_identical_runs(ranks, seed):
    moe = caracal.MoE(tokens_per_rank=128, world=caracal.World.loopback(ranks), **SMALL)
    inputs = random_inputs(moe, "zipf")
    y1, g1 = run_caracal(moe, *inputs)
    y2, g2 = run_caracal(moe, *inputs)
    assert torch.equal(y1, y2)
    for name in g1:
        assert torch.equal(g1[name], g2[name]), name


def test_bitwise_identical_across_cta_counts(seed):
    a = caracal.MoE(tokens_per_rank=128, gemm_ctas=0, **SMALL)
    b = caracal.MoE(tokens_per_rank=128, gemm_ctas=7, **SMALL)
    b.load_state_dict(a.state_dict())
    inputs = random_inputs(a, "uniform")
    ya, ga = run_caracal(a, *inputs)
    yb, gb = run_caracal(b, *inputs)
    assert torch.equal(ya, yb)
    for name in ga:
        assert torch.equal(ga[name], gb[name]), name
