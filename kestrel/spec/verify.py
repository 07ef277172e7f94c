"""Lossless verification of a drafted block against the target's logits.

Greedy: the longest prefix of drafts equal to the target's argmax, plus the target's token where they part (or
after the last draft). Sampling: speculative rejection sampling. The drafter drafts greedily, so its proposal
distribution is a point mass q = delta(d): a draft is accepted with probability p(d), and on rejection the token
comes from the residual max(0, p - q), i.e. p with d removed and renormalised. The output distribution is then
exactly the target's (Leviathan et al., 2023), and penalties see every earlier accepted token.
"""

from dataclasses import dataclass

import torch

from kestrel.engine.sampler import SamplingState, adjusted_logits, distribution, draw, uniform


@dataclass
class Accepted:
    tokens: list[int]  # accepted drafts, then the target's own token
    # accepted drafts = len(tokens) - 1

    @property
    def num_accepted(self) -> int:
        return len(self.tokens) - 1


def accept(logits: torch.Tensor, drafts: list[int], st: SamplingState, argmax: list[int] | None = None) -> Accepted:
    """logits [len(drafts) + 1, V]: the target's rows at the last committed token and each draft; argmax: their
    plain argmax when the caller has it (one device sync for a whole batch), used wherever nothing adjusts a row.

    Advances the sampling state by every returned token (as if each had been sampled in turn).
    """
    out: list[int] = []
    for j in range(len(drafts) + 1):
        d = drafts[j] if j < len(drafts) else None
        if st.params.greedy:
            t = argmax[j] if argmax is not None and st.plain_greedy else int(adjusted_logits(logits[j], st).argmax())
        else:
            p = distribution(logits[j], st)
            if d is not None and uniform(st) < float(p[d]):
                t = d
            else:
                if d is not None:
                    p = p.clone()
                    p[d] = 0.0
                t = draw(p, st)
        st.advance(t)
        out.append(t)
        if t != d:
            break
    return Accepted(out)
