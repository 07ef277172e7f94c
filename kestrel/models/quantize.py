"""Convert a model's routed experts to MXFP4 (the K3 checkpoint format for experts)."""

import torch

from kestrel.models.config import MXFP4Config
from kestrel.models.k3 import K3ForCausalLM
from kestrel.ops.mxfp4 import reference as mxfp4


@torch.no_grad()
def quantize_experts(model: K3ForCausalLM) -> K3ForCausalLM:
    """A copy of `model` whose routed experts are MXFP4 (packed + E8M0 scales); every other weight is shared."""
    cfg = model.cfg.replace(quantization=MXFP4Config())
    with torch.device("meta"):
        out = K3ForCausalLM(cfg, dtype=model.dtype)
    out = out.to_empty(device=model.lm_head.weight.device)
    out.tie_weights()
    dense = dict(model.named_parameters())
    dense.update(dict(model.named_buffers()))
    for name, t in list(out.named_parameters()) + list(out.named_buffers()):
        if name in dense:
            t.copy_(dense[name])
            continue
        base, kind = name.rsplit("_", 1)  # "...experts.w1", "packed" | "scale"
        w = dense[base]
        packed, scales = mxfp4.quantize(w.flatten(0, 1))
        t.copy_((packed if kind == "packed" else scales).view(t.shape))
    return out.eval()
