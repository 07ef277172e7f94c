"""ReplaySSM: the verify pass reads the committed state without writing it; the fold commits any accepted prefix
bit-identically to the plain recurrence over the accepted tokens."""

import random

import pytest
import torch

from kestrel.mem.pools import KVPool, Memory, StatePool
from kestrel.models.forward_batch import ForwardBatch, ForwardMode
from kestrel.models.k3 import K3ForCausalLM
from kestrel.models.presets import init_random, preset_config
from kestrel.ops.kda import reference as ref


def layer_inputs(B, L, H=2, K=8, C=48, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, L, C, generator=g).to(dtype), torch.randn(B, L, H, K, generator=g).to(dtype),
            torch.rand(B, L, H, generator=g).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rollback", ["replay", "snapshot"])
@pytest.mark.parametrize("slot_layout", ["consecutive", "scattered"])
def test_fold_equals_plain_recurrence_bit_for_bit(dtype, rollback, slot_layout):
    """(consecutive slots: the CPU fold updates the pool through a view; scattered: gather, update, scatter)"""
    B, L, H, K = 5, 8, 2, 8
    C = 3 * H * K
    sdt = ref.state_dtype_for(dtype)
    rng = random.Random(0)
    for trial in range(4):
        x, raw, beta = layer_inputs(B, L, H, K, C, dtype, seed=trial)
        w = torch.randn(C, 4).to(dtype)
        conv = torch.randn(B + 1, 3, C).to(dtype)
        ssm = torch.randn(B + 1, H, K, K, dtype=sdt)
        A_log, dt_bias = torch.randn(H, dtype=sdt), torch.randn(H * K, dtype=sdt)
        slots = torch.arange(1, B + 1) if slot_layout == "consecutive" else torch.tensor([3, 1, 5, 2, 4])
        lens = [rng.randint(1, L) for _ in range(B)]
        before = (conv.clone(), ssm.clone())
        _, rec = ref.kda_verify(x, raw, beta, lens, w, conv, ssm, slots, A_log, dt_bias, -5.0, K**-0.5,
                                snapshot_states=rollback == "snapshot")
        assert torch.equal(conv, before[0]) and torch.equal(ssm, before[1]), "verify wrote the committed state"
        commit = [rng.randint(1, n) for n in lens]
        # the plain recurrence over exactly the accepted tokens, one token at a time, same batch layout
        plain_ssm, plain_conv = ssm.clone(), conv.clone()
        _, rec_plain = ref.kda_verify(x, raw, beta, commit, w, plain_conv, plain_ssm, slots, A_log, dt_bias, -5.0,
                                      K**-0.5)
        state = plain_ssm[slots]
        for t in range(max(commit)):
            ref.kda_update(state, rec_plain.k[:, t], rec_plain.v[:, t], rec_plain.g[:, t], rec_plain.beta[:, t])
        ref.kda_fold(rec, conv, ssm, slots, commit)
        assert torch.equal(ssm[slots], state)
        window = torch.cat([before[0][slots], x], 1)
        for i, c in enumerate(commit):
            assert torch.equal(conv[slots[i]], window[i, c : c + 3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slot_layout", ["consecutive", "scattered"])
def test_fold_of_layers_equals_the_fold_of_each_layer(dtype, slot_layout):
    """kda_fold_layers (one fold over the layers stacked) leaves every layer's conv tails and states bit-equal to
    folding each layer on its own, on fresh random records with ragged commits; with a snapshot it folds each
    layer alone (the same bits again, snapshot slots included)."""
    B, L, H, K, n = 5, 8, 2, 8, 4
    C = 3 * H * K
    sdt = ref.state_dtype_for(dtype)
    rng = random.Random(1)
    slots = torch.arange(1, B + 1) if slot_layout == "consecutive" else torch.tensor([3, 1, 5, 2, 4])
    for trial in range(3):
        gen = torch.Generator().manual_seed(100 + trial)
        convs = [torch.randn(B + 2, 3, C, generator=gen).to(dtype) for _ in range(n)]
        ssms = [torch.randn(B + 2, H, K, K, generator=gen).to(sdt) for _ in range(n)]
        recs = []
        lens = [rng.randint(1, L) for _ in range(B)]
        for layer in range(n):
            x, raw, beta = layer_inputs(B, L, H, K, C, dtype, seed=10 * trial + layer)
            w = torch.randn(C, 4, generator=gen).to(dtype)
            A_log, dt_bias = torch.randn(H, generator=gen).to(sdt), torch.randn(H * K, generator=gen).to(sdt)
            recs.append(ref.kda_verify(x, raw, beta, lens, w, convs[layer], ssms[layer], slots, A_log, dt_bias,
                                       -5.0, K**-0.5)[1])
        commit = [rng.randint(1, m) for m in lens]
        snaps = None if trial < 2 else [None, (commit[1], B + 1), None, None, None]
        want_c, want_s = [c.clone() for c in convs], [t.clone() for t in ssms]
        for rec, c, t in zip(recs, want_c, want_s):
            ref.kda_fold(rec, c, t, slots, commit, snaps)
        ref.kda_fold_layers(recs, convs, ssms, slots, commit, snaps)
        for layer in range(n):
            assert torch.equal(convs[layer], want_c[layer]), (trial, layer)
            assert torch.equal(ssms[layer], want_s[layer]), (trial, layer)
        assert not torch.equal(ssms[0], ssms[1])  # the layers' states differ: a mixed-up write-back would show


@pytest.mark.parametrize("lower_bound", [-5.0, None])
def test_verify_outputs_equal_the_token_loop(lower_bound):
    """The verify pass's outputs come from the closed (one WY chunk) form on CPU: equal to the token-by-token
    recurrence from the committed state to fp64 rounding, valid positions of ragged blocks included. With softplus
    gates steep enough to leave the closed form's range, the loop runs instead (same outputs)."""
    B, L, H, K = 4, 8, 2, 8
    C = 3 * H * K
    for trial, steep in ((0, False), (1, False), (2, True)):
        x, raw, beta = layer_inputs(B, L, H, K, C, torch.float64, seed=trial)
        if steep:
            raw = raw + 60.0  # softplus gates near -22 a step: the cumulative gate leaves the closed form's range
        gen = torch.Generator().manual_seed(trial)
        w = torch.randn(C, 4, dtype=torch.float64, generator=gen)
        conv = torch.randn(B + 1, 3, C, dtype=torch.float64, generator=gen)
        ssm = torch.randn(B + 1, H, K, K, dtype=torch.float64, generator=gen)
        A_log = torch.full((H,), -1.0, dtype=torch.float64)
        dt_bias = torch.randn(H * K, dtype=torch.float64, generator=gen)
        slots, lens = torch.tensor([2, 4, 1, 3]), [8, 3, 1, 6]
        o, rec = ref.kda_verify(x, raw, beta, lens, w, conv, ssm, slots, A_log, dt_bias, lower_bound, K**-0.5)
        q = ref.l2norm(ref.causal_conv1d(x, w, conv[slots])[0].view(B, L, 3, H, K)[:, :, 0])
        state = ssm[slots].clone()
        for t in range(L):
            want = ref.kda_step(state, q[:, t], rec.k[:, t], rec.v[:, t], rec.g[:, t], rec.beta[:, t], K**-0.5)
            for i, n in enumerate(lens):
                if t < n:
                    assert torch.allclose(o[i, t], want[i], rtol=1e-10, atol=1e-10), (trial, i, t)
        closed = ref.kda_block_outputs(q, rec.k, rec.v, rec.g, rec.beta, ssm[slots], K**-0.5)
        assert (closed is None) == (steep and lower_bound is None)


def test_fold_matches_decode_steps_of_the_model():
    """Model level: VERIFY a block, fold a prefix, then decode == decoding the accepted tokens one by one."""
    torch.manual_seed(0)
    cfg = preset_config("k3-tiny")
    model = K3ForCausalLM(cfg, dtype=torch.float64)
    init_random(model, 0)
    mem = Memory(KVPool(cfg, 64, 4, torch.float64, "cpu"), StatePool(cfg, 4, torch.float64, "cpu"))
    toks = torch.randint(0, 4096, (30,)).tolist()
    table = torch.arange(1, 17, dtype=torch.int32).view(1, -1)
    slot = torch.tensor([1])

    def run(mode, start, ids):
        n = len(ids)
        fb = ForwardBatch(mode, torch.tensor(ids), torch.arange(start, start + n), [n], [start], mem=mem,
                          page_table=table, out_cache_loc=torch.arange(start, start + n) + 4, state_slots=slot,
                          seq_lens_t=torch.tensor([start + n]))
        with torch.no_grad():
            return fb, model(fb).logits

    run(ForwardMode.EXTEND, 0, toks[:20])
    committed = {l: (mem.conv_state(l)[1].clone(), mem.ssm_state(l)[1].clone()) for l in cfg.kda_layer_ids}
    fb, verify_logits = run(ForwardMode.VERIFY, 20, toks[20:28])
    for l in cfg.kda_layer_ids:
        assert torch.equal(mem.ssm_state(l)[1], committed[l][1])
    for l, rec in fb.replay.items():
        ref.kda_fold(rec, mem.conv_state(l), mem.ssm_state(l), slot, [5])
    ref_logits = model.reference_logits(toks[:28])
    assert (verify_logits - ref_logits[20:28]).abs().max() < 1e-10
    # continue decoding after the 5 committed tokens (positions 20..24): equals the full reference
    _, after = run(ForwardMode.DECODE, 25, [toks[25]])
    assert (after[0] - ref_logits[25]).abs().max() < 1e-10
