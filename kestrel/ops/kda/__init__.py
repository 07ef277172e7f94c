"""KDA ops, dispatched by device: Triton kernels on CUDA, the plain-torch reference elsewhere."""

import torch

from kestrel.ops import kernel
from kestrel.ops.kda import reference
from kestrel.ops.kda.reference import beta_from_logits, causal_conv1d, kda_gate, kda_step, l2norm  # noqa: F401
from kestrel.ops.kda.reference import state_dtype_for  # noqa: F401
from kestrel.ops.kda.reference import kda_chunked_factored as chunked_factored  # noqa: F401
from kestrel.ops.kda.reference import KDAReplay, PackedConvWindows  # noqa: F401


def chunked(q, k, v, g, beta, **kw):
    """See reference.kda_chunked."""
    fn = kernel(__name__ + ".triton", "kda_chunked", q) or reference.kda_chunked
    return fn(q, k, v, g, beta, **kw)


# on: a decode's recurrence launch also computes sigmoid of the output norm's gate (out_gate below, one program a
# head beside the recurrence), which the o_proj GEMV's gated-RMSNorm prologue then reads as it is, rather than
# every one of its programs computing all H * V sigmoids (k3-mini, offline sm_90 SASS: the prologue is ~370 of the
# 655 instructions that GEMV issues after its wait, against 286 with none); bit-equal either way
OUT_GATE_IN_RECUR = False


def decode(mixed, conv_weight, conv_state, ssm, slots, raw_gate, A_log, dt_bias, lower_bound, beta, scale,
           beta_logits: bool = False, out_gate=None):
    """One decode token per sequence: conv tail update, SiLU, L2 norm, gates, recurrence; in place on the slots.

    mixed [B, 3HK] (q, k, v projections); conv_weight [3HK, W]; conv_state [S, W - 1, 3HK]; ssm [S, H, K, V];
    slots [B]; raw_gate [B, H, K] (gate bottleneck output); beta [B, H], or with beta_logits its logits b
    (beta = sigmoid(b) in the state dtype, computed inside the kernel on GPU). Returns o [B, H, V] in v's dtype.
    out_gate: the output norm's gate projection [B, H * V]; then returns (o, sigmoid(out_gate) in fp32 where the
    recurrence launch computed it beside the recurrence (GPU), else None).
    """
    fn = kernel(__name__ + ".triton", "kda_decode", mixed)
    if fn is not None:
        return fn(mixed, conv_weight, conv_state, ssm, slots, raw_gate, A_log, dt_bias, lower_bound, beta, scale,
                  beta_logits, out_gate=out_gate)
    o = reference.kda_decode(mixed, conv_weight, conv_state, ssm, slots, raw_gate, A_log, dt_bias, lower_bound, beta,
                             scale, beta_logits)
    return (o, None) if out_gate is not None else o


def verify(x, raw_gate, beta, lens, conv_weight, conv_state, ssm, slots, A_log, dt_bias, lower_bound, scale,
           snapshot_states: bool = False, beta_logits: bool = False):
    """Speculative verify over padded blocks (see reference.kda_verify): the committed state is read, not written;
    returns (o [B, L, H, V], KDAReplay). `lens` a list or a device tensor (CUDA-graph replays)."""
    fn = kernel(__name__ + ".triton", "kda_verify", x) or reference.kda_verify
    if fn is reference.kda_verify and isinstance(lens, torch.Tensor):
        lens = lens.tolist()
    return fn(x, raw_gate, beta, lens, conv_weight, conv_state, ssm, slots, A_log, dt_bias, lower_bound, scale,
              snapshot_states, beta_logits)


def fold(rec, conv_state, ssm, slots, commit, snapshots=None) -> None:
    """ReplaySSM: commit the first commit[i] verify steps of each block onto its state (see reference.kda_fold).
    commit: a list or a device tensor; snapshots: per block None or (steps, slot), or the device form, a pair of
    int tensors (steps [B], slot [B]) where 0 steps takes none (a CUDA graph's fold decides them on the device)."""
    fn = kernel(__name__ + ".triton", "kda_fold", rec.x)
    if fn is None:
        return reference.kda_fold(rec, conv_state, ssm, slots, *_host_form(commit, snapshots))
    return fn(rec, conv_state, ssm, slots, commit, snapshots)


def fold_layers(recs, conv_states, ssms, slots, commit, snapshots=None) -> None:
    """fold for several layers over the same slots and commits: on CUDA one fold launch for all the layers
    (triton.kda_fold_layers; a graph captures it), elsewhere one fold over the layers stacked
    (reference.kda_fold_layers)."""
    if recs and kernel(__name__ + ".triton", "kda_fold", recs[0].x) is None:
        return reference.kda_fold_layers(recs, conv_states, ssms, slots, *_host_form(commit, snapshots))
    # device integers the kernels read (int32 or int64) converted once, not once a layer (a conversion launched
    # plainly between two layers' folds also breaks their chain of dependent launches); most need none
    def ints(t):
        return t if t.dtype in (torch.int32, torch.int64) else t.to(torch.int32)

    if isinstance(commit, torch.Tensor):
        commit = ints(commit)
    if isinstance(snapshots, tuple):
        snapshots = tuple(ints(t) for t in snapshots)
    if recs:  # one launch for all the layers where their tensors agree (triton.kda_fold_layers)
        kernel(__name__ + ".triton", "kda_fold_layers", recs[0].x)(recs, conv_states, ssms, slots, commit, snapshots)


def _host_form(commit, snapshots):
    """(commit list, snapshots list) for the reference fold from a device tensor and the device form of snapshots,
    (steps [B], slot [B]) with steps 0 = none."""
    if isinstance(commit, torch.Tensor):
        commit = commit.tolist()
    if isinstance(snapshots, tuple):
        snapshots = [None if n <= 0 else (n, s) for n, s in zip(snapshots[0].tolist(), snapshots[1].tolist())]
    return commit, snapshots
