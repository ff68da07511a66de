"""Caracal as a Hugging Face transformers experts implementation ("caracal").

    import caracal.integrations.transformers  # registers "caracal" with transformers
    model = AutoModelForCausalLM.from_pretrained(name, experts_implementation="caracal", dtype=torch.bfloat16)

Every experts module transformers dispatches through its `ExpertsInterface` (the classes decorated
with `use_experts_implementation`: DeepSeek-V3 and Kimi K2, Qwen3-MoE, GLM-4.x MoE, Mixtral, ...)
then runs its routed experts on Caracal, in a world of one rank on the module's GPU: the module's
forward receives hidden_states [N, D], top_k_index [N, k] and top_k_weights [N, k], which the
model's router has already normalized and scaled (Caracal adds neither: g = the weight given), and
returns the weighted sum of the experts' outputs; gradients reach hidden_states, top_k_weights and
the module's own parameters gate_up_proj [E, 2I, D] ([gate; up] halves) and down_proj [E, D, I],
which the kernels read and write in place (the engines' gate_up_layout "halves": no copy, no
conversion), so `save_pretrained` and `from_pretrained` round-trip unchanged.

Under torch.autocast (an fp32 model, as mixed-precision training runs it), the experts compute in
bf16 whatever the autocast dtype, from the fp32 weights, and return the hidden states' dtype, as the
module's own forward does; gradients reach the fp32 weights in fp32.

A module Caracal does not run falls back to the module's own forward, with one warning per module
class naming why: weights with a bias, transposed or not concatenated, experts without a gate, a
gate other than SiLU(gate) * up, tensors not on a CUDA device, hidden_states that are not bf16
outside autocast (Caracal computes in bf16: run the model in bf16, or under autocast), no built
extension, or shapes the layer refuses (its error is the warning). Expert ids at or past E
(transformers' sentinels of expert parallelism) are empty slots.

Expert parallelism: transformers' own (`DistributedConfig(tp_size=W, ep_size=W)` under torchrun)
gives each rank E/W experts and every token (attention tensor-parallel), hands the experts module
its local weights and the ids remapped to its experts (the others to the sentinel E/W, an empty
slot here), and all-reduces the ranks' outputs: each rank's experts then run on Caracal as a
one-rank engine, with no token exchange. Caracal's own exchange (`caracal.World.from_process_group`:
each rank its own tokens, the experts' rows pulled over NVLink) has no entry point in transformers;
use `caracal.MoE` for it. Neither path has run on two GPUs yet.

Each call may hold any number of tokens (transformers packs sequences): the engine's capacity is
the largest count seen, rounded up to a power of two (at least 128), and an engine of a larger
capacity is made only when a call needs it; the smaller ones stay alive, as backwards of their
forwards may still be pending.
"""
import warnings
import weakref

import torch
from torch import nn

from ..reference import GATE_UP_INTERLEAVE
from ..world import EngineKey, World

IMPLEMENTATION = "caracal"

_warned = set()                         # experts classes warned about, with the reason
_engines = weakref.WeakKeyDictionary()  # module -> {capacity: engine}, the engines its calls ran on


def register():
    """Registers "caracal" in transformers' ExpertsInterface (idempotent; importing this module
    does it)."""
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(IMPLEMENTATION, experts_forward)


def experts_forward(module, hidden_states, top_k_index, top_k_weights):
    """The forward of a transformers experts module on Caracal (or, where Caracal does not run it,
    the module's own forward)."""
    why = unsupported(module, hidden_states)
    if why:
        return _fall_back(module, why, hidden_states, top_k_index, top_k_weights)
    tokens, hidden = hidden_states.shape
    num_experts, top_k = module.gate_up_proj.shape[0], top_k_index.shape[1]
    try:
        engine = _engine_for(module, tokens, top_k)
    except (ImportError, RuntimeError, ValueError) as e:  # no extension, or a shape the layer refuses
        return _fall_back(module, str(e), hidden_states, top_k_index, top_k_weights)
    capacity = engine.tokens_per_rank
    ids = torch.where(top_k_index < num_experts, top_k_index, -1).to(torch.int32)
    pad = tokens < capacity
    x = hidden_states.to(torch.bfloat16)  # under autocast, an fp32 model's hidden states (unchanged if bf16)
    x = nn.functional.pad(x, (0, 0, 0, capacity - tokens)) if pad else x
    ids = nn.functional.pad(ids, (0, 0, 0, capacity - tokens), value=-1) if pad else ids
    scores = top_k_weights.float()
    scores = nn.functional.pad(scores, (0, 0, 0, capacity - tokens)) if pad else scores
    y, _forward_id = torch.ops.caracal.moe_forward(engine.layer, x.contiguous(), ids.contiguous(),
                                                   scores.contiguous(), module.gate_up_proj, module.down_proj, None,
                                                   None, None)
    return (y[:tokens] if pad else y).to(hidden_states.dtype)  # the dtype the module's own forward returns


def unsupported(module, hidden_states):
    """Why Caracal cannot run `module` on `hidden_states` ('' when it can)."""
    from transformers.integrations.moe import _default_apply_gate
    if not getattr(module, "has_gate", False):
        return "its experts have no gate (Caracal runs SwiGLU experts)"
    if getattr(module, "has_bias", False):
        return "its expert weights have biases"
    if getattr(module, "is_transposed", False):
        return "its expert weights are stored transposed"
    if not getattr(module, "is_concatenated", True):
        return "its gate and up weights are not concatenated [gate; up]"
    if getattr(type(module), "_apply_gate", _default_apply_gate) is not _default_apply_gate:
        return f"{type(module).__name__} gates with its own _apply_gate, not SiLU(gate) * up"
    if not _is_silu(getattr(module, "act_fn", None)):
        return f"its activation is {type(getattr(module, 'act_fn', None)).__name__}, not SiLU"
    weights = (getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None))
    if not all(isinstance(w, torch.Tensor) and w.dim() == 3 for w in weights):
        return "it has no gate_up_proj [E, 2I, D] and down_proj [E, D, I] weights"
    if not hidden_states.is_cuda or not all(w.device == hidden_states.device for w in weights):
        return "its tensors are not all on one CUDA device"
    if hidden_states.dtype != torch.bfloat16 and not torch.is_autocast_enabled("cuda"):
        return (f"hidden_states are {hidden_states.dtype} (Caracal computes in bf16: run the model in bf16 or under "
                "autocast)")
    if any(w.dtype not in (torch.bfloat16, torch.float32) for w in weights):
        return "its weights are neither bf16 nor fp32"
    inter = weights[0].shape[1] // 2
    if weights[0].shape[1] % (2 * GATE_UP_INTERLEAVE) or weights[1].shape[2] != inter:
        return f"gate_up_proj {tuple(weights[0].shape)} and down_proj {tuple(weights[1].shape)} do not pair"
    return ""


def _is_silu(act):
    from transformers.activations import SiLUActivation
    return type(act) in (nn.SiLU, SiLUActivation)


def _capacity(tokens):
    return max(128, 1 << max(0, int(tokens) - 1).bit_length())


@torch.compiler.disable
def _engine_for(module, tokens, top_k):
    """The engine of `module`'s configuration with room for `tokens` tokens (made on first need).
    Never traced by torch.compile: it runs on the call's real token count, so a compiled model's
    graphs guard only on the count fitting the engine (`tokens <= capacity`), not on its value."""
    from .._extension import load
    load()
    engines = _engines.setdefault(module, {})
    fitting = [c for c in engines if c >= tokens]
    if fitting:
        return engines[min(fitting)]
    capacity = _capacity(tokens)
    experts, two_i, hidden = module.gate_up_proj.shape
    world = World.default(module.gate_up_proj.device)
    bf16_gradients = module.gate_up_proj.dtype == torch.bfloat16
    key = EngineKey(hidden=hidden, intermediate=two_i // 2, num_experts=experts, top_k=top_k, shared_intermediate=0,
                    tokens_per_rank=capacity, normalize=False, router_scale=1.0, gemm_ctas=0, exchange_sms=0,
                    fused_forward=True, ring_rows=0, bf16_weight_gradients=bf16_gradients, gate_up_layout="halves")
    engine = world._engine(key)
    engine.tokens_per_rank = capacity
    engines[capacity] = engine
    return engine


def _fall_back(module, why, hidden_states, top_k_index, top_k_weights):
    name = type(module).__name__
    if (name, why) not in _warned:
        _warned.add((name, why))
        warnings.warn(f"caracal: {name} runs its own forward, not Caracal's: {why}", stacklevel=3)
    eager = type(module).forward.__wrapped__  # the class's forward before use_experts_implementation
    return eager(module, hidden_states, top_k_index, top_k_weights)


register()
