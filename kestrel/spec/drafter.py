"""The DSpark drafter: a block of gamma draft tokens per step from the target's hidden states (DESIGN §4).

Conditioning. After a verify step (or the prefill) the target has processed every committed token but the last one:
the bonus token it just emitted. The drafter reads the target's features at the last position it processed, t
(the residual-stream outputs of `feature_layers` there, concatenated: [B, len(feature_layers) * target_hidden]), and
that last committed token x[t+1]; it proposes x[t+2], ..., x[t+1+gamma]. The verify forward then runs over
[x[t+1], d_1, ..., d_gamma] and its logits at x[t+1] check d_1, and so on.

Drafting. One parallel block forward: a context vector (the projected features plus the token's embedding) and gamma
learned query slots go through a small causal transformer, so slot i sees the context and slots < i only (the first
k proposals do not depend on gamma). Then a cheap sequential correction: for i = 1..gamma, the slot-i output is
corrected by a small MLP that reads the embedding of draft token i-1 (token 0 = the last committed token) and the
previous corrected state, before the vocabulary projection. Embedding and lm_head are frozen copies of the
target's. A confidence head predicts, per position, the probability that greedy verification accepts token i given
that it accepted tokens < i (the verify planner's input).
"""

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

import kestrel.ops as ops
from kestrel.ops import dspark as dspark_ops
from kestrel.ops import linear as linear_ops
from kestrel.ops.dspark import reference as dspark_ref
from kestrel.ops.dspark.reference import rms, rms_rows
from kestrel.ops.linear import Prologue
from kestrel.ops.moe import Activation

SILU = Activation("silu")

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
MODEL_TYPE = "dspark"


@dataclass(frozen=True)
class DSparkConfig:
    target_hidden_size: int = 256
    # target layers (0-based ids, as in ForwardBatch.capture_layers) whose outputs are the features, in this order
    feature_layers: tuple[int, ...] = (1, 3, 5, 7)
    vocab_size: int = 4096
    hidden_size: int = 192  # draft width
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 384  # SwiGLU width of the slot transformer
    correction_size: int = 384  # hidden width of the sequential-correction MLP
    confidence_size: int = 64
    gamma_max: int = 7  # learned query slots: the largest block one forward can draft (the engine's default)
    rms_norm_eps: float = 1e-5
    # lm_head is the embedding table (the target ties them): stored once
    tie_word_embeddings: bool = True

    def __post_init__(self):
        object.__setattr__(self, "feature_layers", tuple(int(l) for l in self.feature_layers))
        checks = {"feature_layers": len(self.feature_layers) >= 1, "gamma_max": self.gamma_max >= 1,
                  "num_heads": self.num_heads >= 1 and self.hidden_size % self.num_heads == 0,
                  "num_layers": self.num_layers >= 0}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"DSparkConfig.{name} = {getattr(self, name)!r} is invalid")

    @property
    def feature_size(self) -> int:
        return len(self.feature_layers) * self.target_hidden_size

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["feature_layers"] = list(self.feature_layers)
        return {"model_type": MODEL_TYPE, "architectures": ["DSparkDrafter"], **d}

    @classmethod
    def from_dict(cls, d: dict) -> "DSparkConfig":
        if d.get("model_type", MODEL_TYPE) != MODEL_TYPE:
            raise ValueError(f"model_type {d.get('model_type')!r} is not a DSpark drafter ({MODEL_TYPE!r})")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class DraftOutput:
    tokens: torch.Tensor  # [B, gamma] int64
    # [B, gamma, V] fp32: the distribution each token was taken from (temperature applied; greedy: the plain softmax)
    probs: torch.Tensor | None
    # [B, gamma] fp32 in (0, 1): P(target accepts token i | it accepted tokens < i); [B, k] for the first k positions
    confidence: torch.Tensor | None


class SlotBlock(nn.Module):
    """Pre-norm transformer block (causal self-attention + SwiGLU) over the [context, slots] sequence."""

    def __init__(self, cfg: DSparkConfig, dtype=None):
        super().__init__()
        D, I = cfg.hidden_size, cfg.intermediate_size
        self.heads, self.eps = cfg.num_heads, cfg.rms_norm_eps
        self.attn_norm = nn.Parameter(torch.ones(D, dtype=dtype))
        self.qkv = nn.Linear(D, 3 * D, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(D, D, bias=False, dtype=dtype)
        self.mlp_norm = nn.Parameter(torch.ones(D, dtype=dtype))
        self.gate_up = nn.Linear(D, 2 * I, bias=False, dtype=dtype)
        self.down = nn.Linear(I, D, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        N, S, D = x.shape
        if x.is_cuda and not torch.is_grad_enabled():
            return self._draft_forward(x)
        q, k, v = self.qkv(rms(x, self.eps, self.attn_norm)).view(N, S, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [N, H, S, hd]
        x = x + self.o_proj(o.transpose(1, 2).reshape(N, S, D))
        gate, up = self.gate_up(rms(x, self.eps, self.mlp_norm)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)

    def _draft_forward(self, x: torch.Tensor) -> torch.Tensor:
        """forward without autograd on a GPU, through kestrel's linear ops: a small block's rows take the GEMV with
        its norms and activation as prologues and its residual adds as epilogues (four launches for a block's
        projections, under PDL). On the CPU it computes forward's values bit for bit (F.linear, then the residual
        added), ~15% slower than the module calls, so forward keeps those there."""
        N, S, D = x.shape
        eps = self.eps
        x = x.reshape(N * S, D)
        h = x
        qkv = linear_ops.linear_with(Prologue("rms", h, lambda: rms(h, eps, self.attn_norm), weight=self.attn_norm,
                                              eps=eps), self.qkv.weight)
        x = linear_ops.linear(dspark_ops.block_attention(qkv, self.heads, S), self.o_proj.weight, add=x)
        h = x
        gate, up = linear_ops.linear_with(Prologue("rms", h, lambda: rms(h, eps, self.mlp_norm),
                                                   weight=self.mlp_norm, eps=eps), self.gate_up.weight).chunk(2, -1)
        x = linear_ops.linear_with(Prologue("act", gate, lambda: F.silu(gate) * up, other=up, act=SILU),
                                   self.down.weight, add=x)
        return x.view(N, S, D)


# off: CPU drafts through the module formulas position by position (the baseline of `_folded_drafts`)
FOLD_CPU_DRAFTS = True
# off: GPU greedy drafts run the output norm and projection before the vocabulary kernel (four kernels a position)
FOLD_GPU_HEAD = True


class FoldedCorrection:
    """The correction and head products of CPU greedy drafting, regrouped (computed in float64, stored in the
    drafter's dtype, K-major):
    - corr_up's input is [rms(slot), rms(state), rms(embedding)]: its weight split by column into the slot part
      `slot_up` [D, C], the state part `state_up` [D, C], and the token part applied to every token's normalised
      embedding once, `token_up` [V, C] (a row lookup a position instead of a norm and a product);
    - `down` [C, D]: corr_down's weight;
    - `head` [D, V]: the output norm's weight, out_proj and lm_head as one product (logits = rms(state) @ head).
    `source` is the weights' identity (storage and version counter) it was made from."""

    def __init__(self, d: "DSparkDrafter", source: tuple):
        D = d.cfg.hidden_size
        dt, f64 = d.fc.weight.dtype, torch.float64
        up = d.corr_up.weight.detach().to(f64)  # [C, 2D + T]
        emb = rms(d.embed_tokens.weight.detach().to(f64), d.cfg.rms_norm_eps)
        self.slot_up = up[:, :D].t().contiguous().to(dt)
        self.state_up = up[:, D : 2 * D].t().contiguous().to(dt)
        self.token_up = (emb @ up[:, 2 * D :].t()).to(dt)
        self.down = d.corr_down.weight.detach().t().contiguous()
        self.head = folded_head(d).t().contiguous()
        self.source = source

    @staticmethod
    def key(d: "DSparkDrafter") -> tuple:
        ws = [d.corr_up.weight, d.corr_down.weight, d.embed_tokens.weight, d.lm_head.weight, d.out_norm]
        if d.out_proj is not None:
            ws.append(d.out_proj.weight)
        return tuple((w.data_ptr(), w._version, w.dtype) for w in ws)


def folded_head(d: "DSparkDrafter") -> torch.Tensor:
    """[V, D] in the drafter's dtype: the output norm's weight, out_proj and lm_head as one matrix (products in
    float64), so that logits = rms(state) @ head^T, the norm without a weight."""
    f64 = torch.float64
    head = d.lm_head.weight.detach().to(f64)  # [V, T]
    if d.out_proj is not None:
        head = head @ d.out_proj.weight.detach().to(f64)  # [V, D]
    return (head * d.out_norm.detach().to(f64)).to(d.fc.weight.dtype)


class FoldedHead:
    """folded_head for GPU drafting (row-major [V, D], the vocabulary kernel's layout), made again whenever a weight
    it comes from moved (`source`: FoldedCorrection.key)."""

    def __init__(self, d: "DSparkDrafter", source: tuple):
        self.head, self.source = folded_head(d), source


def default_feature_layers(num_target_layers: int, count: int = 4) -> tuple[int, ...]:
    """`count` layers spread evenly over the target's depth, the last one included (8 layers: 1, 3, 5, 7)."""
    count = min(count, num_target_layers)
    return tuple(round((i + 1) * num_target_layers / count) - 1 for i in range(count))


class DSparkDrafter(nn.Module):
    def __init__(self, cfg: DSparkConfig, dtype=None):
        super().__init__()
        self.cfg = cfg
        D, T, V, L = cfg.hidden_size, cfg.target_hidden_size, cfg.vocab_size, len(cfg.feature_layers)
        # frozen copies of the target's
        self.embed_tokens = nn.Embedding(V, T, dtype=dtype)
        self.lm_head = nn.Linear(T, V, bias=False, dtype=dtype)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.feature_norm = nn.Parameter(torch.ones(L, T, dtype=dtype))  # one RMSNorm per feature layer
        self.token_norm = nn.Parameter(torch.ones(T, dtype=dtype))
        self.fc = nn.Linear((L + 1) * T, D, bias=False, dtype=dtype)
        self.slots = nn.Parameter(torch.zeros(cfg.gamma_max, D, dtype=dtype))
        self.layers = nn.ModuleList(SlotBlock(cfg, dtype) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(D, dtype=dtype))
        # correction: [slot output, previous corrected state, embedding of the previous token] -> residual update
        self.corr_up = nn.Linear(2 * D + T, cfg.correction_size, bias=False, dtype=dtype)
        self.corr_down = nn.Linear(cfg.correction_size, D, bias=False, dtype=dtype)
        self.out_norm = nn.Parameter(torch.ones(D, dtype=dtype))
        self.out_proj = nn.Linear(D, T, bias=False, dtype=dtype) if D != T else None
        # confidence: the corrected state plus the draft distribution's two largest log-probabilities
        self.conf_up = nn.Linear(D + 2, cfg.confidence_size, dtype=dtype)
        self.conf_down = nn.Linear(cfg.confidence_size, 1, dtype=dtype)
        self.reset_parameters()

    # ---- construction
    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """Random init of the trainable part (N(0, 1/fan_in) scaled; residual outputs and the correction start at
        zero, so an untrained correction is the identity). The frozen embedding / lm_head are left alone."""
        gen = torch.Generator().manual_seed(seed)
        frozen = {id(self.embed_tokens.weight), id(self.lm_head.weight)}
        zero = ("o_proj.weight", "down.weight", "corr_down.weight", "conf_down.weight", "conf_down.bias",
                "conf_up.bias")
        for name, p in self.named_parameters():
            if id(p) in frozen:
                continue
            if name.endswith(zero):
                p.zero_()
            elif name in ("feature_norm", "token_norm", "norm", "out_norm") or name.endswith("_norm"):
                p.fill_(1.0)
            elif name == "slots":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        self.freeze_target_weights()

    def freeze_target_weights(self) -> None:
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    @classmethod
    def from_target(cls, target, feature_layers: tuple[int, ...] | None = None, seed: int = 0,
                    **sizes) -> "DSparkDrafter":
        """A fresh drafter for `target` (a K3ForCausalLM): shapes from its config, embedding / lm_head copied;
        feature layers default to four spread over the target's depth."""
        tcfg = target.cfg
        feature_layers = feature_layers or default_feature_layers(tcfg.num_hidden_layers)
        bad = [l for l in feature_layers if not 0 <= l < tcfg.num_hidden_layers]
        if bad:
            raise ValueError(f"feature layers {bad} are outside the target's {tcfg.num_hidden_layers} layers")
        cfg = DSparkConfig(target_hidden_size=tcfg.hidden_size, feature_layers=tuple(feature_layers),
                           vocab_size=tcfg.vocab_size, tie_word_embeddings=bool(tcfg.tie_word_embeddings), **sizes)
        model = cls(cfg, dtype=torch.float32)
        model.reset_parameters(seed)
        with torch.no_grad():
            model.embed_tokens.weight.copy_(target.model.embed_tokens.weight.float())
            if not cfg.tie_word_embeddings:
                model.lm_head.weight.copy_(target.lm_head.weight.float())
        return model

    def num_trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    # ---- the network
    def _feature_parts(self, captured: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        """The captured layers this drafter reads, in its order (an error naming any the forward did not capture)."""
        missing = [l for l in self.cfg.feature_layers if l not in captured]
        if missing:
            raise ValueError(f"target forward did not capture layers {missing}: set fb.capture_layers = "
                             f"{self.cfg.feature_layers}")
        return [captured[l] for l in self.cfg.feature_layers]

    def gather_features(self, captured: dict[int, torch.Tensor]) -> torch.Tensor:
        """ModelOutput.captured (layer id -> [T, target_hidden]) -> features [T, F] in this drafter's order."""
        return torch.cat(self._feature_parts(captured), dim=-1)

    def features_at(self, captured: dict[int, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """gather_features of the captured layers' `rows` (one launch on a GPU: `ops.dspark.gather_rows`)."""
        return dspark_ops.gather_rows(self._feature_parts(captured), rows)

    def block(self, features: torch.Tensor, last_token: torch.Tensor, gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The parallel part: (context state [N, D], slot outputs [N, gamma, D])."""
        cfg, dtype = self.cfg, self.fc.weight.dtype
        N = features.shape[0]
        if features.is_cuda and not torch.is_grad_enabled():  # drafting on a GPU: the formulas below in one kernel
            x = dspark_ops.block_front(features, last_token, self.embed_tokens.weight, self.feature_norm,
                                       self.token_norm, self.fc.weight, self.slots[:gamma], cfg.rms_norm_eps)
        else:
            f = features.to(dtype).view(N, len(cfg.feature_layers), cfg.target_hidden_size)
            f = rms(f, cfg.rms_norm_eps, self.feature_norm)  # layers differ in scale: normalise each
            e = rms(self.embed_tokens(last_token), cfg.rms_norm_eps, self.token_norm)
            ctx = self.fc(torch.cat([f.flatten(1), e], -1))  # [N, D]
            x = torch.cat([ctx[:, None], ctx[:, None] + self.slots[:gamma]], 1)  # [N, 1 + gamma, D]
        for layer in self.layers:
            x = layer(x)
        x = rms(x, cfg.rms_norm_eps, self.norm)
        return x[:, 0], x[:, 1:]

    def correct(self, slot: torch.Tensor, prev_state: torch.Tensor, prev_token: torch.Tensor) -> torch.Tensor:
        """Slot output [N, D] corrected by the previous token [N] and corrected state [N, D]."""
        u = rms_rows([slot, prev_state, self.embed_tokens(prev_token)], self.cfg.rms_norm_eps)
        return slot + self.corr_down(F.silu(self.corr_up(u)))

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        if state.is_cuda and FOLD_GPU_HEAD and not torch.is_grad_enabled():
            # drafting on a GPU: the folded head, as the greedy drafts' vocabulary kernel reads it (so a step that
            # also rates every position drafts what one rating only the first does)
            return F.linear(rms(state, self.cfg.rms_norm_eps), self._folded(FoldedHead).head)
        h = rms(state, self.cfg.rms_norm_eps, self.out_norm)
        h = h if self.out_proj is None else self.out_proj(h)
        y = linear_ops.kmajor_linear(self, h, self.lm_head.weight)  # drafting one sequence on a CPU
        return self.lm_head(h) if y is None else y

    def confidence_logit(self, state: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """[..., D], [..., V] -> [...]; reads detached inputs, so its loss never moves the drafting path."""
        return self.confidence_from(state, self.peak(logits))

    @staticmethod
    def peak(logits: torch.Tensor) -> torch.Tensor:
        """[..., V] -> [..., 2]: the two largest log-probabilities, how peaked the draft distribution is (cheaper
        than its entropy)."""
        logits = logits.detach().float()
        return logits.topk(2, -1).values - torch.logsumexp(logits, -1, keepdim=True)

    def confidence_from(self, state: torch.Tensor, top2: torch.Tensor) -> torch.Tensor:
        """The confidence head on states [..., D] and their peaks [..., 2] -> logits [...]."""
        return dspark_ref.confidence_logits(state.detach(), top2, self.conf_up, self.conf_down, self.cfg.rms_norm_eps)

    def _check(self, features: torch.Tensor, last_token: torch.Tensor, gamma: int) -> None:
        if features.dim() != 2 or features.shape[1] != self.cfg.feature_size:
            raise ValueError(f"features must be [B, {self.cfg.feature_size}], got {tuple(features.shape)}")
        if last_token.shape != (features.shape[0],):
            raise ValueError(f"last_token must be [{features.shape[0]}], got {tuple(last_token.shape)}")
        if not 1 <= gamma <= self.cfg.gamma_max:
            raise ValueError(f"gamma = {gamma} must be in [1, {self.cfg.gamma_max}] (the drafter's gamma_max)")

    def teacher_forced_states(self, features: torch.Tensor, last_token: torch.Tensor,
                              targets: torch.Tensor) -> torch.Tensor:
        """Training: the corrected states [N, gamma, D] with the true previous tokens fed to the correction.
        targets [N, gamma] (negative = past the end; fed as token 0)."""
        gamma = targets.shape[1]
        self._check(features, last_token, gamma)
        ctx, slots = self.block(features, last_token, gamma)
        prev_tokens = torch.cat([last_token[:, None], targets[:, :-1].clamp_min(0)], 1)
        state, states = ctx, []
        for i in range(gamma):
            state = self.correct(slots[:, i], state, prev_tokens[:, i])
            states.append(state)
        return torch.stack(states, 1)

    def forward(self, features: torch.Tensor, last_token: torch.Tensor,
                targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced (logits [N, gamma, V], confidence logits [N, gamma]) for targets [N, gamma]."""
        states = self.teacher_forced_states(features, last_token, targets)
        logits = self.logits(states)
        return logits, self.confidence_logit(states, logits)

    @torch.no_grad()
    def propose(self, features: torch.Tensor, last_token: torch.Tensor, gamma: int, temperature: float = 0.0,
                generator: torch.Generator | None = None, want_probs: bool = True,
                want_confidence: bool = True, confidence_positions: int | None = None) -> DraftOutput:
        """Draft gamma tokens per sequence: greedy (temperature 0) or sampled from softmax(logits / temperature).

        The serving loop drafts greedily and verifies against a point-mass proposal, so it asks for neither the
        distributions (a softmax over the vocabulary per position) nor, below the planner's batch size, the
        confidence: probs / confidence are then None. With confidence_positions k, the confidence covers the first
        k positions only ([B, k]: the context lookup's gate reads the first).
        """
        self._check(features, last_token, gamma)
        if temperature < 0:
            raise ValueError(f"temperature = {temperature} must be >= 0")
        if temperature == 0 and not want_probs and features.is_cuda and (not want_confidence
                                                                          or confidence_positions == 1):
            return self._greedy_drafts(features, last_token, gamma, first_confidence=want_confidence)
        if temperature == 0 and not want_probs and not features.is_cuda and FOLD_CPU_DRAFTS:
            return self._folded_drafts(features, last_token, gamma, want_confidence, confidence_positions)
        ctx, slots = self.block(features, last_token, gamma)
        state, token = ctx, last_token
        tokens, probs, states, peaks = [], [], [], []
        rated = gamma if confidence_positions is None else confidence_positions
        for i in range(gamma):
            state = self.correct(slots[:, i], state, token)
            logits = self.logits(state)
            if temperature == 0 and not want_probs:
                token = ops.argmax(logits)
            else:
                p = torch.softmax(logits.float() / (temperature or 1.0), -1)  # [B, V]
                token = p.argmax(-1) if temperature == 0 else torch.multinomial(p, 1, generator=generator)[:, 0]
                probs.append(p)
            tokens.append(token)
            if want_confidence and i < rated:
                states.append(state)
                peaks.append(self.peak(logits))
        # the confidence head once over every position (on a GPU, a few launches instead of a few per position)
        conf = torch.sigmoid(self.confidence_from(torch.stack(states, 1), torch.stack(peaks, 1))) if states else None
        return DraftOutput(torch.stack(tokens, 1), torch.stack(probs, 1) if probs else None, conf)

    def _folded_drafts(self, features: torch.Tensor, last_token: torch.Tensor, gamma: int,
                       want_confidence: bool, confidence_positions: int | None = None) -> DraftOutput:
        """propose's greedy drafts (no distributions) on a CPU with the correction's products regrouped
        (`FoldedCorrection`): the slot part of the correction's up projection for every position in one product
        before the loop, the token part looked up, the output norm and projection folded into the vocabulary
        projection, and each corrected state normalised once (the next position's correction input and the head
        read the same norm). The same sums, rounded otherwise: the logits agree with the loop's to rounding, so the
        tokens only differ where two logits tie within it. About seven ops a position instead of sixteen."""
        eps = self.cfg.rms_norm_eps
        fold = self._folded()
        ctx, slots = self.block(features, last_token, gamma)
        slot_up = rms(slots, eps) @ fold.slot_up  # [N, gamma, C]
        state_n, token = rms(ctx, eps), last_token
        tokens, states, peaks = [], [], []
        rated = gamma if confidence_positions is None else confidence_positions
        for i in range(gamma):
            a = torch.addmm(slot_up[:, i] + fold.token_up[token], state_n, fold.state_up)
            state = torch.addmm(slots[:, i], F.silu(a, inplace=True), fold.down)
            state_n = rms(state, eps)
            logits = state_n @ fold.head
            token = ops.argmax(logits)
            tokens.append(token)
            if want_confidence and i < rated:
                states.append(state)
                peaks.append(self.peak(logits))
        conf = torch.sigmoid(self.confidence_from(torch.stack(states, 1), torch.stack(peaks, 1))) if states else None
        return DraftOutput(torch.stack(tokens, 1), None, conf)

    def _folded(self, kind=None):
        """This drafter's FoldedCorrection (or FoldedHead), made on first use and again whenever a weight it reads
        moved."""
        kind = kind or FoldedCorrection
        key, name = FoldedCorrection.key(self), "_fold_" + kind.__name__
        fold = self.__dict__.get(name)
        if fold is None or fold.source != key:
            made = kind(self, key)
            if isinstance(fold, FoldedHead) and fold.head.shape == made.head.shape:
                fold.head.copy_(made.head)  # in place: CUDA graphs captured with the old one read the new values
                fold.source = key
            else:
                fold = self.__dict__[name] = made
        return fold

    def _greedy_drafts(self, features: torch.Tensor, last_token: torch.Tensor, gamma: int,
                       first_confidence: bool = False) -> DraftOutput:
        """propose's greedy drafts [B, gamma] (the serving loop's case: no distributions; no confidence, or the
        first position's) through the correction ops: on a GPU four kernels a position (the correction's input and
        up projection; its down projection adding the slot; the output norm and projection; the vocabulary
        projection's argmax as partial keys, which the next position's first kernel reduces), where the module
        calls launch about fourteen. On the CPU (the reference ops, propose's formulas) the same tokens as
        propose's loop, which stays the CPU's path: ~15% faster there without the ops' dispatch and the argmax
        keys. With first_confidence, also the first position's confidence ([B, 1]: the context lookup's gate): the
        vocabulary projection's kernel also keeps each tile's largest two logits and exp-sum, and the last kernel (the
        tokens' decode) also turns them and the position's state into the confidence (`ops.dspark.decode_keys`).

        With FOLD_GPU_HEAD (the default) the output norm's weight and projection are folded into the vocabulary
        projection (`folded_head`), whose kernel normalises the state itself: three kernels a position. The logits
        then round otherwise than the module formulas' (argmax ties within rounding may pick another draft)."""
        eps = self.cfg.rms_norm_eps
        ctx, slots = self.block(features, last_token, gamma)
        slots = slots.transpose(0, 1).contiguous()  # [gamma, B, D]: each position's rows contiguous
        head = self._folded(FoldedHead).head if FOLD_GPU_HEAD else None
        state, prev, keys, conf = ctx, last_token, [], None
        early = dspark_ops.EARLY_CORRECTION
        for i in range(gamma):
            # (after the first, each position's correction follows a vocabulary kernel that launched it late)
            a = dspark_ops.correct_up(slots[i], state, prev, self.embed_tokens.weight, self.corr_up.weight, eps,
                                      early=early and i > 0)
            state = linear_ops.linear(a, self.corr_down.weight, add=slots[i])
            if head is not None:
                h, w, norm_eps = state, head, eps
            else:
                s = state
                norm = Prologue("rms", s, lambda: rms(s, eps, self.out_norm), weight=self.out_norm, eps=eps)
                h = norm.apply() if self.out_proj is None else linear_ops.linear_with(norm, self.out_proj.weight)
                w, norm_eps = self.lm_head.weight, None
            late = early and i + 1 < gamma
            if first_confidence and i == 0:  # the head's tiles also keep what the peak needs
                prev, stats = dspark_ops.head_keys(h, w, stats=True, eps=norm_eps, late_trigger=late)
                conf = (stats, state, self.conf_up, self.conf_down, eps)  # computed with the tokens, at the end
            else:
                prev = dspark_ops.head_keys(h, w, eps=norm_eps, late_trigger=late)
            keys.append(prev)
        if conf is None:
            return DraftOutput(dspark_ops.decode_keys(keys), None, None)  # tokens [B, gamma]
        tokens, conf = dspark_ops.decode_keys(keys, conf)
        return DraftOutput(tokens, None, conf)

    # ---- checkpoints
    def save(self, path: str | Path, dtype: torch.dtype | None = torch.bfloat16) -> None:
        """config.json + model.safetensors (bf16 by default; the tied lm_head is stored once, as the embedding)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {}
        for name, t in self.state_dict().items():
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue
            t = t.detach().cpu()
            state[name] = (t.to(dtype) if dtype is not None and t.is_floating_point() else t).contiguous()
        save_file(state, path / WEIGHTS_NAME, metadata={"format": "pt"})
        config = self.cfg.to_dict()
        config["torch_dtype"] = str(dtype or self.fc.weight.dtype).removeprefix("torch.")
        (path / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path, device="cpu", dtype: torch.dtype = torch.float32) -> "DSparkDrafter":
        path = Path(path)
        if not (path / CONFIG_NAME).exists() or not (path / WEIGHTS_NAME).exists():
            raise FileNotFoundError(f"{path} is not a DSpark drafter checkpoint ({CONFIG_NAME} + {WEIGHTS_NAME})")
        cfg = DSparkConfig.from_dict(json.loads((path / CONFIG_NAME).read_text()))
        model = cls(cfg, dtype=dtype)
        state = load_file(path / WEIGHTS_NAME)
        expected = {n for n in model.state_dict() if not (n == "lm_head.weight" and cfg.tie_word_embeddings)}
        unexpected, missing = sorted(set(state) - expected), sorted(expected - set(state))
        if unexpected or missing:
            raise ValueError(f"drafter checkpoint {path}: unexpected tensors {unexpected[:4]}, missing {missing[:4]}")
        own = model.state_dict()
        with torch.no_grad():
            for name, t in state.items():
                if tuple(t.shape) != tuple(own[name].shape):
                    raise ValueError(f"drafter tensor {name!r}: checkpoint shape {tuple(t.shape)}, "
                                     f"model expects {tuple(own[name].shape)}")
                own[name].copy_(t)
        model.freeze_target_weights()
        return model.to(device).eval()
