"""Fake kernels (for torch.compile / meta tracing) and the autograd formula of caracal's traced
ops, which src/torch_ext/torch_ops.cpp defines and implements for CUDA."""
import torch


@torch.library.register_fake("caracal::moe_forward")
def _moe_forward_fake(layer, x, topk_idx, topk_scores, w_gate_up, w_down, shared_w_gate_up, shared_w_down,
                      shared_scale):
    return x.new_empty(x.shape), torch.empty((), dtype=torch.int64, device="cpu")


@torch.library.register_fake("caracal::moe_backward")
def _moe_backward_fake(layer, forward_id, dy, w_gate_up, w_down, shared_w_gate_up, shared_w_down, shared_scaled,
                       top_k):
    f32 = dict(dtype=torch.float32, device=dy.device)
    rows = dy.shape[0]
    has_shared = shared_w_gate_up is not None
    grad = dict(dtype=w_gate_up.dtype, device=dy.device)  # weight gradients: the weights' dtype
    return (dy.new_empty(dy.shape),
            torch.empty(rows, top_k, **f32),
            torch.empty(w_gate_up.shape, **grad),
            torch.empty(w_down.shape, **grad),
            torch.empty(shared_w_gate_up.shape if has_shared else (0,), **grad),
            torch.empty(shared_w_down.shape if has_shared else (0,), **grad),
            torch.empty(rows if shared_scaled else 0, **f32))


def _setup_context(ctx, inputs, output):
    layer, _x, _idx, scores, w_gate_up, w_down, shared_w_gate_up, shared_w_down, shared_scale = inputs
    _y, forward_id = output
    ctx.shared_scaled = shared_scale is not None
    ctx.top_k = scores.shape[1]
    ctx.save_for_backward(layer, forward_id, w_gate_up, w_down, shared_w_gate_up, shared_w_down)


def _backward(ctx, dy, _d_forward_id):
    layer, forward_id, w_gate_up, w_down, shared_w_gate_up, shared_w_down = ctx.saved_tensors
    dx, d_scores, d_w_gate_up, d_w_down, d_shared_w_gate_up, d_shared_w_down, d_shared_scale = \
        torch.ops.caracal.moe_backward(layer, forward_id, dy.contiguous(), w_gate_up, w_down,
                                       shared_w_gate_up, shared_w_down, ctx.shared_scaled, ctx.top_k)
    has_shared = shared_w_gate_up is not None
    return (None, dx, None, d_scores, d_w_gate_up, d_w_down,
            d_shared_w_gate_up if has_shared else None,
            d_shared_w_down if has_shared else None,
            d_shared_scale if ctx.shared_scaled else None)


torch.library.register_autograd("caracal::moe_forward", _backward, setup_context=_setup_context)
