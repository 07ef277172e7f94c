"""`kestrel train`: the bundled k3-small model trained from scratch on the corpus of corpus.py.

Everything lives in one run directory: tokenizer/ and data/ (built on first use, reused after), ckpt.pt (model,
optimizer, step, RNG and data position; `--resume` continues from it) and model/ (the final bf16 checkpoint in
Hugging Face layout plus training_summary.json: what gets copied to kestrel/assets/k3-small/).

Batches are fixed-length blocks cut from two token streams (code, arithmetic), each a seeded per-epoch shuffle of
its <|bos|> doc <|eos|> documents; a per-step seeded draw decides each block's stream, so the data at step s
depends only on (seed, s) and the stream positions, both saved in checkpoints. A wall-clock budget is turned into
a step count once the first steps are timed, so the learning-rate schedule still ends at zero progress left.
"""

import argparse
import dataclasses
import json
import math
import os
import random
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer as HFTokenizer
from tqdm.auto import tqdm

from kestrel.models.k3 import K3ForCausalLM
from kestrel.models.loader import save_checkpoint
from kestrel.models.moe import Router
from kestrel.models.presets import preset_config
from kestrel.ops import reference_ops
from kestrel.train import corpus
from kestrel.train.tokenizer_train import BOS, PAD, STOP_IDS, train_tokenizer

# a wall-clock budget becomes a step count once steps are timed from this one on (earlier ones include warm-up
# costs), first after 20 timed steps, then again every RECALIBRATE_EVERY steps (the cosine shifts only slightly)
CALIBRATE_FROM = 5
RECALIBRATE_EVERY = 200


def flag_field(text: str, default=dataclasses.MISSING, **kw):
    """A field of a flags dataclass: its default and its --help text (read by add_dataclass_args)."""
    return field(default=default, metadata={"help": text}, **kw)


@dataclass(frozen=True)
class TrainArgs:
    """Every `kestrel train` flag (argparse reads the fields and help strings)."""

    out: str = flag_field("run directory: tokenizer/, data/, ckpt.pt and the final model/", default="runs/k3-small")
    preset: str = flag_field("model preset to train", default="k3-small")
    model_overrides: str | None = flag_field("JSON object of config fields to override (tiny test runs)", default=None)
    device: str = flag_field("cpu, cuda, cuda:N, or auto", default="auto")
    seed: int = flag_field("seeds initialisation, data order and arithmetic problems", default=0)
    max_steps: int = flag_field("step budget (also the schedule's length when no --max-minutes)", default=20_000)
    max_minutes: float | None = flag_field("wall-clock budget for the training loop (data preparation excluded)",
                                      default=None)
    batch_size: int = flag_field("sequences per step", default=64)
    seq_len: int = flag_field("tokens per sequence", default=512)
    lr: float = flag_field("peak learning rate", default=2e-3)
    min_lr_ratio: float = flag_field("final learning rate as a fraction of the peak", default=0.1)
    warmup_steps: int = flag_field("linear warm-up steps", default=150)
    weight_decay: float = flag_field("AdamW weight decay (matrices and embeddings only)", default=0.1)
    grad_clip: float = flag_field("gradient norm clip", default=1.0)
    init_std: float = flag_field("std of the normal init of linear layers and embeddings", default=0.02)
    router_bias_rate: float = flag_field("step of the auxiliary-loss-free expert balancing bias update", default=1e-3)
    arith_fraction: float = flag_field("fraction of blocks drawn from arithmetic documents", default=0.5)
    chat_fraction: float = flag_field("fraction of arithmetic documents written as chat transcripts", default=0.3)
    arith_docs: int = flag_field("arithmetic documents generated for the corpus", default=500_000)
    code_files: int | None = flag_field("use only the first N stdlib files (quick runs)", default=None)
    code_tests: bool = flag_field("include the stdlib's test suites in the code corpus", default=True)
    tokenizer: str | None = flag_field("an existing tokenizer directory instead of training one", default=None)
    precision: str = flag_field("CUDA matmul precision: bf16 (autocast) or fp32 (TF32)", default="bf16")
    save_every: int = flag_field("steps between checkpoints", default=500)
    resume: bool = flag_field("continue from OUT/ckpt.pt", default=False)
    prepare_only: bool = flag_field("build the tokenizer and corpus into OUT, then stop", default=False)
    export: str | None = flag_field("where the final model goes (default OUT/model)", default=None)
    progress: bool = flag_field("show a progress bar", default=True)

    def __post_init__(self):
        checks = {"batch_size": self.batch_size >= 1, "seq_len": self.seq_len >= 2, "max_steps": self.max_steps >= 1,
                  "lr": self.lr > 0, "arith_fraction": 0 <= self.arith_fraction <= 1,
                  "chat_fraction": 0 <= self.chat_fraction <= 1, "save_every": self.save_every >= 1,
                  "precision": self.precision in ("bf16", "fp32"),
                  "max_minutes": self.max_minutes is None or self.max_minutes > 0}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"train flag --{name.replace('_', '-')} = {getattr(self, name)!r} is out of range")


def add_train_args(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, TrainArgs)


def add_dataclass_args(parser: argparse.ArgumentParser, cls) -> None:
    """One flag per field of a flags dataclass: --field-name, typed and documented from the field."""
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=f.metadata["help"])
            continue
        typ = next(t for t in typing.get_args(f.type) if t is not type(None)) if typing.get_args(f.type) else f.type
        parser.add_argument(flag, type=typ, default=f.default, help=f.metadata["help"])


@dataclass
class TrainState:
    """What a checkpoint needs beyond weights and optimizer to continue exactly."""

    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0  # seconds spent in the training loop, over all sessions
    total_steps: int = 0  # the schedule's length
    code_pos: tuple[int, int] = (0, 0)  # (epoch, offset) in the code stream
    arith_pos: tuple[int, int] = (0, 0)


class TokenStream:
    """Documents of a pool, shuffled per epoch by (seed, epoch), read back to back as one endless token stream."""

    def __init__(self, pool: corpus.DocPool, seed: int, name: str):
        self.pool, self.seed, self.salt = pool, seed, sum(map(ord, name))
        self.epoch, self.pos = 0, 0
        self._epoch_tokens = None

    def _tokens(self) -> np.ndarray:
        if self._epoch_tokens is None:
            order = np.random.default_rng([self.seed, self.salt, self.epoch]).permutation(self.pool.num_docs)
            o = self.pool.offsets
            self._epoch_tokens = np.concatenate([self.pool.tokens[o[d] : o[d + 1]] for d in order])
        return self._epoch_tokens

    def take(self, n: int) -> np.ndarray:
        parts = []
        while n > 0:
            toks = self._tokens()
            piece = toks[self.pos : self.pos + n]
            parts.append(piece)
            n -= len(piece)
            self.pos += len(piece)
            if self.pos == len(toks):
                self.epoch, self.pos, self._epoch_tokens = self.epoch + 1, 0, None
        return np.concatenate(parts)

    @property
    def position(self) -> tuple[int, int]:
        return self.epoch, self.pos

    def seek(self, position: tuple[int, int]) -> None:
        self.epoch, self.pos = map(int, position)
        self._epoch_tokens = None


class BlockSampler:
    """Batch at step s: B blocks of seq_len + 1 tokens; block i is arithmetic when draw(seed, s)[i] < fraction."""

    def __init__(self, code: corpus.DocPool, arith_pool: corpus.DocPool, args: TrainArgs):
        self.code, self.arith = TokenStream(code, args.seed, "code"), TokenStream(arith_pool, args.seed, "arith")
        self.B, self.T, self.fraction, self.seed = args.batch_size, args.seq_len, args.arith_fraction, args.seed

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(blocks [B, T + 1] int64, is_arith [B] bool)."""
        is_arith = np.random.default_rng([self.seed, step]).random(self.B) < self.fraction
        blocks = [(self.arith if a else self.code).take(self.T + 1) for a in is_arith]
        return torch.from_numpy(np.stack(blocks).astype(np.int64)), torch.from_numpy(is_arith)


@torch.no_grad()
def init_weights(model: K3ForCausalLM, seed: int, std: float = 0.02) -> None:
    """Training init: N(0, std) for matrices and embeddings, output projections scaled by 1/sqrt(2 * layers)
    (GPT-2's residual scaling), unit norms, zero AttnRes queries (uniform mixing at the start), and KDA decay
    parameters spread over timescales as Mamba does."""
    gen = torch.Generator().manual_seed(seed)
    out_std = std / math.sqrt(2 * model.cfg.num_hidden_layers)
    outputs = ("o_proj.weight", "down_proj.weight", "experts.w2", "routed_expert_up_proj.weight")

    def normal_(p, s):
        p.copy_(torch.randn(p.shape, generator=gen) * s)

    for name, p in model.named_parameters():
        if name.endswith(("norm.weight", "norm_weight")):
            p.fill_(1.0)
        elif name.endswith("proj_weight"):
            p.zero_()
        elif name.endswith("A_log"):
            p.zero_()
        elif name.endswith("dt_bias"):
            # decay timescales from 1e-3 to 1e-1 per channel, stored through softplus's inverse
            dt = torch.exp(torch.rand(p.shape, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            p.copy_(dt + torch.log(-torch.expm1(-dt)))
        elif "conv1d" in name:
            bound = 1 / math.sqrt(p.shape[-1])
            p.copy_(torch.rand(p.shape, generator=gen) * 2 * bound - bound)
        elif name.endswith(outputs):
            normal_(p, out_std)
        elif p.dim() >= 2:
            normal_(p, std)
        else:
            raise ValueError(f"init_weights has no rule for parameter {name!r} of shape {tuple(p.shape)}")
    for name, b in model.named_buffers():
        b.zero_()


class RouterBalancer:
    """Auxiliary-loss-free expert balancing (DeepSeek-V3): after each step, every router's correction bias moves
    by `rate` toward its under-used experts. Counts are gathered by forward hooks, on the device."""

    def __init__(self, model: K3ForCausalLM, rate: float):
        self.rate = rate
        self.routers = [m for m in model.modules() if isinstance(m, Router)]
        self.counts = [None] * len(self.routers)
        self.hooks = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]

    def _hook(self, i: int):
        def hook(router, inputs, output):
            ids = output[1].flatten()
            c = torch.bincount(ids, minlength=router.cfg.num_experts)
            self.counts[i] = c if self.counts[i] is None else self.counts[i] + c
        return hook

    @torch.no_grad()
    def update(self) -> None:
        for router, c in zip(self.routers, self.counts):
            if c is not None and self.rate > 0:
                load = c.float()
                router.e_score_correction_bias.add_(self.rate * torch.sign(load.mean() - load))
        self.counts = [None] * len(self.routers)

    def close(self) -> None:
        for h in self.hooks:
            h.remove()


def lr_at(step: int, args: TrainArgs, total_steps: int) -> float:
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = min(1.0, (step - args.warmup_steps) / max(1, total_steps - args.warmup_steps))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name!r}: CUDA is not available on this machine")
    return device


def prepare_data(args: TrainArgs, out: Path) -> tuple[Path, corpus.DocPool, corpus.DocPool, corpus.CorpusInfo]:
    """The tokenizer and the tokenized corpus, built into the run directory unless already there."""
    code = None
    tok_dir = Path(args.tokenizer) if args.tokenizer else out / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        if args.tokenizer:
            raise FileNotFoundError(f"--tokenizer {args.tokenizer!r} has no tokenizer.json")
        code = corpus.stdlib_files("train", args.code_tests, limit=args.code_files)
        print(f"training the tokenizer on {len(code)} stdlib files -> {tok_dir}")
        train_tokenizer(corpus.tokenizer_texts(code, args.seed), tok_dir)
    data_dir = out / "data"
    if (data_dir / "corpus.json").exists():
        code_pool, arith_pool, info = corpus.load_corpus(data_dir)
        wanted = {"seed": args.seed, "arith_docs": args.arith_docs, "chat_fraction": args.chat_fraction,
                  "code_tests": args.code_tests}
        for key, value in wanted.items():
            if getattr(info, key) != value:
                raise ValueError(f"{data_dir} was built with {key} = {getattr(info, key)!r}, not {value!r}: "
                                 f"use a fresh --out")
        return tok_dir, code_pool, arith_pool, info
    code = code if code is not None else corpus.stdlib_files("train", args.code_tests, limit=args.code_files)
    print(f"tokenizing {len(code)} stdlib files and {args.arith_docs} arithmetic documents -> {data_dir}")
    tok = HFTokenizer.from_file(str(tok_dir / "tokenizer.json"))
    corpus.build_corpus(data_dir, tok, args.seed, args.arith_docs, args.chat_fraction, code, args.code_tests)
    return (tok_dir, *corpus.load_corpus(data_dir))


def build_model(args: TrainArgs) -> K3ForCausalLM:
    overrides = json.loads(args.model_overrides) if args.model_overrides else {}
    cfg = preset_config(args.preset, **overrides).replace(bos_token_id=BOS, eos_token_id=STOP_IDS, pad_token_id=PAD)
    model = K3ForCausalLM(cfg, dtype=torch.float32)
    init_weights(model, args.seed, args.init_std)
    return model


def make_optimizer(model: K3ForCausalLM, args: TrainArgs, device: torch.device) -> torch.optim.AdamW:
    # decay matrices and embeddings; norms, AttnRes queries and KDA decay parameters keep their scale
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.endswith("proj_weight")]
    ids = {id(p) for p in decay}
    rest = [p for p in model.parameters() if id(p) not in ids]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


def save_training_state(path: Path, model, optimizer, state: TrainState, args: TrainArgs) -> None:
    blob = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": dataclasses.asdict(state),
            "args": dataclasses.asdict(args), "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    tmp = path.with_suffix(".tmp")
    torch.save(blob, tmp)
    os.replace(tmp, path)


def load_training_state(path: Path, model, optimizer) -> TrainState:
    if not path.exists():
        raise FileNotFoundError(f"--resume: no checkpoint at {path}")
    blob = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(blob["model"])
    optimizer.load_state_dict(blob["optimizer"])
    torch.set_rng_state(blob["torch_rng"])
    random.setstate(blob["python_rng"])
    if blob["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(blob["cuda_rng"])
    s = blob["state"]
    return TrainState(**{**s, "code_pos": tuple(s["code_pos"]), "arith_pos": tuple(s["arith_pos"])})


def train_step(model, optimizer, balancer, blocks, is_arith, lr, args, device, autocast) -> tuple[float, float, float]:
    """One optimizer step; returns (loss, code loss, arithmetic loss) (nan for a source absent from the batch)."""
    blocks, is_arith = blocks.to(device, non_blocking=True), is_arith.to(device)
    x, y = blocks[:, :-1], blocks[:, 1:]
    for group in optimizer.param_groups:
        group["lr"] = lr
    # NOTE: the plain-torch ops, whatever the device: serving kernels need not define a backward
    with autocast, reference_ops():
        logits = model.logits_train(x)
    nll = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    per_block = nll.mean(1)  # [B]
    loss = per_block.mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    balancer.update()
    per_block = per_block.detach()
    arith = per_block[is_arith].mean() if bool(is_arith.any()) else torch.tensor(float("nan"))
    code = per_block[~is_arith].mean() if bool((~is_arith).any()) else torch.tensor(float("nan"))
    return loss.item(), code.item(), arith.item()


def run_train(ns: argparse.Namespace) -> Path:
    """`kestrel train`; returns the final model directory (the data directory with --prepare-only)."""
    args = TrainArgs(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(TrainArgs) if hasattr(ns, f.name)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(args.device)
    t_prep = time.perf_counter()
    tok_dir, code_pool, arith_pool, info = prepare_data(args, out)
    prep_seconds = time.perf_counter() - t_prep
    if args.prepare_only:
        print(f"prepared in {prep_seconds:.0f} s: {info.code_tokens:,} code tokens from {info.code_files} files, "
              f"{info.arith_tokens:,} arithmetic tokens from {info.arith_docs:,} documents")
        return out / "data"

    model = build_model(args)
    vocab = HFTokenizer.from_file(str(tok_dir / "tokenizer.json")).get_vocab_size()
    if vocab > model.cfg.vocab_size:
        raise ValueError(f"tokenizer at {tok_dir} has {vocab} tokens, more than the model's vocab_size "
                         f"{model.cfg.vocab_size}")
    model.to(device).train()
    optimizer = make_optimizer(model, args, device)
    state = TrainState(total_steps=args.max_steps)
    if args.resume:
        state = load_training_state(out / "ckpt.pt", model, optimizer)
    sampler = BlockSampler(code_pool, arith_pool, args)
    sampler.code.seek(state.code_pos)
    sampler.arith.seek(state.arith_pos)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    tokens0, t0 = state.tokens, time.perf_counter()
    smooth = train_loop(model, optimizer, sampler, state, args, out, device)
    summary = TrainingSummary(
        steps=state.step, schedule_steps=state.total_steps, tokens=state.tokens, train_seconds=round(state.elapsed, 1),
        prep_seconds=round(prep_seconds, 1),
        tokens_per_second=round((state.tokens - tokens0) / max(1e-9, time.perf_counter() - t0)),
        final_loss=smooth.get("loss"), final_code_loss=smooth.get("code"),
        final_arith_loss=smooth.get("arith"), device=_device_name(device),
        corpus=dataclasses.asdict(info), args=dataclasses.asdict(args))
    return export_model(model, Path(args.export) if args.export else out / "model", tok_dir, summary)


def train_loop(model, optimizer, sampler: BlockSampler, state: TrainState, args: TrainArgs, out: Path,
               device: torch.device) -> dict[str, float]:
    """Steps until the schedule or the wall-clock budget ends, checkpointing to out/ckpt.pt and logging every step
    to out/train_log.jsonl; `state` advances in place. Returns the smoothed losses."""
    balancer = RouterBalancer(model, args.router_bias_rate)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16,
                              enabled=device.type == "cuda" and args.precision == "bf16")
    budget = None if args.max_minutes is None else args.max_minutes * 60
    step0, tokens0, elapsed0, t0 = state.step, state.tokens, state.elapsed, time.perf_counter()
    t_calibrate = None
    smooth: dict[str, float] = {}
    bar = tqdm(total=state.total_steps, initial=state.step, desc="training", unit="step", disable=not args.progress)
    log = open(out / "train_log.jsonl", "a")
    try:
        while state.step < state.total_steps:
            if budget is not None and elapsed0 + time.perf_counter() - t0 >= budget:
                break
            blocks, is_arith = sampler.batch(state.step)
            lr = lr_at(state.step, args, state.total_steps)
            losses = train_step(model, optimizer, balancer, blocks, is_arith, lr, args, device, autocast)
            if not math.isfinite(losses[0]):
                raise FloatingPointError(f"loss is {losses[0]} at step {state.step}: lower --lr or raise "
                                         f"--warmup-steps")
            state.step += 1
            state.tokens += blocks.shape[0] * (blocks.shape[1] - 1)
            state.code_pos, state.arith_pos = sampler.code.position, sampler.arith.position
            now = time.perf_counter()
            state.elapsed = elapsed0 + now - t0
            done = state.step - step0
            if budget is not None and done == CALIBRATE_FROM:
                t_calibrate = now
            elif t_calibrate is not None and (done == CALIBRATE_FROM + 20 or done % RECALIBRATE_EVERY == 0):
                per_step = (now - t_calibrate) / (done - CALIBRATE_FROM)
                fits = int((budget - state.elapsed) / per_step)
                state.total_steps = bar.total = min(args.max_steps, state.step + max(0, fits))
            for key, v in zip(("loss", "code", "arith"), losses):
                if math.isfinite(v):
                    smooth[key] = v if key not in smooth else 0.95 * smooth[key] + 0.05 * v
            rate = (state.tokens - tokens0) / max(1e-9, now - t0)
            bar.set_postfix({**{k: f"{v:.3f}" for k, v in smooth.items()}, "lr": f"{lr:.1e}", "tok/s": f"{rate:,.0f}"},
                            refresh=False)
            bar.update(1)
            code, arith = (v if math.isfinite(v) else None for v in losses[1:])
            log.write(json.dumps({"step": state.step, "loss": losses[0], "code": code, "arith": arith, "lr": lr,
                                  "tokens": state.tokens, "elapsed": round(state.elapsed, 3)}) + "\n")
            if state.step % args.save_every == 0:
                save_training_state(out / "ckpt.pt", model, optimizer, state, args)
    finally:
        bar.close()
        log.close()
        balancer.close()
    save_training_state(out / "ckpt.pt", model, optimizer, state, args)
    return smooth


@dataclass(frozen=True)
class TrainingSummary:
    steps: int
    schedule_steps: int
    tokens: int
    train_seconds: float
    prep_seconds: float
    tokens_per_second: float  # in the last session
    # smoothed over the last ~20 steps; None when no step saw that kind of block
    final_loss: float | None
    final_code_loss: float | None
    final_arith_loss: float | None
    device: str
    corpus: dict  # includes the Python version whose stdlib the code came from
    args: dict


def export_model(model: K3ForCausalLM, path: Path, tok_dir: Path, summary: TrainingSummary) -> Path:
    """The final checkpoint: bf16 weights in Hugging Face layout, tokenizer files, training_summary.json."""
    save_checkpoint(model, path, tokenizer_dir=tok_dir, dtype=torch.bfloat16)
    (path / "training_summary.json").write_text(json.dumps(dataclasses.asdict(summary), indent=2) + "\n")
    named = (("loss", summary.final_loss), ("code", summary.final_code_loss), ("arithmetic", summary.final_arith_loss))
    losses = ", ".join(f"{name} {v:.3f}" for name, v in named if v is not None)
    print(f"{summary.steps} steps, {summary.tokens:,} tokens in {summary.train_seconds:.0f} s on {summary.device}; "
          f"{losses} -> {path}")
    return path


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
