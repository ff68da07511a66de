"""caracal.integrations.transformers: "caracal" as a Hugging Face transformers experts
implementation. Without a GPU: the registration, the module's own forward (bit for bit the eager
one) with one warning naming why wherever Caracal does not run, every unsupported variant named,
the capacity rule, save_pretrained / from_pretrained bit for bit.
On the GPU: tiny random-init DeepSeek-V3 and Qwen3-MoE models against the eager experts in fp32 and
against "grouped_mm" in bf16 (logits, loss, every expert weight's gradient), two runs bitwise,
token counts that change between calls, gradient accumulation, activation checkpointing, and
torch.compile without a recompile per token count. The GPU bounds are provisional until measured on an H200
(then ~3x the largest error measured)."""
import contextlib
import types
import warnings

import pytest

from gpu_requirements import SKIP_MARKER

torch = pytest.importorskip("torch", reason=SKIP_MARKER + "PyTorch not installed")
pytest.importorskip("transformers", reason=SKIP_MARKER + "transformers not installed (an optional dependency)")
from torch import nn  # noqa: E402
from transformers import AutoModelForCausalLM, DeepseekV3Config, Qwen3MoeConfig  # noqa: E402
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, use_experts_implementation  # noqa: E402

import caracal.integrations.transformers as integration  # noqa: E402

VOCAB = 512


def deepseek_config():
    return DeepseekV3Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                            num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2,
                            n_shared_experts=1, n_group=1, topk_group=1, num_attention_heads=4, num_key_value_heads=4,
                            q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                            max_position_embeddings=256)


def qwen_config():
    return Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                          num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=64, max_position_embeddings=256)


CONFIGS = pytest.mark.parametrize("config", [deepseek_config, qwen_config], ids=["deepseek_v3", "qwen3_moe"])


def caracal_warnings(caught):
    return [str(w.message) for w in caught if str(w.message).startswith("caracal:")]


def test_registered_and_accepted_by_from_config():
    assert "caracal" in ALL_EXPERTS_FUNCTIONS
    model = AutoModelForCausalLM.from_config(deepseek_config(), experts_implementation="caracal")
    assert model.config._experts_implementation == "caracal"


@CONFIGS
def test_off_gpu_the_module_runs_its_own_forward_and_says_why_once(config, seed):
    model = AutoModelForCausalLM.from_config(config(), experts_implementation="caracal")
    eager = AutoModelForCausalLM.from_config(config(), experts_implementation="eager")
    eager.load_state_dict(model.state_dict())
    ids = torch.randint(0, VOCAB, (2, 16))
    integration._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = model(ids).logits
        model(ids)
    said = caracal_warnings(caught)
    assert len(said) == 1, said
    assert "not all on one CUDA device" in said[0]
    assert torch.equal(got, eager(ids).logits)


def _experts_class(**variant):
    """A transformers-style experts module, decorated as the models' are, with `variant`'s flags."""
    apply_gate = variant.pop("apply_gate", None)
    act = variant.pop("act", nn.SiLU)

    @use_experts_implementation(**variant)
    class Experts(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.gate_up_proj = nn.Parameter(torch.zeros(4, 256, 128))
            self.down_proj = nn.Parameter(torch.zeros(4, 128, 128))
            self.act_fn = act()

        def forward(self, hidden_states, top_k_index, top_k_weights):
            return hidden_states

    if apply_gate is not None:
        Experts._apply_gate = apply_gate
    return Experts(types.SimpleNamespace(_experts_implementation="caracal"))


@pytest.mark.parametrize("variant, reason", [
    ({"has_gate": False}, "no gate"),
    ({"has_bias": True}, "biases"),
    ({"is_transposed": True}, "transposed"),
    ({"is_concatenated": False}, "not concatenated"),
    ({"act": nn.GELU}, "GELU, not SiLU"),
    ({"apply_gate": lambda self, gate_up: gate_up}, "its own _apply_gate"),
    ({}, "not all on one CUDA device"),  # supported, but these tensors are on the CPU
])
def test_every_unsupported_variant_is_named(variant, reason):
    module = _experts_class(**variant)
    why = integration.unsupported(module, torch.zeros(3, 128))
    assert reason in why, why


def test_capacity_is_the_next_power_of_two_from_128():
    assert [integration._capacity(n) for n in (1, 128, 129, 1000, 4096, 4097)] == [128, 128, 256, 1024, 4096, 8192]


# ---- On the GPU ----------------------------------------------------------------------------------


def rel(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()


def expert_grads(model):
    return {name: p.grad for name, p in model.named_parameters()
            if name.endswith(("experts.gate_up_proj", "experts.down_proj"))}


def experts_modules(model):
    return {name: m for name, m in model.named_modules() if isinstance(getattr(m, "gate_up_proj", None), torch.Tensor)}


@contextlib.contextmanager
def routed_as(reference, *models):
    """`models` route every token as `reference` did in its latest forward: each experts module
    receives the reference's top_k_index for its layer (its own top_k_weights stay). Two routers a
    rounding apart (fp32 and bf16, or two bf16 models whose earlier layers summed in another order)
    can break a near tie between two experts differently, and one token sent elsewhere moves its
    layer's expert gradients by up to ~9% (2026-12-05, Qwen3-MoE with seed 2: the fp32 reference
    against grouped_mm in one run, against Caracal in another): routing, not the experts' arithmetic."""
    seen, hooks = {}, []

    def record(name):
        def hook(_module, args, kwargs):
            seen[name] = args[1] if len(args) > 1 else kwargs["top_k_index"]
        return hook

    def pin(name):
        def hook(_module, args, kwargs):
            if len(args) > 1:
                return (args[0], seen[name].clone(), *args[2:]), kwargs
            return args, {**kwargs, "top_k_index": seen[name].clone()}
        return hook

    for name, module in experts_modules(reference).items():
        hooks.append(module.register_forward_pre_hook(record(name), with_kwargs=True))
    for model in models:
        for name, module in experts_modules(model).items():
            hooks.append(module.register_forward_pre_hook(pin(name), with_kwargs=True))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def step(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), out.loss.detach(), expert_grads(model)


@pytest.mark.gpu
@CONFIGS
def test_matches_eager_fp32_and_grouped_mm_bf16(config, seed):
    reference = AutoModelForCausalLM.from_config(config(), experts_implementation="eager").cuda()
    ours = AutoModelForCausalLM.from_config(config(), experts_implementation="caracal").cuda().bfloat16()
    ours.load_state_dict(reference.state_dict())
    grouped = AutoModelForCausalLM.from_config(config(), experts_implementation="grouped_mm").cuda().bfloat16()
    grouped.load_state_dict(reference.state_dict())
    ids = torch.randint(0, VOCAB, (2, 48), device="cuda")
    integration._warned.clear()
    with routed_as(reference, ours, grouped):
        ref_logits, ref_loss, ref_grads = step(reference, ids)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            logits, loss, grads = step(ours, ids)
        bf_logits, bf_loss, bf_grads = step(grouped, ids)
    assert not caracal_warnings(caught), caracal_warnings(caught)
    assert integration._engines, "no experts module ran on Caracal"
    # The logits likewise: a bf16 model's differ from the fp32 model's by its attention and heads
    # too (2026-12-05, H100, one seed of DeepSeek-V3's tiny model: 5.0e-2 for Caracal's experts).
    plain_logits_err = rel(bf_logits, ref_logits)
    print(f"logits against fp32 eager: caracal {rel(logits, ref_logits):.3e}, grouped_mm {plain_logits_err:.3e}")
    assert rel(logits, ref_logits) <= max(3e-2, 1.5 * plain_logits_err), (rel(logits, ref_logits), plain_logits_err)
    assert abs(loss.item() - ref_loss.item()) < 2e-2 * abs(ref_loss.item())
    assert rel(logits, bf_logits) <= max(3e-2, 1.5 * plain_logits_err), (rel(logits, bf_logits), plain_logits_err)
    assert grads.keys() == ref_grads.keys() and grads
    # A bf16 model's gradients differ from the fp32 model's by what bf16 attention and heads add on
    # the way back (layer 0 of Qwen3-MoE most: 2026-12-05, H100, above 5e-2 for Caracal's experts);
    # held to no more than 1.5x the plain bf16 grouped_mm experts' own error, and close to theirs.
    for name, g in grads.items():
        assert g is not None and g.dtype == torch.bfloat16, name
        ours_err, plain_err = rel(g, ref_grads[name]), rel(bf_grads[name], ref_grads[name])
        assert ours_err <= max(5e-2, 1.5 * plain_err), (name, ours_err, plain_err)
        assert rel(g, bf_grads[name]) <= max(5e-2, 1.5 * plain_err), (name, rel(g, bf_grads[name]), plain_err)


@pytest.mark.gpu
def test_two_runs_are_bitwise_equal(seed):
    model = AutoModelForCausalLM.from_config(deepseek_config(), experts_implementation="caracal").cuda().bfloat16()
    ids = torch.randint(0, VOCAB, (2, 40), device="cuda")
    first, second = step(model, ids), step(model, ids)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    for name in first[2]:
        assert torch.equal(first[2][name], second[2][name]), name


@pytest.mark.gpu
def test_model_built_under_a_default_cuda_device_runs_on_caracal(seed):
    """`with torch.device("cuda"): from_config(...)`, as the examples build models: the engines made
    there run (no fallback) and match the eager experts."""
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(qwen_config(), experts_implementation="caracal",
                                                 dtype=torch.bfloat16)
        eager = AutoModelForCausalLM.from_config(qwen_config(), experts_implementation="eager", dtype=torch.bfloat16)
    eager.load_state_dict(model.state_dict())
    ids = torch.randint(0, VOCAB, (2, 24), device="cuda")
    integration._warned.clear()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad(), routed_as(eager, model):
        warnings.simplefilter("always")
        want = eager(ids).logits
        assert rel(model(ids).logits, want) < 3e-2
    assert caracal_warnings(caught) == []


@pytest.mark.gpu
@CONFIGS
def test_bf16_autocast_of_an_fp32_model_runs_on_caracal(config, seed):
    """An fp32 model under torch.autocast(bf16), as mixed-precision training runs it: the experts run on
    Caracal (no fallback) from the fp32 weights, return fp32 hidden states as the eager experts do,
    and match the eager experts under the same autocast; the expert weights' gradients are fp32."""
    model = AutoModelForCausalLM.from_config(config(), experts_implementation="caracal").cuda()
    eager = AutoModelForCausalLM.from_config(config(), experts_implementation="eager").cuda()
    eager.load_state_dict(model.state_dict())
    ids = torch.randint(0, VOCAB, (2, 40), device="cuda")
    integration._warned.clear()
    with warnings.catch_warnings(record=True) as caught, routed_as(eager, model):
        warnings.simplefilter("always")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            want = step(eager, ids)  # first: routed_as pins the model to its routing
            ours = step(model, ids)
    assert caracal_warnings(caught) == []
    assert ours[0].dtype == want[0].dtype
    assert rel(ours[0].float(), want[0].float()) < 3e-2
    for name, g in ours[2].items():
        assert g.dtype == torch.float32, name
        assert rel(g, want[2][name]) <= 5e-2, (name, rel(g, want[2][name]))


@pytest.mark.gpu
def test_token_counts_that_change_between_calls(seed):
    model = AutoModelForCausalLM.from_config(qwen_config(), experts_implementation="caracal").cuda().bfloat16()
    eager = AutoModelForCausalLM.from_config(qwen_config(), experts_implementation="eager").cuda().bfloat16()
    eager.load_state_dict(model.state_dict())
    for tokens in (16, 100, 7, 300, 16):
        ids = torch.randint(0, VOCAB, (1, tokens), device="cuda")
        with torch.no_grad(), routed_as(eager, model):
            want = eager(ids).logits
            assert rel(model(ids).logits, want) < 3e-2, tokens
    capacities = {c for engines in integration._engines.values() for c in engines}
    assert capacities <= {128, 256, 512}, capacities


def test_save_pretrained_round_trips(tmp_path, seed):
    """The weights are the model's own parameters ([gate; up] halves as transformers holds them):
    saved and loaded back bit for bit, by a model on Caracal's experts too."""
    model = AutoModelForCausalLM.from_config(deepseek_config(), experts_implementation="caracal")
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="caracal")
    assert loaded.config._experts_implementation == "caracal"
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


@pytest.mark.gpu
def test_gradient_accumulation_adds_the_micro_batches(seed):
    """Two micro-batches' backwards accumulate into .grad as autograd adds them: the sum of each
    alone, bit for bit (each forward's backward replays what the other overwrote)."""
    model = AutoModelForCausalLM.from_config(qwen_config(), experts_implementation="caracal").cuda().bfloat16()
    first, second = (torch.randint(0, VOCAB, (2, 40), device="cuda") for _ in range(2))
    grads_first, grads_second = step(model, first)[2], step(model, second)[2]
    model.zero_grad(set_to_none=True)
    losses = [model(ids, labels=ids).loss for ids in (first, second)]  # both forwards pending
    for loss in losses:
        loss.backward()
    for name, g in expert_grads(model).items():
        assert torch.equal(g, grads_first[name] + grads_second[name]), name


@pytest.mark.gpu
def test_activation_checkpointing_gives_the_same_gradients(seed):
    """With transformers' gradient checkpointing the experts' forward runs again inside the
    backward: the gradients are those of the plain step."""
    model = AutoModelForCausalLM.from_config(qwen_config(), experts_implementation="caracal").cuda().bfloat16()
    ids = torch.randint(0, VOCAB, (2, 48), device="cuda")
    plain = step(model, ids)
    model.gradient_checkpointing_enable()
    model.train()
    checkpointed = step(model, ids)
    assert torch.equal(plain[1], checkpointed[1])
    for name, g in checkpointed[2].items():
        assert rel(g, plain[2][name]) <= 1e-3, (name, rel(g, plain[2][name]))


@pytest.mark.gpu
def test_torch_compile_does_not_recompile_for_each_token_count(seed):
    """torch.compile(dynamic=True): token counts within one engine's capacity (128) reuse the first
    call's graphs; the logits match the uncompiled model's."""
    model = AutoModelForCausalLM.from_config(qwen_config(), experts_implementation="caracal").cuda().bfloat16()
    compiled_graphs = []

    def counting_backend(gm, example_inputs):
        compiled_graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, backend=counting_backend, dynamic=True)
    counts = []
    for tokens in (40, 56, 72):
        ids = torch.randint(0, VOCAB, (1, tokens), device="cuda")
        with torch.no_grad():
            assert rel(compiled(ids).logits, model(ids).logits) < 1e-2, tokens
        counts.append(len(compiled_graphs))
    assert counts[0] > 0 and counts[1] == counts[0] and counts[2] == counts[0], counts
