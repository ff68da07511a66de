"""caracal.MoE inside PyTorch's machinery: torch.compile(fullgraph=True), CUDA-graph capture of
forward+backward replayed with new routing, a torch.distributed world of size 1, and the errors a
user meets for bad tensors or misuse."""
import os
import tempfile

import pytest

from gpu_requirements import SKIP_MARKER

torch = pytest.importorskip("torch", reason=SKIP_MARKER + "PyTorch not installed")
import torch.nn.functional as F  # noqa: E402

import caracal  # noqa: E402
from test_moe_layer import SMALL, assert_matches, poison_allocator, random_inputs, rel_error  # noqa: E402

pytestmark = pytest.mark.gpu


class Block(torch.nn.Module):
    """RMSNorm -> router (softmax, top-k) -> caracal.MoE, with a residual: how a model uses it."""

    def __init__(self, tokens, world=None):
        super().__init__()
        self.norm = torch.nn.RMSNorm(SMALL["hidden"], device="cuda", dtype=torch.bfloat16)
        self.router = torch.nn.Linear(SMALL["hidden"], SMALL["num_experts"], bias=False, device="cuda",
                                      dtype=torch.bfloat16)
        self.moe = caracal.MoE(tokens_per_rank=tokens, world=world, **SMALL)

    def forward(self, x):
        h = self.norm(x)
        scores, idx = torch.topk(F.softmax(self.router(h).float(), dim=-1), SMALL["top_k"], dim=-1)
        return x + self.moe(h, idx, scores)


def test_torch_compile_fullgraph_matches_eager(seed):
    block = Block(128)
    x = torch.randn(128, SMALL["hidden"], device="cuda", dtype=torch.bfloat16)
    eager_x = x.clone().requires_grad_()
    y_eager = block(eager_x)
    y_eager.float().square().mean().backward()
    eager_grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad(set_to_none=True)

    compiled = torch.compile(block, fullgraph=True)
    comp_x = x.clone().requires_grad_()
    y_comp = compiled(comp_x)
    y_comp.float().square().mean().backward()
    assert rel_error(y_comp, y_eager) < 1e-2
    assert rel_error(comp_x.grad, eager_x.grad) < 2e-2
    for p, g in zip(block.parameters(), eager_grads):
        assert rel_error(p.grad, g) < 2e-2


def test_separately_compiled_blocks_compile_once(seed):
    """12 blocks, each torch.compile'd on its own (the FSDP2 way): one compiled graph serves all of
    them (the layer is named by a tensor, on which torch.compile does not specialize)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    world = caracal.World.loopback(1)
    blocks = [Block(64, world) for _ in range(12)]
    x = torch.randn(64, SMALL["hidden"], device="cuda", dtype=torch.bfloat16, requires_grad=True)
    h = x
    for block in blocks:
        h = torch.compile(block, backend=counter, fullgraph=True)(h)
    h.float().square().mean().backward()
    assert counter.frame_count == 1, f"{counter.frame_count} compilations for 12 blocks"
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()
    assert all(b.moe.w_down.grad is not None for b in blocks)


def test_state_dict_deepcopy_and_pickle(seed):
    """The state dict holds the four weights; a deep copy has its own weights on the same engine;
    pickling is refused, naming what to save instead."""
    import copy
    import pickle
    moe = caracal.MoE(tokens_per_rank=32, **SMALL)
    assert list(moe.state_dict()) == ["w_gate_up", "w_down", "shared_w_gate_up", "shared_w_down"]
    other = caracal.MoE(tokens_per_rank=32, **SMALL)
    other.load_state_dict(moe.state_dict())
    x, idx, scores = good_inputs(moe)
    with torch.no_grad():
        assert torch.equal(moe(x, idx, scores), other(x, idx, scores))
    clone = copy.deepcopy(moe)
    assert clone._engine is moe._engine and clone.world is moe.world
    for (name, p), q in zip(moe.named_parameters(), clone.parameters()):
        assert torch.equal(p, q) and p.data_ptr() != q.data_ptr(), name
    with torch.no_grad():
        clone.w_down.mul_(2)
        assert not torch.equal(moe(x, idx, scores), clone(x, idx, scores))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(moe)


def test_cuda_graph_replay_with_new_routing(seed):
    moe = caracal.MoE(tokens_per_rank=96, world=caracal.World.loopback(2), **SMALL)
    params = list(moe.parameters())
    x, idx, scores, dy, _ = random_inputs(moe, "uniform")
    static = [x.clone().requires_grad_(), idx.clone(), scores.clone().requires_grad_(), dy.clone()]
    for p in params:  # the graph accumulates into these: they must stay alive and in place
        p.grad = torch.zeros_like(p)

    def step():
        moe.zero_grad(set_to_none=False)
        static[0].grad = None
        static[2].grad = None
        y = moe(static[0], static[1], static[2])
        y.backward(static[3])
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph asks
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static = step()
    names = ["y", "x.grad", "topk_scores.grad"] + [name for name, _ in moe.named_parameters()]
    for kind in ["zipf", "empty_slots", "all_to_one", "uniform"]:
        x, idx, scores, dy, _ = random_inputs(moe, kind)
        with torch.no_grad():
            for dst, src in zip(static, (x, idx, scores, dy)):
                dst.copy_(src)
        graph.replay()
        replayed = [y_static, static[0].grad, static[2].grad] + [p.grad for p in params]
        replayed = [t.clone() for t in replayed]
        # Eager, for comparison; torch.autograd.grad leaves the graph's .grad tensors alone.
        poison_allocator()
        eager_x, eager_s = x.clone().requires_grad_(), scores.clone().requires_grad_()
        y = moe(eager_x, idx, eager_s)
        eager = [y.detach(), *torch.autograd.grad(y, [eager_x, eager_s, *params], dy)]
        for name, a, b in zip(names, replayed, eager):
            assert torch.equal(a, b), f"{kind}: {name} differs in {(a != b).sum().item()} of {a.numel()} elements"
        moe.check()


def test_process_group_world_refuses_multicast_unless_the_environment_turned_it_off(monkeypatch):
    """NCCL reads NCCL_NVLS_ENABLE once per process: only a "0" set before the process started can be
    trusted, so from_process_group refuses anything else, and never sets it itself."""
    import torch.distributed as dist
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            for value in (None, "1", ""):
                if value is None:
                    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
                else:
                    monkeypatch.setenv("NCCL_NVLS_ENABLE", value)
                with pytest.raises(RuntimeError, match=r"NCCL_NVLS_ENABLE is .*set NCCL_NVLS_ENABLE=0"):
                    caracal.World.from_process_group()
                assert os.environ.get("NCCL_NVLS_ENABLE") == value
        finally:
            dist.destroy_process_group()


def test_process_group_world_of_one(seed):
    import torch.distributed as dist
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        dist.init_process_group("nccl", init_method=f"file://{tmp}/store", rank=0, world_size=1,
                                device_id=torch.device("cuda", torch.cuda.current_device()))
        try:
            world = caracal.World.from_process_group()
            assert (world.backend, world.size, world.local_ranks) == ("nccl", 1, 1)
            moe = caracal.MoE(tokens_per_rank=80, world=world, **SMALL)
            assert_matches(moe, random_inputs(moe, "zipf"))
            flag = moe.fault_flag()
            handle = moe._engine.handle
            moe.close()
            del moe
            assert torch.ops.caracal.layer_holders(handle) == 1  # an NCCL engine outlives its layers
            with pytest.raises(RuntimeError, match=r"tensors from MoE.fault_flag\(\) still hold engines on ranks \[0\]"):
                world.close()
            del flag
            world.close()
            with pytest.raises(ValueError, match=r"names no live layer"):
                torch.ops.caracal.layer_holders(handle)
            with pytest.raises(RuntimeError, match=r"is closed; build layers on a new World"):
                caracal.MoE(tokens_per_rank=80, world=world, **SMALL)
            world.close()  # twice: harmless
        finally:
            dist.destroy_process_group()


# ---- Errors --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_moe():
    return caracal.MoE(tokens_per_rank=32, **SMALL)


def good_inputs(moe):
    x, idx, scores, _, _ = random_inputs(moe, "uniform")
    return x, idx, scores


@pytest.mark.parametrize("case, error, message", [
    (lambda x, i, s: (x.float(), i, s), TypeError, "x must be torch.bfloat16"),
    (lambda x, i, s: (x.cpu(), i, s), ValueError, "x must be on cuda"),
    (lambda x, i, s: (torch.cat([x, x[:1]]), i, s), ValueError, "t <= tokens_per_rank = 32 tokens for each of the R = 1"),
    (lambda x, i, s: (x[:, :64].contiguous(), i, s), ValueError, "x must have shape [32, 128]"),
    (lambda x, i, s: (x[:-1], i, s), ValueError, "topk_idx must have shape [31, 2]"),
    (lambda x, i, s: (x.t().contiguous().t(), i, s), ValueError, "x must be contiguous"),
    (lambda x, i, s: (x, i.float(), s), TypeError, "topk_idx must be torch.int32 or torch.int64"),
    (lambda x, i, s: (x, i[:, :1].contiguous(), s), ValueError, "topk_idx must have shape [32, 2]"),
    (lambda x, i, s: (x, i, s[:16]), ValueError, "topk_scores must have shape [32, 2]"),
    (lambda x, i, s: (x, i, s.half()), TypeError, "topk_scores must be torch.float32 or torch.bfloat16"),
    (lambda x, i, s: (x, i, "scores"), TypeError, "topk_scores must be a torch.Tensor"),
])
def test_bad_tensors_raise_naming_the_argument(small_moe, case, error, message):
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
        small_moe(*case(*good_inputs(small_moe)))


def test_rows_must_split_evenly_between_the_local_ranks():
    moe = caracal.MoE(tokens_per_rank=16, world=caracal.World.loopback(2), **SMALL)
    x, idx, scores = good_inputs(moe)
    with pytest.raises(ValueError, match="a multiple of 2\\), got 31"):
        moe(x[:31], idx[:31], scores[:31])


def test_bad_construction_raises():
    with pytest.raises(ValueError, match="multiple of the world size"):
        caracal.MoE(128, 128, 6, 2, 32, world=caracal.World.loopback(4))
    with pytest.raises(ValueError, match="hidden must be a multiple of 64"):
        caracal.MoE(100, 128, 8, 2, 32)  # D not a multiple of 64
    with pytest.raises(ValueError, match="top_k must be in"):
        caracal.MoE(128, 128, 8, 9, 32)
    with pytest.raises(ValueError, match="size must be an int >= 1"):
        caracal.World.loopback(0)


def test_expert_id_out_of_range_is_raised_at_check(small_moe):
    x, idx, scores = good_inputs(small_moe)
    idx[3, 1] = SMALL["num_experts"]  # one past the last expert
    small_moe(x, idx, scores)
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="expert"):
        small_moe.check()
    small_moe(*good_inputs(small_moe))  # the layer keeps working afterwards
    torch.cuda.synchronize()
    small_moe.check()


def test_buffers_come_from_the_caching_allocator(seed):
    """A loopback layer's buffers (memory(): the heap and the activations, per local rank) are
    blocks of PyTorch's caching allocator: torch.cuda.memory_allocated() counts them while the
    layer lives (up to the rounding of the heaps to 256 bytes and of blocks to 512)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    moe = caracal.MoE(tokens_per_rank=64, world=caracal.World.loopback(2), **SMALL)
    weights = sum(p.numel() * p.element_size() for p in moe.parameters())
    buffers = 2 * (moe.memory()["heap"] + moe.memory()["local"])
    with_layer = torch.cuda.memory_allocated() - before
    assert buffers + weights <= with_layer <= buffers + weights + 4096
    moe.close()  # the blocks go back; the parameters stay with the module
    assert buffers <= with_layer - (torch.cuda.memory_allocated() - before) <= buffers + 4096


def test_layers_of_one_configuration_share_one_engine(seed):
    """Layers of one configuration on one World share their buffers: a second layer adds only its
    weights to torch.cuda.memory_allocated(); another configuration gets an engine of its own."""
    world = caracal.World.loopback(2)
    first = caracal.MoE(tokens_per_rank=64, world=world, **SMALL)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    second = caracal.MoE(tokens_per_rank=64, world=world, **SMALL)
    weights = sum(p.numel() * p.element_size() for p in second.parameters())
    assert second._engine is first._engine
    assert torch.cuda.memory_allocated() - before == weights
    other = caracal.MoE(tokens_per_rank=32, world=world, **SMALL)
    assert other._engine is not first._engine
    assert caracal.MoE(tokens_per_rank=64, **SMALL)._engine is caracal.MoE(tokens_per_rank=64, **SMALL)._engine, \
        "layers built without a world share World.default()"


def test_memory_reports_the_layers_buffers():
    small = caracal.MoE(tokens_per_rank=32, **SMALL).memory()
    large = caracal.MoE(tokens_per_rank=256, **SMALL).memory()
    assert small["heap"] > 0 and small["local"] > 0
    assert large["heap"] > small["heap"] and large["local"] > small["local"]  # sized from T


def test_closed_layer_raises():
    moe = caracal.MoE(tokens_per_rank=32, **SMALL)
    inputs = good_inputs(moe)
    moe.close()
    with pytest.raises(ValueError, match="names no live layer"):
        moe(*inputs)
