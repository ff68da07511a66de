"""Fake kernels (for torch.compile / meta tracing) and the autograd formula of caracal's traced
ops, which src/torch_ext/torch_ops.cpp defines and implements for CUDA."""
import torch


@torch.library.register_fake("caracal::moe_forward")
def _moe_forward_fake(layer, x, topk_idx, topk_scores, w_gate_up, w_down, shared_w_gate_up, shared_w_down,
                      shared_scale, w_fp8=None):
    return x.new_empty(x.shape), torch.empty((), dtype=torch.int64, device="cpu")


@torch.library.register_fake("caracal::moe_backward")
def _moe_backward_fake(layer, forward_id, x, topk_idx, topk_scores, shared_scale, dy, w_gate_up, w_down,
                       shared_w_gate_up, shared_w_down, w_fp8=None):
    f32 = dict(dtype=torch.float32, device=dy.device)
    rows = dy.shape[0]
    has_shared = shared_w_gate_up is not None
    grad = dict(dtype=w_gate_up.dtype, device=dy.device)  # weight gradients: the weights' dtype
    return (dy.new_empty(dy.shape),
            torch.empty(rows, topk_idx.shape[1], **f32),
            torch.empty(w_gate_up.shape, **grad),
            torch.empty(w_down.shape, **grad),
            torch.empty(shared_w_gate_up.shape if has_shared else (0,), **grad),
            torch.empty(shared_w_down.shape if has_shared else (0,), **grad),
            torch.empty(rows if shared_scale is not None else 0, **f32))


@torch.library.register_fake("caracal::quantize_weights")
def _quantize_weights_fake(layer, w_gate_up, w_down, shared_w_gate_up, shared_w_down, w_fp8):
    return None


def _setup_context(ctx, inputs, output):
    """Saves what backward needs: the forward's inputs and weights, FP8 layers' quantized ones among
    them (the layer replays the forward from them when it ran another forward since) and the
    forward's id."""
    layer, x, topk_idx, topk_scores, w_gate_up, w_down, shared_w_gate_up, shared_w_down, shared_scale = inputs[:9]
    w_fp8 = inputs[9] if len(inputs) > 9 else None
    _y, forward_id = output
    ctx.save_for_backward(layer, forward_id, x, topk_idx, topk_scores, shared_scale, w_gate_up, w_down,
                          shared_w_gate_up, shared_w_down, w_fp8)


def _backward(ctx, dy, _d_forward_id):
    saved = ctx.saved_tensors
    shared_scale, shared_w_gate_up = saved[5], saved[8]
    dx, d_scores, d_w_gate_up, d_w_down, d_shared_w_gate_up, d_shared_w_down, d_shared_scale = \
        torch.ops.caracal.moe_backward(*saved[:6], dy.contiguous(), *saved[6:])
    has_shared = shared_w_gate_up is not None
    return (None, dx, None, d_scores, d_w_gate_up, d_w_down,
            d_shared_w_gate_up if has_shared else None,
            d_shared_w_down if has_shared else None,
            d_shared_scale if shared_scale is not None else None,
            None)  # w_fp8: the weights' quantization, no gradient


torch.library.register_autograd("caracal::moe_forward", _backward, setup_context=_setup_context)
