"""caracal.MoE: the expert-parallel MoE layer as an nn.Module."""
import math
import weakref

import torch
from torch import nn

from ._extension import load
from .world import World


class MoE(nn.Module):
    """One MoE layer's experts on this process's ranks (DESIGN §1): a SwiGLU expert per routed
    expert, plus an optional shared expert that every token goes through.

        y_t = c_t * shared(x_t) + sum_{slots j, idx_j != -1} g_j * expert_{idx_j}(x_t)
        g_j = router_scale * s_j / sum of the token's valid scores   (normalize)
              router_scale * s_j                                       (otherwise)

    The module owns the experts of its local ranks (`world.local_ranks` ranks of
    num_experts / world.size experts each: all experts for the loopback world, this rank's for
    NCCL) and takes the routing as input: x [R*T, D] bf16, topk_idx [R*T, k] (global expert ids,
    -1 = empty slot), topk_scores [R*T, k], where R = world.local_ranks and T = tokens_per_rank,
    the exact token count fixed at construction (buffers are allocated for it). Gradients reach x,
    topk_scores, the weights and shared_scale.

    Parameters (dtype `dtype`: bf16 by default, or fp32 master weights that forward casts to bf16
    for the kernels): w_gate_up [R*L, 2I, D] with gate and up rows interleaved in groups of 8
    (caracal.reference.split_gate_up), w_down [R*L, D, I], and for a shared expert
    shared_w_gate_up [2Is, D], shared_w_down [D, Is]. Their gradients are fp32 sums over the
    tokens, stored in the parameters' dtype (for bf16: rounded once, by the kernels).
    Initialization: uniform in +-1/sqrt(fan_in), as nn.Linear.

    A layer keeps the activations of its latest forward only: run backward before the layer's
    next forward (activation checkpointing, which recomputes just before backward, is fine).

    `exchange_sms` caps the SMs the token exchange occupies while it waits on other ranks (0: all
    but 16), so that other GPU work, an NCCL all-reduce of DDP/FSDP on another stream among it,
    always progresses. Cross-rank waits are bounded by `world.timeout`; see `check` and `reset`.
    """

    def __init__(self, hidden, intermediate, num_experts, top_k, tokens_per_rank, *, world=None,
                 shared_intermediate=0, normalize=True, router_scale=1.0, dtype=torch.bfloat16, gemm_ctas=0,
                 exchange_sms=0):
        super().__init__()
        load()
        world = world or World.loopback(1)
        if not isinstance(world, World):
            raise TypeError(f"caracal.MoE: world must be a caracal.World, got {type(world).__name__}")
        if num_experts % world.size:
            raise ValueError(f"caracal.MoE: num_experts ({num_experts}) must be a multiple of the world "
                             f"size ({world.size})")
        self.world = world
        self.hidden, self.intermediate, self.top_k = hidden, intermediate, top_k
        self.num_experts, self.shared_intermediate = num_experts, shared_intermediate
        self.tokens_per_rank, self.normalize, self.router_scale = tokens_per_rank, normalize, float(router_scale)
        unique_id = world._next_unique_id() if world.backend == "nccl" else None
        self._handle = torch.ops.caracal.create_layer(
            hidden, intermediate, num_experts, top_k, shared_intermediate, world.size, tokens_per_rank, normalize,
            float(router_scale), world.backend, world.rank, unique_id, world.device.index, gemm_ctas, exchange_sms,
            world.timeout)
        from . import _ops
        _ops.layer_top_k[self._handle] = top_k
        # Freed with the module; layers alive at interpreter exit are left to the OS (destroying an
        # NCCL world is collective and the other ranks may be gone by then).
        self._finalizer = weakref.finalize(self, _destroy_layer, self._handle)
        self._finalizer.atexit = False

        experts = world.local_ranks * num_experts // world.size
        if dtype not in (torch.bfloat16, torch.float32):
            raise TypeError(f"caracal.MoE: dtype must be torch.bfloat16 or torch.float32, got {dtype}")
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

    @torch.no_grad()
    def reset_parameters(self):
        for w in (self.w_gate_up, self.w_down, self.shared_w_gate_up, self.shared_w_down):
            if w is not None:
                bound = 1.0 / math.sqrt(w.shape[-1])
                w.uniform_(-bound, bound)

    def memory(self):
        """{'heap': bytes of symmetric heap per rank, 'local': bytes of device memory per local rank}."""
        heap, local = torch.ops.caracal.layer_memory(self._handle)
        return {"heap": heap, "local": local}

    def check(self):
        """Raises RuntimeError for the first device-side failure since the last check: an expert id
        outside [-1, E) (raised once), or a cross-rank wait that timed out (raised at every call,
        and by forward and backward, until `reset`). Reads pinned memory only: no synchronization.
        forward and backward check too, before enqueuing work."""
        torch.ops.caracal.check(self._handle)

    def reset(self):
        """Brings the layer back after a timed-out cross-rank wait: collective, every rank calls it
        (on the current stream), then the next step is exact. A forward made before it cannot be
        differentiated any more. Harmless when nothing failed."""
        torch.ops.caracal.reset(self._handle)

    def set_timeout(self, seconds):
        """Changes how long a cross-rank wait of this layer may take (see caracal.World)."""
        torch.ops.caracal.set_timeout(self._handle, float(seconds))

    def close(self):
        """Frees the layer's buffers and world now (collective for NCCL worlds)."""
        self._finalizer()

    def forward(self, x, topk_idx, topk_scores, shared_scale=None):
        rows = self.world.local_ranks * self.tokens_per_rank
        _check("x", x, (rows, self.hidden), (torch.bfloat16,), self.world.device)
        _check("topk_idx", topk_idx, (rows, self.top_k), (torch.int32, torch.int64), self.world.device)
        _check("topk_scores", topk_scores, (rows, self.top_k), (torch.float32, torch.bfloat16), self.world.device)
        if shared_scale is not None:
            if self.shared_w_gate_up is None:
                raise ValueError("caracal.MoE: shared_scale needs a layer with a shared expert")
            _check("shared_scale", shared_scale, (rows,), (torch.float32, torch.bfloat16), self.world.device)
            shared_scale = shared_scale.float()
        y, _forward_id = torch.ops.caracal.moe_forward(
            self._handle, x, topk_idx.to(torch.int32), topk_scores.float(), self.w_gate_up, self.w_down,
            self.shared_w_gate_up, self.shared_w_down, shared_scale)
        return y

    def extra_repr(self):
        return (f"hidden={self.hidden}, intermediate={self.intermediate}, num_experts={self.num_experts}, "
                f"top_k={self.top_k}, shared_intermediate={self.shared_intermediate}, "
                f"tokens_per_rank={self.tokens_per_rank}, world={self.world}")


def _destroy_layer(handle):
    from . import _ops
    _ops.layer_top_k.pop(handle, None)
    torch.ops.caracal.destroy_layer(handle)


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
        raise ValueError(f"caracal.MoE: {name} must have shape {list(shape)} (R*T = local ranks x tokens_per_rank "
                         f"rows), got {list(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"caracal.MoE: {name} must be contiguous (call .contiguous())")
