"""Where a layer's ranks live: the loopback world (all ranks virtual, on one GPU) or one rank per
process of a torch.distributed process group over NCCL symmetric memory."""
import collections
import os
import weakref

import torch
import torch.distributed as dist

# Unique ids shared so far per process group (keys of the store must not repeat).
_ids_shared = collections.Counter()

# World.default()'s worlds, per device.
_default_worlds = {}


# How long a cross-rank wait may take before the world is aborted (NCCL's watchdog waits 10 minutes).
DEFAULT_TIMEOUT = 600.0


class World:
    """The expert-parallel world a `caracal.MoE` runs in. Make one with `World.loopback` or
    `World.from_process_group`. The layers built on it share an engine per configuration (one
    communicator, symmetric heap and set of activation buffers: see caracal.MoE), made when the
    first layer of that configuration is built and freed with the last one.

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
        self._engines = weakref.WeakValueDictionary()  # configuration -> _Engine

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
        layers built without a world share: the same object at every call."""
        index = _device_index(device)
        if index not in _default_worlds:
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

    def _engine(self, key):
        """The engine of the layers of configuration `key` (caracal.MoE's arguments), made on first
        use (collective for NCCL: every rank builds its layers in the same order)."""
        engine = self._engines.get(key)
        if engine is None:
            engine = _Engine(self, *key)
            self._engines[key] = engine
        return engine

    def _next_unique_id(self):
        """A fresh NCCL unique id for the next layer, made on the group's rank 0 and shared
        through the store (collective: every rank makes its layers in the same order)."""
        from ._extension import load
        load()
        group_key = self.group.group_name
        key = f"caracal/nccl_id/{group_key}/{_ids_shared[group_key]}"
        _ids_shared[group_key] += 1
        store = dist.distributed_c10d._get_default_store()
        if self.rank == 0:
            store.set(key, bytes(torch.ops.caracal.nccl_unique_id().tolist()))
        return torch.tensor(list(store.get(key)), dtype=torch.uint8)

    def __repr__(self):
        return (f"caracal.World({self.backend}, size={self.size}, rank={self.rank}, device={self.device}, "
                f"timeout={self.timeout})")


class _Engine:
    """One C++ MoELayer (src/torch_ext/torch_layer.hpp) with its world: the buffers of every
    caracal.MoE of one configuration on one World. Freed when the last layer using it goes (layers
    alive at interpreter exit are left to the OS: destroying an NCCL world is collective and the
    other ranks may be gone by then)."""

    def __init__(self, world, hidden, intermediate, num_experts, top_k, shared_intermediate, tokens_per_rank,
                 normalize, router_scale, gemm_ctas, exchange_sms, fused_forward, ring_rows, bf16_weight_gradients):
        unique_id = world._next_unique_id() if world.backend == "nccl" else None
        self.handle = torch.ops.caracal.create_layer(
            hidden, intermediate, num_experts, top_k, shared_intermediate, world.size, tokens_per_rank, normalize,
            router_scale, world.backend, world.rank, unique_id, world.device.index, gemm_ctas, exchange_sms,
            fused_forward, ring_rows, bf16_weight_gradients, world.timeout)
        self.layer = torch.tensor(self.handle, dtype=torch.int64)  # what the traced ops take
        self._finalizer = weakref.finalize(self, torch.ops.caracal.destroy_layer, self.handle)
        self._finalizer.atexit = False


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
