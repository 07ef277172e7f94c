"""Decode ladder on k3-mini (random bf16 weights): tokens/s per optimisation stage against the bandwidth floor and
Hugging Face transformers' KimiLinear eager decode, then whole-model decode throughput vs batch size.

  PYTHONPATH=. python benchmarks/decode_ladder.py [--ctx 1024] [--out DIR]

The decode loop drives KVPool / StatePool / Memory and ForwardBatch(DECODE) directly (no scheduler). Each stage
is timed at batch 1 with CUDA events (median). The floor is the bytes one decode step must move (active weights:
every dense weight, the routed experts actually chosen, the embedding row; KDA state and conv tails read and
written; the MLA latents read) over the measured device-to-device copy bandwidth.
"""

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import (Log, back_to_back, copy_bandwidth, cuda_time, graph_timeline,  # noqa: E402
                               kernel_breakdown, stamp)
from kestrel.models.presets import init_random  # noqa: E402
from kestrel.engine.cuda_graph import DecodeGraphRunner  # noqa: E402
from kestrel.mem.pools import KVPool, Memory, StatePool  # noqa: E402
from kestrel.models.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from kestrel.models.k3 import K3ForCausalLM  # noqa: E402
from kestrel.models.presets import kimi_linear_subset, preset_config  # noqa: E402
import kestrel.ops as ops  # noqa: E402
from kestrel.ops import attn_res as attn_res_ops, linear as linear_ops, mla as mla_ops, moe as moe_ops  # noqa: E402
from kestrel.ops import reference_ops  # noqa: E402
from kestrel.ops.kda import triton as kda_triton, triton_conv as kda_conv  # noqa: E402

DT = torch.bfloat16


def active_bytes(model, top_k: int, num_experts: int) -> int:
    """Weight bytes one token reads: routed experts count k/E of their tensors, the embedding one row."""
    total = 0
    for name, p in model.named_parameters():
        n = p.numel() * p.element_size()
        if "embed_tokens" in name:
            n = p.shape[-1] * p.element_size()
        elif "experts" in name and "shared" not in name and p.dim() == 3:
            n = n * top_k // num_experts
        total += n
    for name, b in model.named_buffers():
        total += b.numel() * b.element_size()
    return total


def state_bytes(cfg, ctx: int) -> int:
    """KDA state + conv tails read and written, MLA latents read, per sequence per step."""
    kda = len(cfg.kda_layer_ids) * (cfg.linear_num_heads * cfg.linear_head_dim**2 * 4
                                    + (cfg.short_conv_kernel_size - 1) * cfg.conv_dim * 2) * 2
    return kda + len(cfg.mla_layer_ids) * (ctx + 1) * cfg.kv_latent_dim * 2


class DecodeSetup:
    """Pools with `batch` live sequences of `ctx` cached tokens (random latents and states) and their batches."""

    def __init__(self, cfg, batch: int, ctx: int, page_size: int):
        self.cfg, self.batch, self.ctx, self.ps = cfg, batch, ctx, page_size
        pages_per_seq = -(-(ctx + 1) // page_size)
        self.kv = KVPool(cfg, batch * pages_per_seq + 1, page_size, DT, "cuda")
        self.st = StatePool(cfg, batch + 1, DT, "cuda")
        self.mem = Memory(self.kv, self.st)
        for b in self.kv.buffers.values():
            b.normal_()
        for t in list(self.st.conv.values()) + list(self.st.ssm.values()):
            t.normal_(std=0.05)
        pages = [self.kv.pages.alloc(pages_per_seq) for _ in range(batch)]
        self.slots = torch.tensor(self.st.slots.alloc(batch), device="cuda")
        self.page_table = torch.tensor(pages, dtype=torch.int32, device="cuda")
        pos = ctx
        self.loc = torch.tensor([p[pos // page_size] * page_size + pos % page_size for p in pages], device="cuda")
        self.ids = torch.randint(3, cfg.vocab_size, (batch,), device="cuda")

    def batch_fb(self) -> ForwardBatch:
        B = self.batch
        return ForwardBatch(ForwardMode.DECODE, self.ids, torch.full((B,), self.ctx, device="cuda"), [1] * B,
                            [self.ctx] * B, mem=self.mem, page_table=self.page_table, out_cache_loc=self.loc,
                            state_slots=self.slots,
                            seq_lens_t=torch.full((B,), self.ctx + 1, dtype=torch.int32, device="cuda"))


def build_model(cfg, seed=0):
    with torch.device("cuda"):
        model = K3ForCausalLM(cfg, dtype=DT)
    init_random(model, seed)
    return model.eval()


@torch.no_grad()
def ladder(cfg, model, args, log, floor_s):
    rows = []
    setup = DecodeSetup(cfg, 1, args.ctx, args.page_size)
    fb = setup.batch_fb()

    def stage(name, fn, iters):
        t = cuda_time(fn, warmup=2, iters=iters)
        rows.append((name, t, 1 / t, floor_s / t))
        log(f"stage {name:<44} {t * 1e3:8.3f} ms/step {1 / t:8.1f} tok/s  floor fraction {floor_s / t:6.1%}")

    def captured():
        runner = DecodeGraphRunner(model, setup.mem, batch_sizes=(1,), max_pages_per_seq=setup.page_table.shape[1])
        runner.capture()
        return runner

    states = list(setup.st.ssm.values()) + list(setup.st.conv.values())
    snap = [t.clone() for t in states]

    def from_snapshot(fn):
        """fn's logits from the caches as they were before the timed stages (same state in, comparable out)."""
        for t, s in zip(states, snap):
            t.copy_(s)
        return fn().logits.float().clone()

    gemv, small_gemv, default_pdl = linear_ops.GEMV_MAX_M, linear_ops.SMALL_GEMV_MAX_M, ops.PDL
    pdl = not args.skip_pdl  # the last stages (the engine's default; --disable-pdl turns it off)
    linear_ops.GEMV_MAX_M = linear_ops.SMALL_GEMV_MAX_M = 0  # the stages before the GEMV one: all on cuBLAS
    linear_ops.FUSE_PROLOGUES = False  # before the last: activations and norms as their own kernels
    linear_ops.FUSE_PAIRS = False  # the MoE tail's two projections as two GEMVs
    ops.PDL = False  # and before the PDL ones: plain launches
    # MLA's latent norm, concatenation and cache write as torch ops, its absorbed projections as batched matmuls
    mla_ops.FUSED_STORE = mla_ops.FUSED_ABSORB = False
    # the routing as its own launch
    moe_ops.ROUTE_IN_EXPERTS = False
    # the shared experts in line, after the routed ones (the default at one token)
    moe_ops.SHARED_STREAM = False
    # the KDA prep and recurrence kernels wait before reading the state, tail and weights
    kda_triton.EARLY_STATE = False
    # the KDA prep kernel in its [taps, channels] window form (layout conversions after its wait)
    kda_conv.CHANNELS_FIRST = False
    with reference_ops():
        stage("eager, reference ops", lambda: model(fb), 5)
    stage("eager, Triton kernels", lambda: model(fb), 10)
    runner = captured()
    stage("CUDA graph, Triton kernels", lambda: runner.run(fb), 50)
    # check the graph reproduces the eager step (same state in, same logits out)
    eager = from_snapshot(lambda: model(fb))
    graphed = from_snapshot(lambda: runner.run(fb))
    log(f"graph vs eager logits rel err {((graphed - eager).norm() / eager.norm()).item():.2e}")
    runner = None
    model.fuse_projections()
    stage("eager, + fused projection GEMMs", lambda: model(fb), 10)
    runner = captured()
    stage("CUDA graph, + fused projection GEMMs", lambda: runner.run(fb), 50)
    runner = None
    linear_ops.GEMV_MAX_M, linear_ops.SMALL_GEMV_MAX_M = gemv, small_gemv
    runner = captured()
    stage("CUDA graph, + Triton GEMV for one-row linears", lambda: runner.run(fb), 50)
    plain = from_snapshot(lambda: runner.run(fb))
    runner = None
    ops.PDL = pdl
    moe_ops.EARLY_IDS = attn_res_ops.EARLY_SETTLE = False
    variants = {}  # the last stages' graphs, kept for an interleaved comparison

    def kept_stage(key, label, against, what):
        """A stage whose graph is kept. Its logits against the same kernels launched plainly (under PDL a read
        before the wait that should have come after it would race: they must be bit-equal), and against the
        previous stage's (`against`: a kernel that rounds otherwise moves a random 24-layer bf16 model's logits
        far, so that figure is a rounding report, not a check)."""
        runner = variants[key] = captured()
        stage(label, lambda: runner.run(fb), 50)
        out = from_snapshot(lambda: runner.run(fb))
        if pdl:
            ops.PDL = False
            launched_plainly = captured()
            ref = from_snapshot(lambda: launched_plainly.run(fb))
            ops.PDL = True
            launched_plainly = None
            log(f"{key}: PDL graph bit-equal to the same kernels launched plainly: {torch.equal(out, ref)}")
        same = torch.equal(out, against)
        log(f"{what}: {'bit-equal' if same else f'rel err {((out - against).norm() / against.norm()).item():.2e}'}")
        return out

    if pdl:
        kept_stage("PDL", "CUDA graph, + programmatic dependent launch", plain, "PDL graph vs the GEMV stage")
    linear_ops.FUSE_PROLOGUES = True
    fused = kept_stage("+ prologues", "CUDA graph, + prologues fused into the GEMV", plain,
                       "fused prologues vs unfused")
    moe_ops.EARLY_IDS = True  # the down projection then sums the k experts as a tree: rounding-level differences
    early = kept_stage("+ early expert streams", "CUDA graph, + expert weights streamed before the wait", fused,
                       "early expert streams vs in order")
    attn_res_ops.EARLY_SETTLE = True
    settle = kept_stage("+ early settle", "CUDA graph, + settle reads bank and stream before the wait", early,
                        "early settle vs waiting first")
    mla_ops.FUSED_STORE = True
    store = kept_stage("+ latent store", "CUDA graph, + MLA latent norm and cache write in one kernel", settle,
                       "one-kernel latent store vs torch ops")
    mla_ops.FUSED_ABSORB = True
    absorb = kept_stage("+ head GEMVs", "CUDA graph, + MLA absorbed projections as per-head GEMVs", store,
                        "per-head GEMVs vs batched matmuls")
    moe_ops.ROUTE_IN_EXPERTS = True
    routed = kept_stage("+ routing in experts", "CUDA graph, + expert GEMVs choose the experts", absorb,
                        "routing inside the expert kernels vs its own launch")
    linear_ops.FUSE_PAIRS = True
    paired = kept_stage("+ paired MoE tail", "CUDA graph, + MoE up and shared down projections as one GEMV", routed,
                        "paired tail vs two GEMVs")
    kda_triton.EARLY_STATE = True
    early_state = kept_stage("+ early KDA state", "CUDA graph, + KDA state and conv tail read before the wait", paired,
                             "early KDA state vs waiting first")
    kda_conv.CHANNELS_FIRST = True
    kept_stage("+ KDA prep in channel columns", "CUDA graph, + KDA prep in per-tap channel columns", early_state,
               "channel-column prep vs the window form")
    # (the AttnRes settle's one-layout form, 2026-12-07 14:30 session, 1.046x on an H100, replaced its 1-D form
    # everywhere: every stage above from "settle" on runs it; there is no stage without it)
    # (moe_ops.SHARED_STREAM, the shared experts on a second stream, serves 4-128 tokens: not batch 1)
    # (call 2 of the 2026-12-01 02:47 session, benchmarks/device/device_run56.sh, also timed the KDA gate's up
    # projection inside the prep kernel, 1.414 against 1.417 ms; the dense FFN's K = 8192 down projection loading whole tiles
    # of two rows, with its activation inside, 1.418, or as its own kernel, 1.416: all within noise, not kept)
    # (call 7 of the 2026-12-01 01:16 session also let the router GEMV's last program, found by an atomic counter,
    # choose the experts for the expert kernels to read: 1.395 against 1.371 ms interleaved; its routing added
    # ~2.4 us to the router's launch on the chain and took ~1.4 from the up GEMV; dropped)
    # (the settle inside the router GEMV was within noise of its own kernel in calls 4-6 of the 23:49 session,
    # 1.425 against 1.414 ms interleaved; the mixer's settle inside its fused projection GEMV, call 1, 2.224 against
    # 1.831 ms: each of its 1604 programs recomputes the settle from L2. Both removed on 2026-12-01, 02:47 session)
    # (call 6 of the 17:25 session also timed the KDA decode kernels reading their inputs and state before the
    # wait, after a late-trigger gate projection: 1.674 against 1.657 ms without; dropped)
    # (call 159, 2026-12-06 05:11 session, H100, tree 0e11d03: the settle with the bank's softmax-weighted sum and
    # its norm formed before the wait, one block reduction after it in place of three: 1.486 against 1.488 ms back
    # to back turn about, 1.566 against 1.562 interleaved, the settles charged 229 against 228 us a step: dropped)
    # (calls 160-161, 2026-12-06 20:22 session, H100, tree 54eceae: every settle as the epilogue of the GEMV ending
    # the sublayer before it, run by the launch's last program found by an atomic ticket, 259 kernels a step in place
    # of 307: 1.639 against 1.496 ms back to back turn about; the settle's [values, width] tile set the fused GEMVs'
    # registers to 164 a thread (71 without), so their tiles streamed in two waves; capped at 96, with spills, 1.698
    # against 1.499. Reverted)
    # (call 1 of the 2026-12-01 01:16 session timed L2 prefetches, benchmarks/device/device_run47.sh: the router GEMV's
    # last program asking L2 for the chosen experts, 1.391 -> 3.770 ms; the settles asking for their sublayer's
    # other weights, -> 6.777 ms. Reverted: see docs/kernels.md)
    interleaved(variants, fb, log)
    # the stages above count the host's issue of each step (cuda_time waits for every step before the next); the
    # engine's overlap scheduler issues step n + 1 while the device runs step n
    last = variants["+ KDA prep in channel columns"]
    t = back_to_back(lambda: last.run(fb), 50)
    log(f"last stage back to back (the engine's steady state): {t * 1e3:.3f} ms/step {1 / t:.1f} tok/s  "
        f"floor fraction {floor_s / t:.1%}")
    for name in ("+ early KDA state", "+ KDA prep in channel columns"):
        graph_timeline(lambda: variants[name].run(fb), log, label=name, sequence=range(0, 72))
    variants.clear()  # the graphs go (their memory pools with them)
    if args.tile_sweep:
        tile_sweep(captured, fb, log)
    ops.PDL = False  # a PDL kernel's time would include its wait for the one before
    kernel_breakdown(lambda: model(fb), log)
    ops.PDL = default_pdl
    verify_step(cfg, model, setup, args, log)
    setup = None
    return rows


@torch.no_grad()
def verify_step(cfg, model, setup, args, log, block: int = 8):
    """A speculative verify step at batch 1 (one block of `block` tokens, CUDA graph) against the decode step:
    what a verify costs relative to one plain token, the number DSpark's batch-1 speed-up divides by."""
    from kestrel.engine.cuda_graph import VerifyGraphRunner

    ps, ctx = setup.ps, setup.ctx
    row = setup.page_table[0].tolist()
    locs = [row[(ctx + i) // ps] * ps + (ctx + i) % ps for i in range(block)]
    fb = ForwardBatch(ForwardMode.VERIFY, torch.randint(3, cfg.vocab_size, (block,), device="cuda"),
                      torch.arange(ctx, ctx + block, device="cuda"), [block], [ctx], mem=setup.mem,
                      page_table=setup.page_table[:1], out_cache_loc=torch.tensor(locs, device="cuda"),
                      state_slots=setup.slots[:1],
                      verify_lens_t=torch.tensor([block], dtype=torch.int32, device="cuda"),
                      key_lens_t=torch.arange(ctx + 1, ctx + block + 1, dtype=torch.int32, device="cuda"))
    runner = VerifyGraphRunner(model, setup.mem, (1,), block, setup.page_table.shape[1], ())
    t = cuda_time(lambda: runner.run(fb), warmup=2, iters=30)
    log(f"verify step, CUDA graph, batch 1, block {block}: {t * 1e3:.3f} ms")
    kernel_breakdown(lambda: model(fb), log, top=10, label=f"verify block {block}")
    runner = None


def tile_sweep(captured, fb, log):
    """The final graph with other tiles (module settings of the kernels: the one-row GEMV's rows per program, the
    expert up and down GEMVs' rows, whole-tile limits and warps), captured one by one and timed turn about: how a
    launch should be shaped when it is latency-bound inside a PDL graph. (Call 4 of the 17:25 session also timed
    GEMV rows x2 (0.961x), up 2 down 1 (0.988x), settle warps 4 and 16; call 5 of the 23:49 session, against
    the then default up 4 down 2: up 8 1.025x, up 8 down 4 1.041x, up 8 with 8 warps 0.981x, up 16 with 8 warps
    0.999x; the 2026-12-01 01:16 session, against up 8 / down 4: the up tile's columns split across the wait, a
    quarter / half before it, 0.960x / 0.979x; the up kernel capped at 128 registers 0.989x; whole-tile GEMVs with
    more tiles than k programs an SM run as k programs an SM each serving several tiles, k = 2 / 3 / 4 / 6:
    0.919x / 0.944x / 0.979x / 1.001x. Those knobs were not kept.)"""
    from kestrel.ops.linear import triton as lt
    from kestrel.ops.moe import triton as mt

    configs = {
        "default": {},
        "experts up + down one launch": {(mt, "FUSED_UPDOWN"): True},
        "gemv rows /2": {(lt, "ROWS"): (2, 4)},
        "experts up 4, down 2": {(mt, "GEMV_UP_ROWS"): (4, 4), (mt, "GEMV_DOWN_ROWS"): 2},
        "experts up 8, 8 warps": {(mt, "UP_WARPS"): 8},
        "experts up 16, 8 warps": {(mt, "GEMV_UP_ROWS"): (16, 16), (mt, "UP_TILE_MAX"): 16384, (mt, "UP_WARPS"): 8},
    }
    runners = {}
    for name, overrides in configs.items():
        saved = {k: getattr(*k) for k in overrides}
        for (mod, attr), v in overrides.items():
            setattr(mod, attr, v)
        try:
            runners[name] = captured()
        except Exception as e:  # a tile that does not compile or fit: report and go on
            log(f"tile sweep {name}: {type(e).__name__}: {e}")
        for (mod, attr), v in saved.items():
            setattr(mod, attr, v)
    interleaved(runners, fb, log, rounds=6)


def interleaved(variants: dict, fb, log, rounds: int = 8, iters: int = 20):
    """The graphs timed turn about (`rounds` rounds of `iters` steps each), so the machine's drift between
    minutes falls on every side alike; medians, and each against the first."""
    times = {k: [] for k in variants}
    for _ in range(rounds):
        for k, runner in variants.items():
            times[k].append(cuda_time(lambda: runner.run(fb), warmup=2, iters=iters))
    base = statistics.median(times[next(iter(variants))])
    for k, ts in times.items():
        m = statistics.median(ts)
        log(f"interleaved {k:<28} {m * 1e3:8.3f} ms/step (min {min(ts) * 1e3:.3f}, max {max(ts) * 1e3:.3f}) "
            f"{base / m:6.3f}x the first")


@torch.no_grad()
def batch_sweep(cfg, model, args, log):
    rows = []
    sizes = [int(b) for b in args.batches.split(",")]
    timelines = {int(b) for b in args.timeline_batches.split(",") if b}
    for B in sizes:
        setup = DecodeSetup(cfg, B, args.ctx, args.page_size)
        fb = setup.batch_fb()
        runner = DecodeGraphRunner(model, setup.mem, batch_sizes=(B,), max_pages_per_seq=setup.page_table.shape[1])
        runner.capture()
        t = cuda_time(lambda: runner.run(fb), warmup=2, iters=20)
        b2b = back_to_back(lambda: runner.run(fb), 20, rounds=3)
        rows.append((B, t, B / t, b2b))
        log(f"batch {B:4d}: {t * 1e3:8.3f} ms/step  {B / t:10.1f} tok/s; back to back {b2b * 1e3:8.3f} ms/step "
            f"{B / b2b:10.1f} tok/s")
        if B in timelines:
            graph_timeline(lambda: runner.run(fb), log, label=f"batch {B}", top=args.timeline_top)
        runner = setup = None
        gc.collect()
        torch.cuda.empty_cache()
    return rows


@torch.no_grad()
def hf_baseline(cfg, args, log, bw):
    """transformers' KimiLinearForCausalLM, eager decode at batch 1, the Kimi-Linear subset of the same sizes."""
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    from kestrel.models.config import _ALIASES

    sub = kimi_linear_subset(cfg)
    d = sub.to_hf_dict()
    names = {f.name for f in dataclasses.fields(KimiLinearConfig)}
    inv = {v: k for k, v in _ALIASES.items()}
    kw = {inv.get(k, k): v for k, v in d.items() if inv.get(k, k) in names}
    hc = KimiLinearConfig(**kw, linear_attn_config=d["linear_attn_config"], first_k_dense_replace=sub.first_k_dense_replace)
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(DT)
    with torch.device("cuda"):
        m = KimiLinearForCausalLM(hc)
    torch.set_default_dtype(old)
    m = m.to(DT).eval()
    ids = torch.randint(3, cfg.vocab_size, (1, args.hf_prompt), device="cuda")
    out = m(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    tok = out.logits[:, -1:].argmax(-1)

    def step():
        nonlocal cache, tok
        o = m(input_ids=tok, past_key_values=cache, use_cache=True)
        cache, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)

    t = cuda_time(step, warmup=2, iters=10)
    nbytes = active_bytes(m, sub.num_experts_per_token, sub.num_experts) + state_bytes(sub, args.hf_prompt)
    log(f"HF KimiLinear eager decode (Kimi-Linear subset, prompt {args.hf_prompt}): {t * 1e3:.3f} ms/step "
        f"{1 / t:.1f} tok/s; its floor {nbytes / bw * 1e3:.3f} ms -> fraction {nbytes / bw / t:.1%}")
    m = cache = None
    gc.collect()
    torch.cuda.empty_cache()
    return t, nbytes / bw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="k3-mini")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--hf-prompt", type=int, default=64)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--skip-pdl", action="store_true", help="no programmatic-dependent-launch stage")
    ap.add_argument("--tile-sweep", action="store_true", help="time the final graph with other GEMV tiles")
    ap.add_argument("--skip-ladder", action="store_true",
                    help="no stages: only the sweep (and the HF baseline) with the engine's default kernels")
    ap.add_argument("--timeline-batches", default="",
                    help="sweep batch sizes whose graphed step also gets a timeline (charged time by kernel)")
    ap.add_argument("--timeline-top", type=int, default=20, help="kernels listed per timeline")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    log = Log(os.path.join(args.out, "decode_ladder.log") if args.out else None)
    log(f"# decode ladder {stamp()} on {torch.cuda.get_device_name()} torch {torch.__version__}")
    bw = copy_bandwidth()
    # the caches' random contents from a fixed seed: runs are comparable (a random 24-layer bf16 model turns a
    # one-ulp difference between two kernels' roundings into any size of logit difference, input by input)
    torch.manual_seed(0)
    log(f"device-to-device copy bandwidth: {bw / 1e12:.2f} TB/s (read + write)")
    cfg = preset_config(args.preset)
    model = build_model(cfg)
    nbytes = active_bytes(model, cfg.num_experts_per_token, cfg.num_experts) + state_bytes(cfg, args.ctx)
    floor_s = nbytes / bw
    log(f"{args.preset}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params; batch-1 step moves "
        f"{nbytes / 1e9:.3f} GB -> floor {floor_s * 1e3:.3f} ms ({1 / floor_s:.0f} tok/s), ctx {args.ctx}")
    rows = [] if args.skip_ladder else ladder(cfg, model, args, log, floor_s)
    if args.skip_ladder:
        model.fuse_projections()  # the engine's inference form (the ladder fuses them on the way)
    # the sweep's graphs as the engine captures them: programmatic dependent launch on unless --skip-pdl (until the
    # 2026-12-01 01:16 session the sweep ran after the ladder had turned it off again: plain launches)
    ops.PDL = not args.skip_pdl
    sweep = [] if args.skip_sweep else batch_sweep(cfg, model, args, log)
    ops.PDL = False
    del model
    gc.collect()
    torch.cuda.empty_cache()
    hf = None
    if not args.skip_hf:
        try:
            hf = hf_baseline(cfg, args, log, bw)
        except Exception as e:  # the baseline is a reference only: report and go on
            log(f"HF baseline failed: {type(e).__name__}: {e}")
    log("\n| stage (batch 1, k3-mini, ctx %d) | ms/step | tok/s | fraction of floor |" % args.ctx)
    log("|---|---|---|---|")
    log(f"| bandwidth floor ({nbytes / 1e9:.2f} GB / {bw / 1e12:.2f} TB/s) | {floor_s * 1e3:.3f} | {1 / floor_s:.0f} | 100% |")
    for name, t, tps, frac in rows:
        log(f"| {name} | {t * 1e3:.3f} | {tps:.1f} | {frac:.1%} |")
    if hf:
        log(f"| HF KimiLinear eager (Kimi-Linear subset) | {hf[0] * 1e3:.3f} | {1 / hf[0]:.1f} | {hf[1] / hf[0]:.1%} of its own floor |")
    if sweep:
        log("\n| batch | ms/step (synced) | tok/s | ms/step (back to back) | tok/s |")
        log("|---|---|---|---|---|")
        for B, t, tps, b2b in sweep:
            log(f"| {B} | {t * 1e3:.3f} | {tps:.0f} | {b2b * 1e3:.3f} | {B / b2b:.0f} |")
    if args.out:
        with open(os.path.join(args.out, "decode_ladder.json"), "w") as f:
            json.dump({"floor_s": floor_s, "bw": bw, "bytes": nbytes, "stages": rows, "sweep": sweep, "hf": hf}, f)


if __name__ == "__main__":
    main()
