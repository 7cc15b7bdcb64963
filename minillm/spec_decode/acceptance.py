"""How often would a draft's token be accepted? The numbers speculative decoding's speedup rests on.

With p the target's next-token distribution and q the draft's (p target, q draft, fixed notation),
speculative sampling (Leviathan et al. 2023; Chen et al. 2023) accepts a drafted token with
probability sum_x min(p(x), q(x)) on average: alpha = E[sum_x min(p, q)], one minus the total
variation distance. Greedy decoding is the one-hot case: alpha = P(argmax q == argmax p).
With gamma drafted tokens per step, the expected tokens per target step is
    E(alpha, gamma) = (1 - alpha^(gamma + 1)) / (1 - alpha)        (Leviathan et al., eq. 1)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Acceptance:
    alpha: float          # at temperature 1: mean of sum_x min(p, q)
    alpha_greedy: float   # one-hot: mean of [argmax p == argmax q]
    positions: int

    def expected_tokens(self, gamma: int, greedy: bool = False) -> float:
        return expected_tokens(self.alpha_greedy if greedy else self.alpha, gamma)


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per target forward with gamma drafted tokens (the bonus token included)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


@torch.no_grad()
def measure_acceptance(target, draft, windows, temperature: float = 1.0, batch_size: int = 8) -> Acceptance:
    """alpha over every position of `windows` (N, T) token ids, both models scoring the same prefixes."""
    total, greedy, n = 0.0, 0.0, 0
    for i in range(0, len(windows), batch_size):
        x = windows[i:i + batch_size]
        p = torch.softmax(target(x).double() / temperature, -1)      # (B, T, V)
        q = torch.softmax(draft(x).double() / temperature, -1)       # (B, T, V)
        total += torch.minimum(p, q).sum(-1).sum().item()
        greedy += (p.argmax(-1) == q.argmax(-1)).sum().item()
        n += x.numel()
    return Acceptance(total / n, greedy / n, n)
