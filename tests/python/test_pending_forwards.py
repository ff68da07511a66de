"""Several forwards of caracal.MoE pending at once, as training loops make them: gradient
accumulation over micro-batches, an eval forward between a forward and its backward, activation
checkpointing, and a stack of layers sharing one engine (each backward but the last one's replays
its forward). Every result is compared bit for bit with the same work done one step at a time."""
import pytest

from gpu_requirements import SKIP_MARKER

torch = pytest.importorskip("torch", reason=SKIP_MARKER + "PyTorch not installed")

import caracal  # noqa: E402
from test_moe_layer import SMALL, assert_matches, random_inputs, run_caracal  # noqa: E402

pytestmark = pytest.mark.gpu


def grads_of(moe, x, scores):
    return [x.grad, scores.grad] + [p.grad for p in moe.parameters()]


def one_step(moe, x, idx, scores, dy):
    """Forward then backward at once: y and the gradients of x, the scores and the weights."""
    y, grads = run_caracal(moe, x, idx, scores, dy)
    return [y, *grads.values()]


def assert_same_bits(got, expected, what):
    assert len(got) == len(expected), f"{what}: {len(got)} tensors against {len(expected)}"
    for i, (a, b) in enumerate(zip(got, expected)):
        assert torch.equal(a, b), f"{what}: tensor {i} differs in {(a != b).sum().item()} of {a.numel()} elements"


@pytest.mark.parametrize("fused_forward", [True, False])
def test_gradient_accumulation_over_pending_micro_batches(fused_forward, seed):
    """Three micro-batches forward, then their backwards in reverse order (each replays its
    forward but the last): each input gradient as in a step of its own, the weight gradients
    their sum."""
    moe = caracal.MoE(tokens_per_rank=64, world=caracal.World.loopback(2), fused_forward=fused_forward, **SMALL)
    batches = [random_inputs(moe, kind)[:4] for kind in ("uniform", "zipf", "all_to_one")]
    alone = [one_step(moe, *b) for b in batches]

    moe.zero_grad(set_to_none=True)
    leaves, outputs = [], []
    for x, idx, scores, _ in batches:
        x, scores = x.clone().requires_grad_(), scores.clone().requires_grad_()
        leaves.append((x, scores))
        outputs.append(moe(x, idx, scores))
    for (_, _, _, dy), y in reversed(list(zip(batches, outputs))):
        y.backward(dy)
    moe.check()
    for i, ((x, scores), y) in enumerate(zip(leaves, outputs)):
        assert_same_bits([y.detach(), x.grad, scores.grad], alone[i][:3], f"micro-batch {i}")
    for p, g0, g1, g2 in zip(moe.parameters(), *(a[3:] for a in alone)):
        assert torch.equal(p.grad, g2 + g1 + g0), "weight gradients: the micro-batches' sum"


def test_eval_forward_between_forward_and_backward(seed):
    moe = caracal.MoE(tokens_per_rank=48, **SMALL)
    x, idx, scores, dy, _ = random_inputs(moe, "zipf")
    expected = one_step(moe, x, idx, scores, dy)
    moe.zero_grad(set_to_none=True)
    x_, scores_ = x.clone().requires_grad_(), scores.clone().requires_grad_()
    y = moe(x_, idx, scores_)
    with torch.no_grad():
        other = random_inputs(moe, "uniform")
        moe(*other[:3])
    y.backward(dy)
    assert_same_bits([y.detach()] + grads_of(moe, x_, scores_), expected, "with an eval forward in between")


@pytest.mark.parametrize("ranks", [1, 2])
def test_activation_checkpointing(ranks, seed):
    """torch.utils.checkpoint (non-reentrant) recomputes the layer before its backward: the same
    bits as without it."""
    moe = caracal.MoE(tokens_per_rank=40, world=caracal.World.loopback(ranks), **SMALL)
    x, idx, scores, dy, _ = random_inputs(moe, "uniform")
    expected = one_step(moe, x, idx, scores, dy)
    moe.zero_grad(set_to_none=True)
    x_, scores_ = x.clone().requires_grad_(), scores.clone().requires_grad_()
    y = torch.utils.checkpoint.checkpoint(moe, x_, idx, scores_, use_reentrant=False)
    y.backward(dy)
    assert_same_bits([y.detach()] + grads_of(moe, x_, scores_), expected, "checkpointed")


def test_stack_of_layers_on_one_engine_matches_separate_engines(seed):
    """Four layers on one World (one engine: three of the four backwards replay) against the same
    four layers each on a World of its own (nothing replayed): the same bits everywhere, and the
    first layer still matches the fp64 reference."""
    def stack(shared_world):
        torch.manual_seed(1234)
        worlds = [shared_world] * 4 if shared_world else [caracal.World.loopback(2) for _ in range(4)]
        return [caracal.MoE(tokens_per_rank=56, world=w, shared_intermediate=64, hidden=128, intermediate=128,
                            num_experts=8, top_k=2) for w in worlds]

    def run(layers):
        x, idx, scores, dy, _ = random_inputs(layers[0], "zipf", generator=torch.Generator().manual_seed(7))
        x = x.clone().requires_grad_()
        scores = scores.clone().requires_grad_()
        h = x
        for layer in layers:
            h = h + layer(h, idx, scores)  # a residual stack; every layer routes the same way
        h.backward(dy)
        return [h.detach(), x.grad, scores.grad] + [p.grad for layer in layers for p in layer.parameters()]

    shared = stack(caracal.World.loopback(2))
    assert all(layer._engine is shared[0]._engine for layer in shared)
    separate = stack(None)
    assert_same_bits(run(shared), run(separate), "one engine vs four")
    assert_matches(shared[0], random_inputs(shared[0], "uniform"))
