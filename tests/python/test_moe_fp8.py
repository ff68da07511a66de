"""caracal.MoE(precision="fp8"): the routed and shared experts in DeepSeek-V3's block-scaled e4m3
recipe on v1's launches. Against the unquantized plain-PyTorch layer (caracal.reference) within what
e4m3 costs; loopback worlds of 1 and 2 ranks, adversarial routings, fp32 master weights; bitwise repeats; an FP8 layer is not the bf16 one;
the FP8 weight gradients against the bf16 GEMMs'; its arguments refused by name."""
import pytest

from gpu_requirements import SKIP_MARKER

torch = pytest.importorskip("torch", reason=SKIP_MARKER + "PyTorch not installed")

import caracal  # noqa: E402
from test_moe_layer import BOUNDS, output_errors, random_inputs, rel_error, run_caracal  # noqa: E402

pytestmark = pytest.mark.gpu

# FP8 needs D, I and the shared I to be multiples of 128.
FP8_SMALL = dict(hidden=256, intermediate=128, num_experts=8, top_k=2, shared_intermediate=128)

# What e4m3 operands cost against the unquantized layer (~2^-4 relative a value, averaged over K):
# the C++ layer's checks::kFp8LayerBounds (~3x the errors test_gpu_moe_layer_fp8 measured on an
# H100: y and dx 6.4% Frobenius, 9.4% the worst row; weight gradients 5.5%), the shared expert's
# weight and scale gradients as the routed experts'.
FP8_BOUNDS = dict(BOUNDS, y=0.19, y_row=0.28, x=0.19, x_row=0.28, topk_scores=0.17, w_gate_up=0.17, w_down=0.17,
                  shared_w_gate_up=0.17, shared_w_down=0.17, shared_scale=0.17)


def assert_fp8_matches(moe, inputs):
    errors = output_errors(moe, inputs)
    print("fp8 errors", {k: f"{v:.2e}" for k, v in errors.items()})
    bad = {k: v for k, v in errors.items() if not v <= FP8_BOUNDS[k]}
    assert not bad, f"errors above their bounds {FP8_BOUNDS}: {bad}"
    return errors


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("kind", ["uniform", "all_to_one", "empty_slots"])
def test_fp8_close_to_the_unquantized_layer(ranks, kind, seed):
    moe = caracal.MoE(tokens_per_rank=96, world=caracal.World.loopback(ranks), router_scale=2.5, precision="fp8",
                      **FP8_SMALL)
    assert_fp8_matches(moe, random_inputs(moe, kind, shared_scale=True))


def test_fp8_with_fp32_master_weights(seed):
    moe = caracal.MoE(tokens_per_rank=64, dtype=torch.float32, precision="fp8", **FP8_SMALL)
    with torch.no_grad():  # bf16-representable masters: the reference then sees the kernels' operands
        for p in moe.parameters():
            p.copy_(p.to(torch.bfloat16))
    assert_fp8_matches(moe, random_inputs(moe, "zipf"))
    assert moe.w_gate_up.grad.dtype == torch.float32


def test_fp8_bitwise_repeats(seed):
    moe = caracal.MoE(tokens_per_rank=96, world=caracal.World.loopback(2), precision="fp8", **FP8_SMALL)
    inputs = random_inputs(moe, "zipf")
    (y1, g1), (y2, g2) = run_caracal(moe, *inputs), run_caracal(moe, *inputs)
    assert torch.equal(y1, y2)
    for name in g1:
        assert torch.equal(g1[name], g2[name]), name


def test_fp8_is_not_the_bf16_layer(seed):
    """The same weights through the bf16 layer: an FP8 layer that ran bf16 would match it to ~1e-3."""
    fp8 = caracal.MoE(tokens_per_rank=96, precision="fp8", **FP8_SMALL)
    bf16 = caracal.MoE(tokens_per_rank=96, fused_forward=False, **FP8_SMALL)  # v1: the FP8 layer's launches
    bf16.load_state_dict(fp8.state_dict())
    inputs = random_inputs(fp8, "uniform")
    (y8, g8), (y16, g16) = run_caracal(fp8, *inputs), run_caracal(bf16, *inputs)
    assert rel_error(y8, y16) > 1e-2
    assert rel_error(g8["w_down"], g16["w_down"]) > 1e-2
    assert rel_error(g8["shared_w_down"], g16["shared_w_down"]) > 1e-2, "the shared expert runs FP8 too"


def test_fp8_weight_gradients_or_the_bf16_gemms(seed):
    """fp8_weight_gradients=False: the routed and shared weight gradients by bf16 GEMMs on the bf16
    rows (an engine of its own); everything else the same bits, the weight gradients apart by what
    quantizing their four operands costs (a few percent)."""
    fp8 = caracal.MoE(tokens_per_rank=96, world=caracal.World.loopback(2), precision="fp8", **FP8_SMALL)
    gemms = caracal.MoE(tokens_per_rank=96, world=fp8.world, precision="fp8", fp8_weight_gradients=False,
                        **FP8_SMALL)
    assert fp8._engine is not gemms._engine
    gemms.load_state_dict(fp8.state_dict())
    inputs = random_inputs(fp8, "zipf", shared_scale=True)
    (y8, g8), (yb, gb) = run_caracal(fp8, *inputs), run_caracal(gemms, *inputs)
    assert torch.equal(y8, yb)
    for name in ("x", "topk_scores", "shared_scale"):
        assert torch.equal(g8[name], gb[name]), name
    for name in ("w_gate_up", "w_down", "shared_w_gate_up", "shared_w_down"):
        difference = rel_error(g8[name], gb[name])
        print(f"{name}: FP8 weight gradients over the bf16 GEMMs' {difference:.2e}")
        assert 0 < difference < 0.1, name


def test_fp8_arguments_are_checked():
    with pytest.raises(ValueError, match="precision must be 'bf16' or 'fp8', got 'fp16'"):
        caracal.MoE(tokens_per_rank=128, precision="fp16", **FP8_SMALL)
    with pytest.raises(ValueError, match="precision 'fp8' needs gate_up_layout 'interleaved'"):
        caracal.MoE(tokens_per_rank=128, precision="fp8", gate_up_layout="halves", **FP8_SMALL)
    with pytest.raises(ValueError, match="multiple of 128 for fp8"):
        caracal.MoE(tokens_per_rank=128, precision="fp8", **dict(FP8_SMALL, intermediate=192))


def test_fp8_weights_quantized_again_only_when_they_change(seed):
    """The layer quantizes its weights once per version of them: an optimizer step (and any in-place
    write) is seen at the next forward, bitwise as a fresh layer with the new weights; unchanged
    weights are not quantized again (a block zeroed behind the layer's back stays zero)."""
    moe = caracal.MoE(tokens_per_rank=64, precision="fp8", **FP8_SMALL)
    x, idx, scores, dy, _ = random_inputs(moe, "uniform")
    opt = torch.optim.SGD(moe.parameters(), lr=0.5)
    run_caracal(moe, x, idx, scores, dy)
    opt.step()
    fresh = caracal.MoE(tokens_per_rank=64, precision="fp8", **FP8_SMALL)
    fresh.load_state_dict(moe.state_dict())
    y_stepped, g_stepped = run_caracal(moe, x, idx, scores, dy)
    y_fresh, g_fresh = run_caracal(fresh, x, idx, scores, dy)
    assert torch.equal(y_stepped, y_fresh), "the optimizer step was not seen"
    for name in g_stepped:
        assert torch.equal(g_stepped[name], g_fresh[name]), name
    with torch.no_grad():
        moe._w_fp8.zero_()  # not the weights: the layer must read the block as it is
        y_zeroed = moe(x, idx, scores)
    assert not torch.equal(y_zeroed, y_stepped), "the layer quantized unchanged weights again"
