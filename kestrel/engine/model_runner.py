"""The model runner: owns the model and the memory pools, turns a scheduler Batch into a forward and a sample.

It decides nothing: the scheduler picks requests, pages and slots; the runner prepares tensors, executes the
state movements and the forward in order on one thread (the serial forward stream), and samples.
"""

import concurrent.futures
import gc
import logging

import torch

import kestrel.ops as ops
from kestrel.config import ServerArgs
from kestrel.engine import host_malloc
from kestrel.engine.batch import Batch, BatchResult, int_tensor
from kestrel.engine.sampler import SampleOutput, sample, take_plain_greedy
from kestrel.mem.pools import KVPool, Memory, StatePool
from kestrel.mem.unified import UnifiedMemory, unified_bytes
from kestrel.models.forward_batch import ForwardBatch, ForwardMode
from kestrel.models.k3 import K3ForCausalLM
from kestrel.models.layers.linear import cpu_kmajor_layout

log = logging.getLogger(__name__)

CPU_DEFAULT_TOKENS = 1 << 17
# off: a CPU model the engine loads keeps its checkpoint's row-major linear weights (the baseline of
# cpu_kmajor_layout). Paired per prompt on k3-small (benchmarks/cpu_knobs.py), K-major made batch-1 DSpark decoding
# ~5% faster (its 8-row verify products) and plain decoding 0.97x-1.04x in two runs (one-row products); batched
# prefill and decode forwards were unchanged
KMAJOR_CPU_WEIGHTS = True


class ModelRunner:
    def __init__(self, args: ServerArgs, model: K3ForCausalLM, slots_per_request: int, owns_model: bool = False):
        """owns_model: the engine loaded the model itself, so the runner may change its weights' storage layout
        (K-major on a CPU); a model handed in keeps its own (tests share one model between engines and references)."""
        self.args, self.model, self.cfg = args, model, model.cfg
        self.device = model.lm_head.weight.device
        self.dtype = model.dtype
        self.mem = self._make_memory(slots_per_request)
        self.graphs = None
        # a plain greedy decode step takes the decode graph's own argmax (off: sampled after the replay, as any
        # other step; benchmarks/overlap.py compares the two)
        self.graph_greedy = True
        # sampled tokens the next batch may read before the scheduler has seen them (a speculative step's graph
        # reads this buffer too: allocated before it is captured)
        steps = args.launch_steps if args.speculative else args.num_continuous_decode_steps
        self.future_size = 4 * args.max_running_requests * steps + 16
        self.future = torch.zeros(self.future_size + 1, dtype=torch.long, device=self.device)
        # a verify step's prefix length per request after its commit, beside its last token in `future`: a verify
        # chained onto it takes the request's prefix length from there on the device. The last entry of both is a
        # scratch the padding rows of a step write.
        self.future_prefix = torch.zeros(self.future_size + 1, dtype=torch.long, device=self.device)
        # process-wide, before any graph is captured (launches are recorded with their attributes); CPU tensors and
        # pre-Hopper GPUs never launch with it whatever this says
        ops.PDL = not args.disable_pdl
        if self.device.type == "cpu" and not args.disable_host_malloc_tuning:
            host_malloc.keep_freed_memory()  # a prefill's large temporaries otherwise fault their pages in each time
        self.kmajor = self.device.type == "cpu" and KMAJOR_CPU_WEIGHTS and owns_model
        if self.kmajor:
            cpu_kmajor_layout(model)  # MKL's few-row products (a verify block) run faster over it
        if self.device.type == "cuda":
            # one GEMM per group of projections sharing an input (weights become views: no extra memory)
            model.fuse_projections()
            if not args.disable_cuda_graph:
                self.graphs = self._capture_graphs()
        self.spec = None
        if args.speculative:
            from kestrel.spec.worker import SpecWorker

            self.spec = SpecWorker(self, args.speculative_draft_model_path, args.speculative_num_draft_tokens,
                                   args.speculative_state_rollback, not args.disable_verify_planner,
                                   args.context_lookup)
            if self.device.type == "cuda":  # like decode graph capture: verify graphs and profile at start-up
                self.spec.prepare(min(args.max_running_requests, args.cuda_graph_max_bs))

    def release(self) -> None:
        """Give the device memory back (pools, CUDA graphs, the drafter's buffers) so that another engine in this
        process can size its pools from it."""
        self.graphs, self.spec = None, None
        self.mem.release()
        if self.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()

    def _make_memory(self, slots_per_request: int):
        a = self.args
        ps = a.page_size
        tokens = a.max_total_tokens or self._default_tokens()
        slots = a.max_state_slots or a.max_running_requests * slots_per_request + 1
        if a.enable_unified_memory:
            # the same bytes the two static pools would take, as one pool either side can fill
            mem = UnifiedMemory(self.cfg, unified_bytes(self.cfg, tokens, slots, ps, self.dtype), ps, self.dtype,
                                self.device)
            log.info("unified memory: %.1f MB (%d-byte state blocks, %d-byte KV pages)", mem.pool.total / 1e6,
                     mem.pool.slot_bytes, mem.pool.page_bytes)
            return mem
        kv = KVPool(self.cfg, -(-tokens // ps) + 1, ps, self.dtype, self.device)
        state = StatePool(self.cfg, slots, self.dtype, self.device)
        log.info("memory: %d KV pages of %d tokens (%.1f MB), %d state slots (%.1f MB)", kv.num_pages - 1, ps,
                 kv.bytes_per_page() * kv.num_pages / 1e6, slots - 1, state.bytes_per_slot() * slots / 1e6)
        return Memory(kv, state)

    def graph_batch_sizes(self) -> list[int]:
        """The batch-size buckets CUDA graphs are captured for."""
        from kestrel.engine.cuda_graph import DEFAULT_BATCH_SIZES

        cap = min(self.args.cuda_graph_max_bs, self.args.max_running_requests)
        return sorted({b for b in DEFAULT_BATCH_SIZES if b <= cap} | {cap})

    def max_pages_per_seq(self) -> int:
        context = self.args.context_length or self.cfg.model_max_length
        return -(-context // self.args.page_size)

    def _capture_graphs(self):
        from kestrel.engine.cuda_graph import DecodeGraphRunner

        sizes = self.graph_batch_sizes()
        runner = DecodeGraphRunner(self.model, self.mem, sizes, self.max_pages_per_seq(), self.device,
                                   future=self.future, greedy=True)
        runner.capture()
        log.info("captured decode CUDA graphs for batch sizes %s", sizes)
        return runner

    def _default_tokens(self) -> int:
        if self.device.type != "cuda":
            return CPU_DEFAULT_TOKENS
        torch.cuda.empty_cache()  # memory cached from an engine shut down earlier in this process counts as free
        free, _ = torch.cuda.mem_get_info(self.device)
        per_token = self.cfg.kv_latent_dim * len(self.cfg.mla_layer_ids) * torch.finfo(self.dtype).bits // 8
        return max(4096, int(free * self.args.mem_fraction_static * 0.5) // max(per_token, 1))

    def table(self, b: Batch, rows: int) -> torch.Tensor:
        """The batch's page table (int32, on the host) with padding rows of the scratch page up to `rows`."""
        table = b.page_table
        if rows == table.shape[0]:
            return table
        pad = torch.full((rows - table.shape[0], table.shape[1]), self.mem.scratch_page, dtype=torch.int32)
        return torch.cat([table, pad])

    def to_device(self, data, dtype=torch.long) -> torch.Tensor:
        """Host data (a list or a CPU tensor) on the runner's device without waiting for the device
        (`ops.host_ints`)."""
        return ops.host_ints(data, self.device, dtype)

    @torch.inference_mode()
    def run(self, b: Batch) -> BatchResult:
        for op in b.mem_ops:
            self.mem.run(op)
        if b.mode == ForwardMode.VERIFY:
            return self.spec.run(b)
        if self.spec is not None:
            self.spec.interrupted()
        if b.launch_steps > 1:
            return self._run_steps(b)
        B = len(b.reqs)
        width = b.page_table.shape[1]
        if (b.mode == ForwardMode.DECODE and self.spec is None and self.graphs is not None
                and self.graphs.serves(B, width) and b.sample_rows == list(range(B)) and b.track is None):
            # the common decode step: the integers straight into the graph's static inputs, two copies
            ints, bucket = self.graphs.host_ints(
                (b.input_ids, b.prefix_lens, b.state_slots, b.out_cache_loc, [p + 1 for p in b.prefix_lens],
                 b.future_idx), B)
            table = self.table(b, bucket)
            out, future_idx, tokens = self.graphs.run_host(ints, table, B)
            if tokens is not None and self.graph_greedy and take_plain_greedy(b.sampling_states, b.want_logprobs,
                                                                              b.top_logprobs_num):
                return BatchResult.pending(tokens)  # the graph took the argmax and wrote the future buffer
            return self._sample(b, out, future_idx)
        if b.mode == ForwardMode.DECODE:
            positions = b.prefix_lens
        else:
            positions = [i for p, n in zip(b.prefix_lens, b.extend_lens) for i in range(p, p + n)]
        cu = [0]
        for n in b.extend_lens:
            cu.append(cu[-1] + n)
        # every integer of the step in one host-to-device copy: the sizes of its parts, then the parts as views
        parts = (b.input_ids, positions, b.out_cache_loc, b.state_slots,
                 [p + n for p, n in zip(b.prefix_lens, b.extend_lens)], [cu[r + 1] - 1 for r in b.sample_rows],
                 b.future_idx, [cu[r + 1] - 1 for r in b.feature_rows] if self.spec is not None else [])
        flat: list[int] = []
        for part in parts:
            flat += part
        flat = self.to_device(torch.cat([int_tensor(flat), b.page_table.view(-1).long()]))
        ids, positions, locs, slots, seq_lens, logits_idx, future_idx, feature_idx, table = flat.split_with_sizes(
            [len(part) for part in parts] + [b.page_table.numel()])
        table = table.view(B, width)
        if table.is_cuda:  # the kernels read int32 tables; the reference ops take int64 as it is
            table = table.to(torch.int32)
        if min(b.input_ids) < 0:
            ids = torch.where(ids < 0, self.future[(-ids - 1).clamp_min(0)], ids)
        # a snapshot of the state at the end of a sequence's extend is a plain copy after the forward; the
        # forward itself only writes snapshots from inside an extend
        track, end_snapshots = None, []
        if b.track is not None:
            track = [t if t is not None and t[0] < n else None for t, n in zip(b.track, b.extend_lens)]
            end_snapshots = [(slot, t[1]) for t, n, slot in zip(b.track, b.extend_lens, b.state_slots)
                             if t is not None and t[0] == n]
            track = track if any(t is not None for t in track) else None
        fb = ForwardBatch(
            b.mode, ids, positions, b.extend_lens, b.prefix_lens, mem=self.mem,
            page_table=table, out_cache_loc=locs, state_slots=slots, track=track,
            logits_indices=logits_idx, seq_lens_t=seq_lens)
        if self.spec is not None:
            fb.capture_layers = self.spec.layers
        if self.graphs is not None and self.graphs.can_run(fb):
            out = self.graphs.run(fb)
        else:
            out = self.model(fb)
        for src, dst in end_snapshots:
            self.mem.run(("copy_slot", src, dst))
        if self.spec is not None:
            self.spec.keep_features(b, out.captured, feature_idx)
        return self._sample(b, out, future_idx)

    def _run_steps(self, b: Batch) -> BatchResult:
        """A launch of b.launch_steps decode steps (`num_continuous_decode_steps`): each step's sampled tokens are the
        next step's input on the device, and the host reads them all once, after the last. b's cache locations and
        future entries are step-major ([steps, requests]), and so are the result's tokens; the scheduler gave every
        request the pages of all its steps and left no prefix-cache snapshot in reach (b.track is None)."""
        B, k = len(b.reqs), b.launch_steps
        flat = self.to_device(torch.cat([int_tensor(b.input_ids + b.prefix_lens + b.state_slots + b.out_cache_loc
                                                    + b.future_idx), b.page_table.view(-1).long()]))
        ids, pos, slots, locs, future_idx, table = flat.split_with_sizes([B, B, B, k * B, k * B, b.page_table.numel()])
        table = table.view(B, b.page_table.shape[1])
        if table.is_cuda:
            table = table.to(torch.int32)
        if min(b.input_ids) < 0:
            ids = torch.where(ids < 0, self.future[(-ids - 1).clamp_min(0)], ids)
        locs = locs.view(k, B)
        # positions of every step at once; a step's sequence lengths are the next step's positions
        pos = pos + torch.arange(k + 1, device=pos.device)[:, None]
        # plain greedy now is plain greedy at every later step (nothing held back any more): the argmax alone
        greedy = take_plain_greedy(b.sampling_states, b.want_logprobs, b.top_logprobs_num, steps=k)
        steps = []
        for j in range(k):
            fb = ForwardBatch(ForwardMode.DECODE, ids, pos[j], [1] * B, [p + j for p in b.prefix_lens], mem=self.mem,
                              page_table=table, out_cache_loc=locs[j], state_slots=slots, seq_lens_t=pos[j + 1])
            out = self.graphs.run(fb) if self.graphs is not None and self.graphs.can_run(fb) else self.model(fb)
            s = (SampleOutput(ops.argmax(out.logits), None, None) if greedy else
                 sample(out.logits, b.sampling_states, b.want_logprobs, b.top_logprobs_num))
            ids = s.tokens
            steps.append(s)
        tokens = torch.cat([s.tokens for s in steps])
        self.future[future_idx] = tokens
        logprobs = torch.cat([s.logprobs for s in steps]) if b.want_logprobs or b.top_logprobs_num else None
        top = None
        if b.top_logprobs_num:
            top = tuple(torch.cat([s.top_logprobs[i] for s in steps]) for i in range(2))
        return BatchResult.pending(tokens, logprobs, top)

    def _sample(self, b: Batch, out, future_idx: torch.Tensor) -> BatchResult:
        """Sample the batch's sample rows from out.logits (one row each), publish the tokens to the future buffer
        and start their copy back."""
        if not b.sample_rows:
            return BatchResult([])
        s = sample(out.logits, b.sampling_states, b.want_logprobs, b.top_logprobs_num)
        self.future[future_idx] = s.tokens
        # on a GPU the tokens come back while the next batch launches: the scheduler resolves them
        return BatchResult.pending(s.tokens, s.logprobs, s.top_logprobs)


class ForwardThread:
    """Runs batches one after another on a single thread: the serial forward stream of the overlap scheduler on a
    CPU, where the forward computes (on a GPU the scheduler launches batches from its own thread).

    Submission order is execution order, so a restore queued before a forward happens before it, and a forward's
    state writes happen before the next forward's reads, with no locks on the hot path.
    """

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kestrel-forward")

    def submit(self, batch: Batch) -> concurrent.futures.Future:
        return self.pool.submit(self.runner.run, batch)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
