"""caracal.MoE: the expert-parallel MoE layer as an nn.Module."""
import copy
import math

import torch
from torch import nn

from ._extension import load
from .world import EngineKey, World


class MoE(nn.Module):
    """One MoE layer's experts on this process's ranks (DESIGN §1): a SwiGLU expert per routed
    expert, plus an optional shared expert that every token goes through.

        y_t = c_t * shared(x_t) + sum_{slots j, idx_j != -1} g_j * expert_{idx_j}(x_t)
        g_j = router_scale * s_j / sum of the token's valid scores   (normalize)
              router_scale * s_j                                       (otherwise)

    The module owns the experts of its local ranks (`world.local_ranks` ranks of
    num_experts / world.size experts each: all experts for the loopback world, this rank's for
    NCCL) and takes the routing as input: x [R*t, D] bf16, topk_idx [R*t, k] (global expert ids,
    -1 = empty slot; int32, or int64 narrowed on the GPU without a sync: an id outside int32 stays
    out of range and `check` raises it), topk_scores [R*t, k], where R = world.local_ranks and t,
    the tokens of each local rank in this call, is at most tokens_per_rank (the capacity fixed at
    construction: buffers are allocated for it; a call with fewer tokens pads them with empty
    slots). Under torch.autocast a floating x of another dtype is cast to bf16; y is bf16.
    Gradients reach x, topk_scores, the weights and shared_scale.

    Parameters (dtype `dtype`: bf16 by default, or fp32 master weights that forward casts to bf16
    for the kernels): w_gate_up [R*L, 2I, D] with gate and up rows interleaved in groups of 8
    (caracal.reference.split_gate_up; gate_up_layout="halves": W_gate's I rows then W_up's, as
    Hugging Face's gate_up_proj holds them, read and written in place with the same bits), w_down
    [R*L, D, I], and for a shared expert
    shared_w_gate_up [2Is, D], shared_w_down [D, Is]. Their gradients are fp32 sums over the
    tokens, stored in the parameters' dtype (for bf16: rounded once, by the kernels).
    Initialization: uniform in +-1/sqrt(fan_in), as nn.Linear.

    Layers share their buffers: every caracal.MoE of one configuration (the arguments above; bf16
    and fp32 weights apart, as bf16 gradients need two fp32 partial sums of one expert's gradients
    to cross the ring's macrobatches) on one World runs on one engine (a C++ MoELayer: the token exchange's
    symmetric heap and the experts' activations), which keeps the activations of the latest forward
    it ran. The backward of an earlier forward first replays what it needs of that forward (the
    routing, the dispatched rows, the up/gate GEMMs) from the inputs autograd saved for it, bitwise
    as the first time. So a model's MoE layers take one layer's buffers, any number of forwards of
    a layer may be pending (gradient accumulation, pipeline schedules, an eval forward in between,
    activation checkpointing), and the price is the replay: the up/gate GEMM and the dispatch again
    for every layer but the last one before its backward.

    The state dict holds the four weights only (w_gate_up, w_down, and shared_w_gate_up,
    shared_w_down with a shared expert): load it into a caracal.MoE built with the same arguments.
    copy.deepcopy gives a layer with copies of the weights on the same engine; pickling is refused
    (save the state dict).

    `exchange_sms` caps the SMs the token exchange occupies while it waits on other ranks (0: all
    but 16), so that other GPU work, an NCCL all-reduce of DDP/FSDP on another stream among it,
    always progresses. Cross-rank waits are bounded by `world.timeout`; when one expires the
    passes are poisoned (NaN) and the training loop skips the step and calls `reset`: see
    `fault_flag`, `faulted`, `check` and `reset` (which act on the engine: on every layer that
    shares it), and the README's "When a rank stalls".
    `fused_forward` runs the forward's dispatch and expert GEMMs as one persistent kernel (the
    default; the same results bit for bit); False selects the separate launches of Caracal v1.
    `ring_rows` sizes the ring of routed rows both passes walk (a multiple of 128; 0: a balanced
    step in one macrobatch): any routing runs on any ring, a smaller one only adds macrobatches
    (the backward then recomputes their up/gate GEMMs); the engine's memory follows the ring.
    `precision="fp8"` runs the routed and shared experts in DeepSeek-V3's block-scaled e4m3 recipe (rows and
    gradients per 1x128, weights per 128x128 blocks; the weight gradients from x, dy and the
    activations quantized per 1x128 block along the tokens, or with `fp8_weight_gradients=False`
    from the bf16 rows by bf16 GEMMs, more exact and slower), on v1's separate launches whatever
    `fused_forward` says. The bf16 or
    fp32 weights stay the masters: the module keeps them quantized (1 byte a weight, both
    orientations, not in the state dict) and quantizes them again at the first forward after they
    change (an optimizer step, load_state_dict: their version counter), not at every call. D, I and the
    shared I must be multiples of 128 and gate_up_layout interleaved. Against the bf16 layer it
    costs ~4-6% relative error on y and x's gradient, ~6% on the weight gradients (~5.5% with
    `fp8_weight_gradients=False`; the README's "FP8").
    """

    def __init__(self, hidden, intermediate, num_experts, top_k, tokens_per_rank, *, world=None,
                 shared_intermediate=0, normalize=True, router_scale=1.0, dtype=torch.bfloat16, gemm_ctas=0,
                 exchange_sms=0, fused_forward=True, ring_rows=0, gate_up_layout="interleaved", precision="bf16",
                 fp8_weight_gradients=True):
        super().__init__()
        load()
        world = world or World.default()
        if not isinstance(world, World):
            raise TypeError(f"caracal.MoE: world must be a caracal.World, got {type(world).__name__}")
        if num_experts % world.size:
            raise ValueError(f"caracal.MoE: num_experts ({num_experts}) must be a multiple of the world "
                             f"size ({world.size})")
        self.world = world
        self.fused_forward = bool(fused_forward)
        self.hidden, self.intermediate, self.top_k = hidden, intermediate, top_k
        self.num_experts, self.shared_intermediate = num_experts, shared_intermediate
        self.tokens_per_rank, self.normalize, self.router_scale = tokens_per_rank, normalize, float(router_scale)
        if dtype not in (torch.bfloat16, torch.float32):
            raise TypeError(f"caracal.MoE: dtype must be torch.bfloat16 or torch.float32, got {dtype}")
        if gate_up_layout not in ("interleaved", "halves"):
            raise ValueError(f"caracal.MoE: gate_up_layout must be 'interleaved' or 'halves', got {gate_up_layout!r}")
        self.gate_up_layout = gate_up_layout
        if precision not in ("bf16", "fp8"):
            raise ValueError(f"caracal.MoE: precision must be 'bf16' or 'fp8', got {precision!r}")
        if precision == "fp8" and gate_up_layout != "interleaved":
            raise ValueError("caracal.MoE: precision 'fp8' needs gate_up_layout 'interleaved' (the FP8 GEMMs' order), "
                             f"got {gate_up_layout!r}")
        self.precision = precision
        self.fp8_weight_gradients = bool(fp8_weight_gradients)
        # bf16 parameters get bf16 weight gradients, which the engine keeps partial sums for; fp32
        # ones do without (MoELayerOptions::bf16_weight_gradients).
        key = EngineKey(hidden, intermediate, num_experts, top_k, shared_intermediate, tokens_per_rank, bool(normalize),
                        float(router_scale), gemm_ctas, exchange_sms, bool(fused_forward), int(ring_rows),
                        dtype == torch.bfloat16, gate_up_layout, precision,
                        # bf16 layers ignore it: one engine whatever it says
                        self.fp8_weight_gradients or precision != "fp8")
        self._engine = world._engine(key)
        # The traced ops take the engine's handle as a CPU tensor: torch.compile specializes on int
        # attributes, so with an int every engine would compile its own graph.
        self._layer = self._engine.layer

        experts = world.local_ranks * num_experts // world.size
        factory = dict(dtype=dtype, device=world.device)
        self.w_gate_up = nn.Parameter(torch.empty(experts, 2 * intermediate, hidden, **factory))
        self.w_down = nn.Parameter(torch.empty(experts, hidden, intermediate, **factory))
        if shared_intermediate:
            self.shared_w_gate_up = nn.Parameter(torch.empty(2 * shared_intermediate, hidden, **factory))
            self.shared_w_down = nn.Parameter(torch.empty(hidden, shared_intermediate, **factory))
        else:
            self.register_parameter("shared_w_gate_up", None)
            self.register_parameter("shared_w_down", None)
        self.reset_parameters()
        # FP8: the routed weights quantized, a row per local rank, refreshed when they change
        # (_quantized_weights). A plain attribute, not a buffer: neither state nor anything DDP
        # should broadcast (each rank's are its own experts').
        fp8_bytes = torch.ops.caracal.fp8_weight_bytes(self._engine.handle)
        self._w_fp8 = (torch.empty(world.local_ranks, fp8_bytes, dtype=torch.uint8, device=world.device)
                       if fp8_bytes else None)
        self._w_fp8_of = None  # the weights (identity and version) _w_fp8 holds

    @torch.no_grad()
    def reset_parameters(self):
        for w in (self.w_gate_up, self.w_down, self.shared_w_gate_up, self.shared_w_down):
            if w is not None:
                bound = 1.0 / math.sqrt(w.shape[-1])
                w.uniform_(-bound, bound)

    def __deepcopy__(self, memo):
        """A layer with copies of the weights, on the same world and engine."""
        for shared in (self.world, self._engine, self._layer):
            memo[id(shared)] = shared
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for name, value in self.__dict__.items():
            clone.__dict__[name] = copy.deepcopy(value, memo)
        return clone

    def __reduce_ex__(self, protocol):
        raise TypeError("caracal.MoE cannot be pickled: save its state_dict() (the weights) instead")

    def memory(self):
        """{'heap': bytes of symmetric heap per rank, 'local': bytes of device memory per local rank}
        of the layer's engine, which every caracal.MoE of this configuration on this World shares.
        Both come from PyTorch's caching allocator in a loopback world, so
        torch.cuda.memory_allocated() and memory snapshots count them; an NCCL world's heap is
        NCCL's symmetric window (ncclMemAlloc), outside any caching allocator."""
        heap, local = torch.ops.caracal.layer_memory(self._engine.handle)
        return {"heap": heap, "local": local}

    def check(self):
        """Raises RuntimeError for the first device-side failure since the last check: an expert id
        outside [-1, E) (raised once), or a cross-rank wait that timed out (raised at every call,
        and by forward and backward, until `reset`). Reads pinned memory only: no synchronization,
        so a failure shows up at the first check after the GPU recorded it. forward and backward
        check too, before enqueuing work; a loop that replays CUDA graphs calls it itself."""
        torch.ops.caracal.check(self._engine.handle)

    def faulted(self):
        """True when a cross-rank wait of the layer's engine has timed out and `reset` has not been
        called since (what makes `check` raise); False otherwise. Pinned memory only, no sync: tells
        a training loop's `except RuntimeError` whether the error is this abort (reset and go on)
        or something else (re-raise)."""
        return torch.ops.caracal.faulted(self._engine.handle)

    def fault_flag(self):
        """A float32 scalar tensor on the layer's device, aliasing the engine's memory: 0.0 while the
        world is healthy, 1.0 from the moment a cross-rank wait of any rank timed out (the passes
        running then and after are poisoned: NaN) until `reset`, which zeroes it in stream order.
        The GPU reads it without a host sync: gate the optimizer step on it as GradScaler does with
        `found_inf`. A fused optimizer (torch.optim.AdamW / Adam / SGD with fused=True) takes it once
        as its found_inf attribute and then skips, on the GPU, every step it reads 1.0 at
        (parameters, moments and step count untouched):

            opt = torch.optim.AdamW(model.parameters(), fused=True)
            opt.found_inf = moe.fault_flag()

        With several engines (layers of different configurations), gate on their maximum, computed
        after each backward. The tensor keeps the engine alive."""
        return torch.ops.caracal.fault_flag(self._engine.handle)

    def reset(self):
        """Brings the layer's engine back after a timed-out cross-rank wait: collective, every rank
        calls it (on the current stream), then the next step is exact. It first waits on the host
        for the work already on the current stream (the failed passes end at once), then zeroes the
        world's state and the fault flag in stream order. Forwards made before it (of any layer on
        the engine) cannot be differentiated any more. Harmless when nothing failed."""
        torch.ops.caracal.reset(self._engine.handle)

    def set_timeout(self, seconds):
        """Changes how long a cross-rank wait may take, for every layer on this layer's engine: the
        passes enqueued after it on the current stream use it, CUDA graph replays included."""
        torch.ops.caracal.set_timeout(self._engine.handle, float(seconds))

    def close(self):
        """Lets go of the engine: the layer cannot run afterwards. A loopback engine is freed once
        no layer uses it; an NCCL engine when its World is closed (`world.close()`, collective)."""
        self._engine = _CLOSED
        self._layer = _CLOSED.layer

    def forward(self, x, topk_idx, topk_scores, shared_scale=None):
        x = _autocast_input(x)
        rows = self._rows_of(x)
        _check("x", x, (rows, self.hidden), (torch.bfloat16,), self.world.device)
        _check("topk_idx", topk_idx, (rows, self.top_k), (torch.int32, torch.int64), self.world.device)
        _check("topk_scores", topk_scores, (rows, self.top_k), (torch.float32, torch.bfloat16), self.world.device)
        if shared_scale is not None:
            if self.shared_w_gate_up is None:
                raise ValueError("caracal.MoE: shared_scale needs a layer with a shared expert")
            _check("shared_scale", shared_scale, (rows,), (torch.float32, torch.bfloat16), self.world.device)
            shared_scale = shared_scale.float()
        topk_idx = _narrow_ids(topk_idx, self.num_experts)
        tokens = rows // self.world.local_ranks
        pad = self._pad_to_capacity(tokens)
        y, _forward_id = torch.ops.caracal.moe_forward(
            self._layer, pad(x, 0), pad(topk_idx, -1), pad(topk_scores.float(), 0),
            self.w_gate_up, self.w_down, self.shared_w_gate_up, self.shared_w_down,
            None if shared_scale is None else pad(shared_scale, 0),
            None if self._w_fp8 is None else self._quantized_weights())
        return self._unpad(y, tokens)

    @torch.compiler.disable
    def _quantized_weights(self):
        """FP8 layers: _w_fp8 (the routed and the shared experts' weights), quantized again only when
        one of them changed since (another tensor, or a bumped version counter: an optimizer step,
        load_state_dict, an in-place op;
        writes through `.data` bump nothing and are missed), so once an optimizer step rather than
        at every forward, replay and backward. Under CUDA-graph capture the quantization goes into
        the graph (a replay checks no version), and so it does at every call on inference tensors
        (no version counter). Outside torch.compile's graphs (so no fullgraph for FP8 layers)."""
        capturing = torch.cuda.is_current_stream_capturing()
        weights = [w for w in (self.w_gate_up, self.w_down, self.shared_w_gate_up, self.shared_w_down)
                   if w is not None]
        untracked = any(torch.is_inference(w) for w in weights)
        of = None if capturing or untracked else tuple(v for w in weights for v in (w, w._version))
        if of is None or self._w_fp8_of is None or any(a is not b if isinstance(a, torch.Tensor) else a != b
                                                       for a, b in zip(of, self._w_fp8_of)):
            with torch.no_grad():
                torch.ops.caracal.quantize_weights(self._layer, self.w_gate_up, self.w_down, self.shared_w_gate_up,
                                                   self.shared_w_down, self._w_fp8)
            # The op writes through a raw pointer: bump the version so that a pending backward that
            # saved the old quantization raises instead of differentiating with the new one.
            torch.autograd.graph.increment_version(self._w_fp8)
            self._w_fp8_of = of
        return self._w_fp8

    def _rows_of(self, x):
        """R * t, the rows of this call: a multiple of R, at most R * tokens_per_rank."""
        ranks, capacity = self.world.local_ranks, self.tokens_per_rank
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            return ranks * capacity  # _check names what is wrong
        rows = x.shape[0]
        if rows % ranks or rows > ranks * capacity:
            raise ValueError(f"caracal.MoE: x must have R*t rows, t <= tokens_per_rank = {capacity} tokens for each of "
                             f"the R = {ranks} local ranks (at most {ranks * capacity} rows, a multiple of {ranks}), "
                             f"got {rows}")
        return rows

    def _pad_to_capacity(self, tokens):
        """A function padding a [R*t, ...] tensor with `value` rows to [R*T, ...], T = tokens_per_rank
        (differentiable; the identity when t = T)."""
        ranks, capacity = self.world.local_ranks, self.tokens_per_rank
        if tokens == capacity:
            return lambda t, value: t

        def pad(t, value):
            per_rank = t.reshape(ranks, tokens, *t.shape[1:])
            widths = (0, 0) * (per_rank.dim() - 2) + (0, capacity - tokens)  # last dim first
            padded = torch.nn.functional.pad(per_rank, widths, value=value)
            return padded.reshape(ranks * capacity, *t.shape[1:])
        return pad

    def _unpad(self, y, tokens):
        ranks, capacity = self.world.local_ranks, self.tokens_per_rank
        if tokens == capacity:
            return y
        return y.reshape(ranks, capacity, self.hidden)[:, :tokens].reshape(ranks * tokens, self.hidden)

    def extra_repr(self):
        return (f"hidden={self.hidden}, intermediate={self.intermediate}, num_experts={self.num_experts}, "
                f"top_k={self.top_k}, shared_intermediate={self.shared_intermediate}, "
                f"tokens_per_rank={self.tokens_per_rank}, world={self.world}")


class _ClosedEngine:
    """What a closed layer runs on: handle 0 names no layer, and the ops say so."""
    handle = 0
    layer = torch.tensor(0, dtype=torch.int64, device="cpu")


_CLOSED = _ClosedEngine()


def _autocast_input(x):
    """x as the kernels take it under torch.autocast (bf16, whatever the autocast dtype: the layer
    computes in bf16); unchanged outside autocast, where _check asks for bf16."""
    if (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.bfloat16
            and torch.is_autocast_enabled("cuda")):
        return x.to(torch.bfloat16)
    return x


def _narrow_ids(topk_idx, num_experts):
    """int32 ids; int64 ones clamped into [-2, num_experts] first, so that an id outside int32 stays
    out of range (the kernels treat -2 and num_experts as out-of-range ids: `check` raises them)
    instead of wrapping onto a valid one. No synchronization."""
    if topk_idx.dtype == torch.int32:
        return topk_idx
    return topk_idx.clamp(-2, num_experts).to(torch.int32)


def _check(name, t, shape, dtypes, device):
    """TypeError / ValueError naming the argument and what was expected."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"caracal.MoE: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        expected = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"caracal.MoE: {name} must be {expected}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"caracal.MoE: {name} must be on {device}, got {t.device}")
    if tuple(t.shape) != shape:
        raise ValueError(f"caracal.MoE: {name} must have shape {list(shape)} (the rows of x: R*t = local ranks x "
                         f"tokens of each), got {list(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"caracal.MoE: {name} must be contiguous (call .contiguous())")
