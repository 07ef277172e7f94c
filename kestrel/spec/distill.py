"""`kestrel distill`: distil the DSpark drafter from its target (the bundled k3-small by default).

Data (`distill_data`): target-generated continuations of code and arithmetic prompts, one row per draft step.

Training. Cross-entropy on the gamma positions with the sequential correction teacher-forced (the true previous
tokens), weighted toward early positions (acceptance needs every earlier token right); binary cross-entropy for the
confidence head on positions whose earlier tokens the drafter got right. AdamW, cosine schedule, deterministic by
seed (rows are visited in per-epoch seeded permutations; `--max-minutes` only stops a session early, `--resume`
continues it).

Measurement. Greedy verification at gamma = 7 on the held-out sequences, mean tokens committed per verify step
(accepted drafts before the first mismatch, +1 bonus). Because the committed text is always a prefix of the target's
greedy continuation and the target is causal, the features and verify outcomes of every step are read from the one
reference forward of that continuation; `measure_acceptance_online` runs the explicit loop (a reference forward per
verify step) and the two agree exactly (tested).

Everything intermediate lives in --work-dir (generated chunks, resumable); the checkpoint goes to --out with a
distill_summary.json beside it.
"""

import argparse
import dataclasses
import functools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from kestrel.models.registry import ASSETS, BUNDLED, resolve
from kestrel.spec.distill_data import DistillData, prepare_split, sequence_starts, target_forward
from kestrel.spec.drafter import DSparkConfig, DSparkDrafter, default_feature_layers
from kestrel.train.trainer import add_dataclass_args, flag_field, resolve_device

DEFAULT_OUT = ASSETS / "k3-small-dspark"
_SIZES = DSparkConfig()


@dataclass(frozen=True)
class DistillArgs:
    """Every `kestrel distill` flag (argparse reads the fields and help strings)."""

    target: str = flag_field("target checkpoint directory or preset", str(BUNDLED))
    out: str = flag_field("where the drafter checkpoint goes", str(DEFAULT_OUT))
    work_dir: str = flag_field("generated data and the resumable training state", "runs/dspark")
    device: str = flag_field("cpu, cuda, cuda:N, or auto", "auto")
    seed: int = flag_field("seeds prompts, initialisation and data order", 0)
    code_prompts: int = flag_field("training prompts cut from stdlib files", 2400)
    arith_prompts: int = flag_field("training arithmetic questions", 1500)
    heldout_code: int = flag_field("held-out code prompts (from held-out stdlib files)", 100)
    heldout_arith: int = flag_field("held-out arithmetic questions", 100)
    chat_fraction: float = flag_field("fraction of arithmetic questions in the chat format", 0.3)
    code_new_tokens: int = flag_field("greedy continuation length for code prompts", 96)
    arith_new_tokens: int = flag_field("generation limit for arithmetic (they stop at their answer)", 256)
    gen_batch: int = flag_field("prompts per engine call (one resumable chunk)", 200)
    feature_layers: str = flag_field("target layers whose outputs feed the drafter (0-based, comma-separated), or "
                                "auto: four spread over the depth (k3-small: 1,3,5,7)", "auto")
    hidden_size: int = flag_field("drafter width", _SIZES.hidden_size)
    num_layers: int = flag_field("drafter transformer layers over the slots", _SIZES.num_layers)
    num_heads: int = flag_field("drafter attention heads", _SIZES.num_heads)
    intermediate_size: int = flag_field("drafter SwiGLU width", _SIZES.intermediate_size)
    correction_size: int = flag_field("sequential-correction MLP width", _SIZES.correction_size)
    gamma: int = flag_field("draft positions trained (the drafter's gamma_max)", _SIZES.gamma_max)
    steps: int = flag_field("optimizer steps (the schedule's length)", 3000)
    batch_size: int = flag_field("rows (draft steps) per optimizer step", 256)
    lr: float = flag_field("peak learning rate", 2e-3)
    min_lr_ratio: float = flag_field("final learning rate as a fraction of the peak", 0.05)
    warmup_steps: int = flag_field("linear warm-up steps", 100)
    weight_decay: float = flag_field("AdamW weight decay (matrices)", 0.05)
    grad_clip: float = flag_field("gradient norm clip", 1.0)
    position_decay: float = flag_field("cross-entropy weight of draft position i is decay^(i-1)", 0.8)
    confidence_weight: float = flag_field("weight of the confidence head's BCE", 0.3)
    calib_fraction: float = flag_field("fraction of training sequences kept from the CE to train the confidence head", 0.1)
    eval_every: int = flag_field("steps between held-out teacher-forced checks in the training log", 250)
    eval_gamma: int = flag_field("block size of the held-out acceptance measurement", 7)
    online_check: int = flag_field("held-out prompts also measured with the explicit verify loop (a cross-check)", 4)
    max_minutes: float | None = flag_field("stop this session after so many minutes (resume with --resume)", None)
    resume: bool = flag_field("continue training from WORK_DIR/train_state.pt", False)
    prepare_only: bool = flag_field("generate and label the data, then stop", False)
    eval_only: bool = flag_field("measure the drafter at --out on the held-out data, then stop", False)
    progress: bool = flag_field("show progress bars", True)

    def __post_init__(self):
        checks = {"steps": self.steps >= 1, "batch_size": self.batch_size >= 1, "lr": self.lr > 0,
                  "gamma": self.gamma >= 1, "eval_gamma": 1 <= self.eval_gamma <= self.gamma,
                  "gen_batch": self.gen_batch >= 1, "chat_fraction": 0 <= self.chat_fraction <= 1,
                  "position_decay": 0 < self.position_decay <= 1, "eval_every": self.eval_every >= 1,
                  "calib_fraction": 0 <= self.calib_fraction < 1,
                  "max_minutes": self.max_minutes is None or self.max_minutes > 0}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"distill flag --{name.replace('_', '-')} = {getattr(self, name)!r} is out of range")

    def layers(self, num_target_layers: int) -> tuple[int, ...]:
        if self.feature_layers == "auto":
            return default_feature_layers(num_target_layers)
        layers = tuple(int(x) for x in self.feature_layers.split(",") if x.strip())
        bad = [l for l in layers if not 0 <= l < num_target_layers]
        if not layers or bad:
            raise ValueError(f"--feature-layers {self.feature_layers!r}: the target has layers 0..{num_target_layers - 1}")
        return layers


def add_distill_args(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, DistillArgs)


# ---- training

def lr_at(step: int, args: DistillArgs) -> float:
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = min(1.0, (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_rows(step: int, rows: torch.Tensor, batch_size: int, seed: int) -> torch.Tensor:
    """The rows of step `step`: consecutive slices of per-epoch seeded permutations of `rows` (so they depend only
    on the seed and the step, and a resumed run sees the same batches)."""
    per_epoch = max(1, len(rows) // batch_size)
    epoch, i = divmod(step, per_epoch)
    return rows[_permutation(len(rows), seed, epoch)[i * batch_size : (i + 1) * batch_size]]


@functools.lru_cache(maxsize=2)
def _permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


def split_rows(data: DistillData, calib_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fit rows, calibration rows): a seeded `calib_fraction` of the sequences is kept from the cross-entropy and
    trains only the confidence head, which so learns how often drafts are right on text the drafter has not fit."""
    n = len(data.sequences)
    calib = torch.zeros(n, dtype=torch.bool)
    calib[torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: round(calib_fraction * n)]] = True
    counts = torch.tensor([data.offsets[j + 1] - data.offsets[j] for j in range(n)])
    per_row = torch.repeat_interleave(calib, counts)
    return per_row.logical_not().nonzero()[:, 0], per_row.nonzero()[:, 0]


def draft_loss(logits: torch.Tensor, targets: torch.Tensor, position_decay: float) -> tuple[torch.Tensor, dict]:
    """Cross-entropy over the draft positions, position i weighted by decay^(i-1) (acceptance needs every earlier
    token right); stats: first-token accuracy and the teacher-forced drafts accepted per row."""
    valid = targets >= 0
    w = position_decay ** torch.arange(targets.shape[1], dtype=torch.float32, device=targets.device)
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.clamp_min(0).flatten(), reduction="none")
    ce = ce.view(targets.shape)
    loss = (ce * w * valid).sum() / (w * valid).sum().clamp_min(1)
    right = (logits.argmax(-1) == targets) & valid
    stats = {"ce": loss.item(), "acc1": (right[:, 0].sum() / valid[:, 0].sum().clamp_min(1)).item(),
             "accepted": right.long().cumprod(1).sum(1).float().mean().item()}
    return loss, stats


def confidence_loss(conf: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """BCE of the confidence head: label = the draft at i is right, on positions whose earlier drafts were right
    (the head predicts P(accept i | accepted < i))."""
    right = (logits.argmax(-1) == targets) & (targets >= 0)
    reached = torch.cat([torch.ones_like(right[:, :1]), right[:, :-1].cumprod(1).bool()], 1) & (targets >= 0)
    bce = F.binary_cross_entropy_with_logits(conf, right.float(), reduction="none")
    return (bce * reached).sum() / reached.sum().clamp_min(1)


def make_optimizer(drafter: DSparkDrafter, args: DistillArgs) -> torch.optim.AdamW:
    params = [(n, p) for n, p in drafter.named_parameters() if p.requires_grad]
    matrices = {n for n, p in params if p.dim() >= 2 and n != "slots"}
    return torch.optim.AdamW([{"params": [p for n, p in params if n in matrices], "weight_decay": args.weight_decay},
                              {"params": [p for n, p in params if n not in matrices], "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95))


def train_step(drafter: DSparkDrafter, data: DistillData, fit: torch.Tensor, calib: torch.Tensor, step: int,
               args: DistillArgs, device: torch.device) -> tuple[torch.Tensor, dict]:
    """The loss of one step: CE on a batch of fit rows, BCE on a quarter batch of calibration rows (on the fit
    batch itself when there are none)."""
    def batch(rows):
        return data.features[rows].to(device), data.last_token[rows].to(device), data.targets[rows].to(device)

    features, last, targets = batch(batch_rows(step, fit, args.batch_size, args.seed))
    states = drafter.teacher_forced_states(features, last, targets)
    logits = drafter.logits(states)
    loss, stats = draft_loss(logits, targets, args.position_decay)
    if len(calib):
        features, last, targets = batch(batch_rows(step, calib, max(1, args.batch_size // 4), args.seed + 1))
        with torch.no_grad():
            states = drafter.teacher_forced_states(features, last, targets)
            logits = drafter.logits(states)
    bce = confidence_loss(drafter.confidence_logit(states, logits), logits, targets)
    stats["bce"] = bce.item()
    return loss + args.confidence_weight * bce, stats


@torch.no_grad()
def teacher_forced_stats(drafter: DSparkDrafter, data: DistillData, rows: torch.Tensor, gamma: int,
                         batch: int = 512) -> dict:
    """draft_loss's stats over `rows` (a monitor of generalisation while training)."""
    totals, n = {}, 0
    device = drafter.fc.weight.device
    for i in range(0, len(rows), batch):
        r = rows[i : i + batch]
        targets = data.targets[r, :gamma].to(device)
        logits, _ = drafter(data.features[r].to(device), data.last_token[r].to(device), targets)
        _, stats = draft_loss(logits, targets, 1.0)
        for k, v in stats.items():
            totals[k] = totals.get(k, 0.0) + v * len(r)
        n += len(r)
    return {k: round(v / max(1, n), 4) for k, v in totals.items()}


def train_drafter(drafter: DSparkDrafter, data: DistillData, args: DistillArgs, device: torch.device,
                  state_path: Path | None = None, heldout: DistillData | None = None) -> dict:
    """Train in place until args.steps (or the session's --max-minutes); returns a summary with the loss curve
    (and, every --eval-every steps, teacher-forced stats on up to 2048 held-out rows of each kind)."""
    drafter.to(device).train()
    opt = make_optimizer(drafter, args)
    fit, calib = split_rows(data, args.calib_fraction, args.seed)
    monitor = {}
    if heldout is not None:
        for kind in sorted(set(heldout.kinds)):
            rows = torch.cat([torch.arange(heldout.offsets[j], heldout.offsets[j + 1])
                              for j, k in enumerate(heldout.kinds) if k == kind])
            monitor[kind] = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(0))[:2048]]
    step, elapsed, history = 0, 0.0, []
    if args.resume and state_path is not None and state_path.exists():
        blob = torch.load(state_path, map_location="cpu", weights_only=False)
        drafter.load_state_dict(blob["model"])
        opt.load_state_dict(blob["optimizer"])
        step, elapsed, history = blob["step"], blob["elapsed"], blob["history"]
    budget = None if args.max_minutes is None else args.max_minutes * 60
    t0, smooth = time.perf_counter(), {}
    bar = tqdm(total=args.steps, initial=step, desc="distilling", unit="step", disable=not args.progress)
    while step < args.steps and (budget is None or time.perf_counter() - t0 < budget):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        loss, stats = train_step(drafter, data, fit, calib, step, args, device)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"distillation loss is {loss.item()} at step {step}: lower --lr")
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in drafter.parameters() if p.requires_grad], args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        for k, v in stats.items():
            smooth[k] = v if k not in smooth else 0.98 * smooth[k] + 0.02 * v
        if step % 50 == 0 or step == args.steps:
            record = {"step": step, **{k: round(v, 4) for k, v in smooth.items()}}
            if monitor and (step % args.eval_every == 0 or step == args.steps):
                drafter.eval()
                record["heldout"] = {k: teacher_forced_stats(drafter, heldout, r, args.gamma) for k, r in monitor.items()}
                drafter.train()
            history.append(record)
        bar.set_postfix({k: f"{v:.3f}" for k, v in smooth.items()}, refresh=False)
        bar.update(1)
    bar.close()
    elapsed += time.perf_counter() - t0
    if state_path is not None:
        torch.save({"model": drafter.state_dict(), "optimizer": opt.state_dict(), "step": step, "elapsed": elapsed,
                    "history": history}, state_path)
    drafter.eval()
    return {"steps": step, "schedule_steps": args.steps, "train_seconds": round(elapsed, 1), "history": history,
            "finished": step >= args.steps, "fit_rows": len(fit), "calibration_rows": len(calib)}


# ---- measurement

@torch.no_grad()
def measure_acceptance(drafter: DSparkDrafter, data: DistillData, gamma: int, batch: int = 256) -> dict:
    """Greedy verification at block size gamma over the labelled held-out sequences (see the module docstring):
    mean tokens committed per verify step, per-position acceptance, and the confidence head's calibration."""
    device = drafter.fc.weight.device
    # per sequence: the row of the current draft step (t = prompt_len - 1 + row), and tokens still to produce
    cursor = {j: 0 for j in range(len(data.sequences)) if data.offsets[j + 1] > data.offsets[j]}
    steps = committed = 0
    hist = [0] * (gamma + 1)
    conf_rows = []  # per reached position: predicted confidence, accepted, position
    while cursor:
        active = []
        for j, r in list(cursor.items()):
            remaining = len(data.sequences[j]) - data.prompt_lens[j] - 1 - r  # tokens after x[t + 1]
            # a complete sequence runs to its end; a truncated one only while the whole window is known
            if remaining <= 0 or (not data.ended[j] and remaining < gamma + 1):
                del cursor[j]
            else:
                active.append(j)
        for i in range(0, len(active), batch):
            js = active[i : i + batch]
            rows = torch.tensor([data.offsets[j] + cursor[j] for j in js])
            draft = drafter.propose(data.features[rows].to(device), data.last_token[rows].to(device), gamma)
            truth = data.targets[rows, :gamma].to(device)
            right = (draft.tokens == truth) & (truth >= 0)
            accepted = right.long().cumprod(1).sum(1)  # [b]
            reached = torch.cat([torch.ones_like(right[:, :1]), right[:, :-1].cumprod(1).bool()], 1) & (truth >= 0)
            conf_rows.append(torch.stack([draft.confidence[reached].float().cpu(),
                                          right[reached].float().cpu(),
                                          reached.nonzero()[:, 1].float().cpu()], 1))
            for j, a in zip(js, accepted.tolist()):
                remaining = len(data.sequences[j]) - data.prompt_lens[j] - 1 - cursor[j]
                n = min(a + 1, remaining)
                steps, committed = steps + 1, committed + n
                hist[a] += 1
                cursor[j] += n
    conf = torch.cat(conf_rows) if conf_rows else torch.zeros(0, 3)
    return {"gamma": gamma, "sequences": len(data.sequences), "verify_steps": steps, "tokens": committed,
            "mean_accepted_length": committed / max(1, steps), "accepted_histogram": hist,
            "calibration": calibration(conf, gamma)}


def calibration(conf: torch.Tensor, gamma: int, bins: int = 10) -> dict:
    """conf rows (predicted, accepted, position): per position and per confidence bin, mean predicted vs
    observed acceptance; expected calibration error and Brier score."""
    pred, hit, pos = conf[:, 0], conf[:, 1], conf[:, 2].long()
    per_position = []
    for i in range(gamma):
        m = pos == i
        if m.any():
            per_position.append({"position": i + 1, "n": int(m.sum()), "predicted": round(pred[m].mean().item(), 4),
                                 "observed": round(hit[m].mean().item(), 4)})
    per_bin, ece = [], 0.0
    edges = torch.linspace(0, 1, bins + 1)
    for b in range(bins):
        m = (pred >= edges[b]) & ((pred < edges[b + 1]) if b < bins - 1 else (pred <= 1))
        if m.any():
            p, o = pred[m].mean().item(), hit[m].mean().item()
            ece += m.sum().item() / max(1, len(pred)) * abs(p - o)
            per_bin.append({"bin": [round(edges[b].item(), 2), round(edges[b + 1].item(), 2)], "n": int(m.sum()),
                            "predicted": round(p, 4), "observed": round(o, 4)})
    brier = ((pred - hit) ** 2).mean().item() if len(pred) else float("nan")
    return {"per_position": per_position, "per_bin": per_bin, "ece": round(ece, 4), "brier": round(brier, 4)}


@torch.no_grad()
def measure_acceptance_online(model, drafter: DSparkDrafter, prompts: list[list[int]], gamma: int,
                              max_new_tokens: int | list[int], stop_ids=()) -> dict:
    """The explicit loop: prefill, then per step draft gamma tokens, verify them with one reference forward of the
    target over the committed text + drafts, commit the longest matching prefix + the target's next token. The
    same stopping rules as measure_acceptance: a stop token ends a sequence; at the length limit a step runs only
    while gamma + 1 more tokens are allowed. Returns the step count, tokens, and the generated sequences."""
    layers = drafter.cfg.feature_layers
    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    seqs = [list(p) for p in prompts]
    features, greedy = target_forward(model, seqs, layers, [[len(s) - 1] for s in seqs])
    starts = sequence_starts(seqs)
    feat = {j: features[starts[j + 1] - 1] for j in range(len(seqs))}
    for j, tok in enumerate(greedy.tolist()):
        seqs[j].append(tok)
    stop = set(stop_ids)
    steps = committed = 0
    device = drafter.fc.weight.device
    while True:
        active = [j for j in range(len(seqs)) if seqs[j][-1] not in stop
                  and limits[j] - (len(seqs[j]) - len(prompts[j])) >= gamma + 1]
        if not active:
            break
        draft = drafter.propose(torch.stack([feat[j] for j in active]).to(device),
                                torch.tensor([seqs[j][-1] for j in active], device=device), gamma).tokens.tolist()
        # verify: the target over committed + drafts; logits at the last committed token and at each draft
        verify = [seqs[j] + d for j, d in zip(active, draft)]
        rows = [list(range(len(seqs[j]) - 1, len(seqs[j]) + gamma)) for j in active]
        features, greedy = target_forward(model, verify, layers, rows)
        starts = sequence_starts(verify)
        greedy = greedy.view(len(active), gamma + 1).tolist()
        for k, (j, d) in enumerate(zip(active, draft)):
            a = next((i for i in range(gamma) if d[i] != greedy[k][i]), gamma)
            new = d[:a] + [greedy[k][a]]
            cut = next((i for i, t in enumerate(new) if t in stop), None)
            new = new if cut is None else new[: cut + 1]
            feat[j] = features[starts[k] + len(seqs[j]) - 1 + len(new) - 1]
            seqs[j] += new
            steps, committed = steps + 1, committed + len(new)
    return {"verify_steps": steps, "tokens": committed, "mean_accepted_length": committed / max(1, steps),
            "sequences": seqs}


# ---- the command

def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def run_distill(ns: argparse.Namespace) -> dict:
    """`kestrel distill`; returns the summary written beside the checkpoint."""
    from kestrel.engine.engine import Engine
    from kestrel.tokenizer import Tokenizer

    args = DistillArgs(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(DistillArgs) if hasattr(ns, f.name)})
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    work, out = Path(args.work_dir), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    target = resolve(args.target, torch.float32, device, progress=False)
    model = target.model.eval()
    if target.tokenizer_dir is None:
        raise ValueError(f"target {args.target!r} has no tokenizer: distillation prompts are text")
    tokenizer = Tokenizer(target.tokenizer_dir)
    t0 = time.perf_counter()
    # fp32 everywhere: the labels come from the fp32 reference forward, and a bf16 engine's continuations would be
    # cut at their first near-tie with it
    with Engine(model=args.target, device=args.device, dtype="float32",
                max_running_requests=max(256, args.gen_batch)) as engine:
        train = None if args.eval_only else prepare_split(args, "train", engine, model, tokenizer, args.progress)
        heldout = prepare_split(args, "heldout", engine, model, tokenizer, args.progress)
    prep_seconds = time.perf_counter() - t0
    if args.prepare_only:
        print(f"prepared {train.num_rows:,} training rows and {heldout.num_rows:,} held-out rows in "
              f"{prep_seconds:.0f} s -> {work}")
        return {}
    summary: dict = {"target": args.target, "prep_seconds_this_session": round(prep_seconds, 1)}
    if not args.eval_only:
        drafter = DSparkDrafter.from_target(model, args.layers(model.cfg.num_hidden_layers), args.seed, hidden_size=args.hidden_size,
                                            num_layers=args.num_layers, num_heads=args.num_heads,
                                            intermediate_size=args.intermediate_size,
                                            correction_size=args.correction_size, gamma_max=args.gamma)
        summary["training"] = train_drafter(drafter, train, args, device, work / "train_state.pt", heldout)
        summary["data"] = {"train_sequences": len(train.sequences), "train_rows": train.num_rows,
                           "train_cut": train.cut, "heldout_sequences": len(heldout.sequences),
                           "heldout_rows": heldout.num_rows, "heldout_cut": heldout.cut}
        drafter.save(out)
    # measure what ships: the saved (bf16) weights, loaded back
    drafter = DSparkDrafter.load(out, device, torch.float32)
    summary["drafter"] = {"config": drafter.cfg.to_dict(), "trainable_parameters": drafter.num_trainable_parameters(),
                          "stored_parameters": sum(t.numel() for n, t in drafter.state_dict().items()
                                                   if n != "lm_head.weight" or not drafter.cfg.tie_word_embeddings),
                          "checkpoint_bytes": (out / "model.safetensors").stat().st_size}
    summary["heldout"] = {kind: measure_acceptance(drafter, heldout.subset(kind), args.eval_gamma)
                          for kind in ("code", "arith")}
    if args.online_check:
        summary["online_check"] = online_check(model, drafter, heldout, args)
    summary["device"] = _device_name(device)
    summary["args"] = dataclasses.asdict(args)
    (out / "distill_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(format_summary(summary))
    return summary


def online_check(model, drafter, heldout: DistillData, args: DistillArgs) -> dict:
    """The explicit verify loop on the first few held-out prompts of each kind, against the fast measurement."""
    result = {}
    stop = tuple(model.cfg.eos_token_ids)
    for kind in ("code", "arith"):
        sub = heldout.subset(kind)
        n = min(args.online_check, len(sub.sequences))
        if n == 0:
            continue
        first = DistillData(sub.features[: sub.offsets[n]], sub.last_token[: sub.offsets[n]],
                            sub.targets[: sub.offsets[n]], sub.offsets[: n + 1], sub.sequences[:n],
                            sub.prompt_lens[:n], sub.kinds[:n], sub.ended[:n])
        fast = measure_acceptance(drafter, first, args.eval_gamma)
        limits = [len(s) - p if not e else 10**9 for s, p, e in zip(first.sequences, first.prompt_lens, first.ended)]
        online = measure_acceptance_online(model, drafter, [s[:p] for s, p in zip(first.sequences, first.prompt_lens)],
                                           args.eval_gamma, limits, stop)
        result[kind] = {"prompts": n, "online_steps": online["verify_steps"], "online_tokens": online["tokens"],
                        "fast_steps": fast["verify_steps"], "fast_tokens": fast["tokens"]}
    return result


def format_summary(summary: dict) -> str:
    lines = []
    if "drafter" in summary:
        d = summary["drafter"]
        lines.append(f"drafter: {d['trainable_parameters']:,} trainable parameters, {d['stored_parameters']:,} stored, "
                     f"{d['checkpoint_bytes'] / 1e6:.2f} MB")
    if "training" in summary:
        t = summary["training"]
        last = t["history"][-1] if t["history"] else {}
        lines.append(f"training: {t['steps']}/{t['schedule_steps']} steps in {t['train_seconds']:.0f} s; " +
                     ", ".join(f"{k} {v}" for k, v in last.items() if k != "step"))
    for kind, m in summary.get("heldout", {}).items():
        lines.append(f"held-out {kind}: {m['mean_accepted_length']:.3f} tokens per verify step at gamma = "
                     f"{m['gamma']} ({m['sequences']} prompts, {m['verify_steps']} steps); "
                     f"calibration ECE {m['calibration']['ece']:.3f}")
        lines.append("  position  predicted  observed")
        for row in m["calibration"]["per_position"]:
            lines.append(f"  {row['position']:>8}  {row['predicted']:>9.3f}  {row['observed']:>8.3f}  (n={row['n']})")
    for kind, c in summary.get("online_check", {}).items():
        lines.append(f"online check {kind}: {c['online_tokens']} tokens in {c['online_steps']} steps "
                     f"(fast path: {c['fast_tokens']} in {c['fast_steps']})")
    return "\n".join(lines)
