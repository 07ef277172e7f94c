"""Distillation data for the DSpark drafter: prompts, target-generated continuations and their draft-step rows.

Prompts come from the target's training distribution (stdlib code snippets, arithmetic questions in the plain and
chat formats; held-out code files and held-out problems for measurement) and are continued greedily by the target
through the batched `kestrel.Engine`. One stateless forward of the target over each whole sequence then gives the
features (the residual stream at the drafter's feature layers) and the target's greedy token at every position;
where that reference disagrees with the engine (a numerical near-tie) the sequence is cut there, so every label is
exactly what the reference would emit. A row is one draft step: features at position t, last committed token
x[t+1], labels x[t+2 .. t+1+gamma] (-1 past the end), for every t from the last prompt position on. Generated
chunks are saved in the work directory, so preparation resumes.
"""

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from kestrel.models.forward_batch import ForwardBatch
from kestrel.train import arith, corpus
from kestrel.train.tokenizer_train import BOS, render_chat

if TYPE_CHECKING:
    from kestrel.spec.distill import DistillArgs


# ---- prompts

@dataclass(frozen=True)
class Prompt:
    kind: str  # "code" or "arith"
    ids: list[int]


def code_prompts(tokenizer, split: str, n: int, seed: int, min_tokens: int = 16, max_tokens: int = 96) -> list[Prompt]:
    """n snippets of `split` stdlib files: <|bos|> + min..max tokens starting at a random line."""
    files = corpus.stdlib_files(split)
    if not files:
        raise ValueError(f"no {split} stdlib files to cut code prompts from")
    rng = random.Random(f"dspark-code-{split}-{seed}")
    out = []
    while len(out) < n:
        _, text = rng.choice(files)
        lines = text.splitlines(keepends=True)
        start = rng.randrange(len(lines))
        ids = tokenizer.encode("".join(lines[start : start + 60]), add_special_tokens=False)
        if len(ids) >= min_tokens:
            out.append(Prompt("code", [BOS] + ids[: rng.randint(min_tokens, max_tokens)]))
    return out


def arith_prompts(tokenizer, split: str, n: int, seed: int, chat_fraction: float) -> list[Prompt]:
    """n questions of `split` (distinct for held-out), plain (`Question: ...`) or as a chat user turn."""
    rng = random.Random(f"dspark-arith-{split}-{seed}")
    problems = arith.heldout_problems(n, seed) if split == "heldout" else [arith.sample(rng, split) for _ in range(n)]
    out = []
    for p in problems:
        if rng.random() < chat_fraction:
            text = render_chat(p.chat_messages(rng)[:-1], add_generation_prompt=True)
        else:
            text = p.prompt
        out.append(Prompt("arith", [BOS] + tokenizer.encode(text, add_special_tokens=False)))
    return out


def build_prompts(tokenizer, args: "DistillArgs", split: str) -> list[Prompt]:
    """The split's prompts, code and arithmetic interleaved by a seeded shuffle (every chunk holds both)."""
    if split == "train":
        prompts = code_prompts(tokenizer, "train", args.code_prompts, args.seed)
        prompts += arith_prompts(tokenizer, "train", args.arith_prompts, args.seed, args.chat_fraction)
    else:
        prompts = code_prompts(tokenizer, "heldout", args.heldout_code, args.seed)
        prompts += arith_prompts(tokenizer, "heldout", args.heldout_arith, args.seed, args.chat_fraction)
    random.Random(f"dspark-order-{split}-{args.seed}").shuffle(prompts)
    return prompts


# ---- labelled data

@dataclass
class DistillData:
    """Draft-step rows of target-generated sequences; the rows of sequence j are offsets[j]:offsets[j + 1], one per
    position t = prompt_len - 1, ..., len - 2 in order."""

    features: torch.Tensor  # [P, F] fp32: the target's features at t
    last_token: torch.Tensor  # [P] int64: x[t + 1], committed, not yet seen by the target
    targets: torch.Tensor  # [P, gamma] int64: x[t + 2 ..], -1 past the end of the sequence
    offsets: list[int]
    sequences: list[list[int]]
    prompt_lens: list[int]
    kinds: list[str]
    ended: list[bool]  # the target stopped the sequence itself (a stop token), so it is complete
    cut: int = 0  # sequences cut where the reference disagreed with the engine

    @property
    def num_rows(self) -> int:
        return self.features.shape[0]

    @classmethod
    def concat(cls, parts: list["DistillData"]) -> "DistillData":
        offsets, base = [0], 0
        for p in parts:
            offsets += [base + o for o in p.offsets[1:]]
            base += p.num_rows
        return cls(torch.cat([p.features for p in parts]), torch.cat([p.last_token for p in parts]),
                   torch.cat([p.targets for p in parts]), offsets, [s for p in parts for s in p.sequences],
                   [n for p in parts for n in p.prompt_lens], [k for p in parts for k in p.kinds],
                   [e for p in parts for e in p.ended], sum(p.cut for p in parts))

    def subset(self, kind: str) -> "DistillData":
        """The sequences of one kind (rows included)."""
        keep = [j for j, k in enumerate(self.kinds) if k == kind]
        rows = torch.cat([torch.arange(self.offsets[j], self.offsets[j + 1]) for j in keep]) if keep else \
            torch.zeros(0, dtype=torch.long)
        offsets = [0]
        for j in keep:
            offsets.append(offsets[-1] + self.offsets[j + 1] - self.offsets[j])
        pick = lambda xs: [xs[j] for j in keep]  # noqa: E731
        return DistillData(self.features[rows], self.last_token[rows], self.targets[rows], offsets,
                           pick(self.sequences), pick(self.prompt_lens), pick(self.kinds), pick(self.ended))


def target_forward(model, sequences: list[list[int]], layers: tuple[int, ...], logit_rows: list[list[int]] | None = None):
    """The stateless reference forward over packed sequences: (features [T, F] in layer order, argmax tokens at
    the requested rows of each sequence (all when None), as one flat tensor)."""
    device = model.lm_head.weight.device
    fb = ForwardBatch.full_sequences(sequences, device=device)
    fb.capture_layers = layers
    if logit_rows is not None:
        starts = fb.cu_seqlens
        fb.logits_indices = torch.tensor([starts[j] + r for j, rows in enumerate(logit_rows) for r in rows],
                                         dtype=torch.long, device=device)
    out = model(fb)
    features = torch.cat([out.captured[l] for l in layers], -1)
    return features, out.logits.argmax(-1)


@torch.no_grad()
def label_sequences(model, sequences: list[list[int]], prompt_lens: list[int], kinds: list[str],
                    ended: list[bool], layers: tuple[int, ...], gamma: int,
                    max_tokens_per_forward: int = 4096) -> DistillData:
    """Rows for target-generated sequences (prompt + greedy continuation). A sequence whose continuation differs
    from the reference's greedy choice at some position is cut there (and no longer counts as ended)."""
    parts, cut = [], 0
    seqs, lens, ends = [list(s) for s in sequences], list(prompt_lens), list(ended)
    batches, cur, size = [], [], 0
    for j, s in enumerate(seqs):
        if cur and size + len(s) > max_tokens_per_forward:
            batches.append(cur)
            cur, size = [], 0
        cur.append(j)
        size += len(s)
    if cur:
        batches.append(cur)
    for batch in batches:
        rows = [list(range(lens[j] - 1, len(seqs[j]) - 1)) for j in batch]
        features, greedy = target_forward(model, [seqs[j] for j in batch], layers, rows)
        starts = sequence_starts([seqs[j] for j in batch])
        g = 0
        for k, j in enumerate(batch):
            s, n = seqs[j], len(rows[k])
            ref = greedy[g : g + n].tolist()
            g += n
            bad = next((i for i, (a, b) in enumerate(zip(ref, s[lens[j]:])) if a != b), None)
            if bad is not None:
                cut += 1
                seqs[j], ends[j], n = s[: lens[j] + bad], False, bad
            parts.append(_rows(features[starts[k] + lens[j] - 1 : starts[k] + lens[j] - 1 + n], seqs[j], lens[j],
                               gamma))
    feats = torch.cat([p[0] for p in parts]) if parts else torch.zeros(0, len(layers) * model.cfg.hidden_size)
    offsets = [0]
    for p in parts:
        offsets.append(offsets[-1] + p[0].shape[0])
    return DistillData(feats.float().cpu(), torch.cat([p[1] for p in parts]) if parts else
                       torch.zeros(0, dtype=torch.long), torch.cat([p[2] for p in parts]) if parts else
                       torch.zeros(0, gamma, dtype=torch.long), offsets, seqs, lens, list(kinds), ends, cut)


def sequence_starts(sequences: list[list[int]]) -> list[int]:
    """Where each sequence starts in a packed forward (cumulative lengths)."""
    out = [0]
    for s in sequences:
        out.append(out[-1] + len(s))
    return out


def _rows(features: torch.Tensor, seq: list[int], prompt_len: int, gamma: int):
    """(features, last tokens, targets) of the rows t = prompt_len - 1 .. prompt_len - 2 + len(features)."""
    n = features.shape[0]
    s = torch.tensor(seq + [-1] * (gamma + 1), dtype=torch.long)
    t = torch.arange(prompt_len - 1, prompt_len - 1 + n)
    targets = s[(t + 2)[:, None] + torch.arange(gamma)]
    return features, s[t + 1], targets


def _chunk_path(work: Path, split: str, k: int) -> Path:
    return work / split / f"chunk_{k:04d}.pt"


def prepare_split(args: "DistillArgs", split: str, engine, model, tokenizer, progress: bool) -> DistillData:
    """Generate (engine) and label (reference forward) the split chunk by chunk; finished chunks are reused."""
    work = Path(args.work_dir)
    (work / split).mkdir(parents=True, exist_ok=True)
    meta = {k: getattr(args, k) for k in ("target", "seed", "code_prompts", "arith_prompts", "heldout_code",
                                          "heldout_arith", "chat_fraction", "code_new_tokens", "arith_new_tokens",
                                          "gen_batch", "feature_layers", "gamma")}
    meta_path = work / split / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()) != meta:
        raise ValueError(f"{work / split} was prepared with other settings ({meta_path}): use a fresh --work-dir")
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    prompts = build_prompts(tokenizer, args, split)
    chunks = [prompts[i : i + args.gen_batch] for i in range(0, len(prompts), args.gen_batch)]
    stop_ids = set(model.cfg.eos_token_ids)
    parts = []
    for k, chunk in enumerate(tqdm(chunks, desc=f"{split} data", unit="chunk", disable=not progress)):
        path = _chunk_path(work, split, k)
        if not path.exists():
            limits = [args.code_new_tokens if p.kind == "code" else args.arith_new_tokens for p in chunk]
            outs = engine.generate(input_ids=[p.ids for p in chunk],
                                   sampling_params=[{"max_new_tokens": n, "temperature": 0} for n in limits])
            outs = outs if isinstance(outs, list) else [outs]
            seqs = [p.ids + o["output_ids"] for p, o in zip(chunk, outs)]
            ended = [bool(o["output_ids"]) and o["output_ids"][-1] in stop_ids for o in outs]
            data = label_sequences(model, seqs, [len(p.ids) for p in chunk], [p.kind for p in chunk], ended,
                                   args.layers(model.cfg.num_hidden_layers), args.gamma)
            tmp = path.with_suffix(".tmp")
            torch.save({f.name: getattr(data, f.name) for f in dataclasses.fields(data)}, tmp)
            tmp.rename(path)
        parts.append(DistillData(**torch.load(path, weights_only=False)))
    return DistillData.concat(parts)
