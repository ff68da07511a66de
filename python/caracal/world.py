"""Where a layer's ranks live: the loopback world (all ranks virtual, on one GPU) or one rank per
process of a torch.distributed process group over NCCL symmetric memory."""
import collections
import os
import weakref

import torch
import torch.distributed as dist

# Unique ids shared so far per process group (keys of the store must not repeat).
_ids_shared = collections.Counter()

# The configuration of an engine (caracal.MoE's arguments, and the weights' dtype and gate/up layout):
# layers with equal keys on one World share one engine.
EngineKey = collections.namedtuple(
    "EngineKey", "hidden intermediate num_experts top_k shared_intermediate tokens_per_rank normalize router_scale "
    "gemm_ctas exchange_sms fused_forward ring_rows bf16_weight_gradients gate_up_layout precision fp8_weight_gradients",
    defaults=("interleaved", "bf16", True))

# World.default()'s worlds, per device.
_default_worlds = {}


# How long a cross-rank wait may take before the world is aborted (NCCL's watchdog waits 10 minutes).
DEFAULT_TIMEOUT = 600.0


class World:
    """The expert-parallel world a `caracal.MoE` runs in. Make one with `World.loopback` or
    `World.from_process_group`. The layers built on it share an engine per configuration (one
    communicator, symmetric heap and set of activation buffers: see caracal.MoE), made when the
    first layer of that configuration is built (collectively, for NCCL: every rank builds its
    layers in the same order; ranks that make different engines at the same point get a
    RuntimeError giving each rank's). A loopback engine is freed with its last layer; an NCCL
    engine lives until `close()` (collective), as tearing it down is a collective that must not
    wait on garbage collection; engines alive at exit are left to the OS.

    `timeout` (seconds, default 600) bounds every cross-rank wait of the layers built on it. When a
    wait expires (a rank stalled on the host longer than that, or gone), the world is aborted: the
    step's outputs are NaN, `MoE.fault_flag()` reads 1.0 on the GPU (gate the optimizer step on it
    so that the NaN gradients are never applied), and `MoE.check()`, forward and backward raise on
    every rank until `MoE.reset()` has been called on every rank; the next step is then exact. The
    README's "When a rank stalls" gives the training loop."""

    def __init__(self, backend, size, rank, device, group=None, timeout=DEFAULT_TIMEOUT):
        self.backend = backend  # "loopback" or "nccl"
        self.size = size        # W, the expert-parallel degree
        self.rank = rank        # this process's rank (0 for loopback)
        self.device = torch.device("cuda", device)
        self.group = group
        self.timeout = _check_timeout(timeout)
        # configuration -> _Engine: weakly for loopback (freed with its last layer), strongly for NCCL
        # (freed by close(), on every rank together).
        self._engines = weakref.WeakValueDictionary() if backend == "loopback" else {}
        self._engines_made = 0
        self._closed = False

    @property
    def local_ranks(self):
        """Ranks this process drives: all W for loopback, 1 for NCCL."""
        return self.size if self.backend == "loopback" else 1

    @classmethod
    def loopback(cls, size=1, device=None, timeout=DEFAULT_TIMEOUT):
        """`size` virtual ranks on one GPU (the current one by default)."""
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"caracal.World.loopback: size must be an int >= 1, got {size!r}")
        return cls("loopback", size, 0, _device_index(device), timeout=timeout)

    @classmethod
    def default(cls, device=None):
        """The loopback world of one rank on `device` (default: the current one) that caracal.MoE
        layers built without a world share: the same object at every call (a new one once it is
        closed)."""
        index = _device_index(device)
        if index not in _default_worlds or _default_worlds[index]._closed:
            _default_worlds[index] = cls.loopback(1, index)
        return _default_worlds[index]

    @classmethod
    def from_process_group(cls, group=None, device=None, timeout=DEFAULT_TIMEOUT):
        """One rank per process of `group` (default: the world group), on `device` (default: the
        current CUDA device, as torchrun scripts set it). Collective over the group; the NCCL unique
        ids of its layers travel through the group's store. NVLink multicast must stay off: raises
        RuntimeError unless NCCL_NVLS_ENABLE=0 is in the environment (set it before the process
        starts, e.g. `NCCL_NVLS_ENABLE=0 torchrun ...`; Caracal never sets it)."""
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("caracal.World.from_process_group: torch.distributed is not initialized "
                               "(call torch.distributed.init_process_group first)")
        group = group or dist.group.WORLD
        rank = dist.get_rank(group)
        if rank < 0:
            raise ValueError("caracal.World.from_process_group: this process is not a member of `group`")
        nvls = os.environ.get("NCCL_NVLS_ENABLE")
        if nvls != "0":
            raise RuntimeError(f"caracal.World.from_process_group: NCCL_NVLS_ENABLE is "
                               f"{'unset' if nvls is None else repr(nvls)}: NVLink multicast must stay off; set "
                               "NCCL_NVLS_ENABLE=0 in the environment before the process starts (NCCL reads it "
                               "once, when torch.distributed makes its first communicator); Caracal never sets it")
        os.environ.setdefault("NCCL_CUMEM_ENABLE", "1")
        return cls("nccl", dist.get_world_size(group), rank, _device_index(device), group, timeout)

    def close(self):
        """Frees every engine of this world now; its layers cannot run afterwards, and no layer can
        be built on it. Collective for NCCL (every rank calls it; the engines' communicators and
        symmetric windows are torn down together); release the tensors `MoE.fault_flag()` gave
        first (e.g. `del opt.found_inf`): a rank still holding one makes every rank raise. Closing
        twice is harmless."""
        if self._closed:
            return
        engines = sorted(self._engines.values(), key=lambda e: e.ordinal)
        if self.backend == "nccl" and engines:
            holders = [torch.ops.caracal.layer_holders(e.handle) for e in engines]
            gathered = [None] * self.size
            dist.all_gather_object(gathered, holders, group=self.group)
            held = {rank: h for rank, h in enumerate(gathered) if any(h)}
            if held:
                raise RuntimeError("caracal.World.close: tensors from MoE.fault_flag() still hold engines on ranks "
                                   f"{sorted(held)} (per rank, per engine in creation order: {held}); release them "
                                   "(e.g. del opt.found_inf) on every rank, then close again")
        for engine in engines:
            engine.destroy()
        self._engines.clear()
        self._closed = True

    def _engine(self, key):
        """The engine of the layers of configuration `key` (caracal.MoE's arguments), made on first
        use (collective for NCCL: every rank builds its layers in the same order)."""
        if self._closed:
            raise RuntimeError(f"caracal: {self!r} is closed; build layers on a new World")
        engine = self._engines.get(key)
        if engine is None:
            unique_id = self._agree_on_next_engine(key) if self.backend == "nccl" else None
            engine = _Engine(self, self._engines_made, unique_id, *key)
            self._engines_made += 1
            self._engines[key] = engine
        return engine

    def _agree_on_next_engine(self, key):
        """Collective: checks that every rank is making the same engine at the same point (the same
        configuration, after as many engines made on this world and NCCL ids shared on its group in
        this process), then returns a fresh NCCL unique id, made on the group's rank 0 and shared
        through the store."""
        from ._extension import load
        load()
        group_key = self.group.group_name
        mine = (_ids_shared[group_key], self._engines_made, key)
        gathered = [None] * self.size
        dist.all_gather_object(gathered, mine, group=self.group)
        mismatch = _first_divergence(gathered)
        if mismatch:
            raise RuntimeError("caracal.MoE: the ranks are building different layers at the same point (every rank "
                               "must build its caracal.MoE layers with the same arguments, in the same order): "
                               + mismatch)
        store_key = f"caracal/nccl_id/{group_key}/{_ids_shared[group_key]}"
        _ids_shared[group_key] += 1
        store = dist.distributed_c10d._get_default_store()
        if self.rank == 0:
            store.set(store_key, bytes(torch.ops.caracal.nccl_unique_id().tolist()))
        return torch.tensor(list(store.get(store_key)), dtype=torch.uint8, device="cpu")

    def __repr__(self):
        return (f"caracal.World({self.backend}, size={self.size}, rank={self.rank}, device={self.device}, "
                f"timeout={self.timeout})")


class _Engine:
    """One C++ MoELayer (src/torch_ext/torch_layer.hpp) with its world: the buffers of every
    caracal.MoE of one configuration on one World. A loopback engine is freed when the last layer
    using it goes; an NCCL one by World.close() only (its teardown is collective: never from a
    garbage-collection finalizer). Engines alive at interpreter exit are left to the OS."""

    def __init__(self, world, ordinal, unique_id, hidden, intermediate, num_experts, top_k, shared_intermediate,
                 tokens_per_rank, normalize, router_scale, gemm_ctas, exchange_sms, fused_forward, ring_rows,
                 bf16_weight_gradients, gate_up_layout="interleaved", precision="bf16", fp8_weight_gradients=True):
        self.ordinal = ordinal  # engines made on its world before it
        self.handle = torch.ops.caracal.create_layer(
            hidden, intermediate, num_experts, top_k, shared_intermediate, world.size, tokens_per_rank, normalize,
            router_scale, world.backend, world.rank, unique_id, world.device.index, gemm_ctas, exchange_sms,
            fused_forward, ring_rows, bf16_weight_gradients, world.timeout, gate_up_layout, precision,
            fp8_weight_gradients)
        self.layer = torch.tensor(self.handle, dtype=torch.int64, device="cpu")  # what the traced ops take (on the CPU
        # whatever the default device: a model built under `with torch.device("cuda")` makes engines too)
        self._finalizer = None
        if world.backend == "loopback":
            self._finalizer = weakref.finalize(self, torch.ops.caracal.destroy_layer, self.handle)
            self._finalizer.atexit = False

    def destroy(self):
        """Frees the C++ layer now (World.close)."""
        if self._finalizer is not None:
            self._finalizer()
        else:
            torch.ops.caracal.destroy_layer(self.handle)


def _first_divergence(gathered):
    """'' when every rank gathered the same (NCCL ids shared, engines made, configuration), else a
    line giving each rank's, for the error of World._agree_on_next_engine."""
    if all(g == gathered[0] for g in gathered):
        return ""
    return "; ".join(f"rank {r}: NCCL ids shared {g[0]}, engines made {g[1]}, configuration {g[2]}"
                     for r, g in enumerate(gathered))


def _check_timeout(timeout):
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise ValueError(f"caracal.World: timeout must be a number of seconds in (0, 3600], got {timeout!r}")
    return float(timeout)


def _device_index(device):
    if device is None:
        if not torch.cuda.is_available():
            raise RuntimeError("caracal: no CUDA device is available")
        return torch.cuda.current_device()
    device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if device.type != "cuda":
        raise ValueError(f"caracal: device must be a CUDA device, got {device}")
    return device.index if device.index is not None else torch.cuda.current_device()
