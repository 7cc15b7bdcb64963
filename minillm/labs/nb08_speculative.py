"""Checkers for notebook 08_speculative_decoding."""
from __future__ import annotations

import torch

from .common import _close, checker


@checker
def check_residual(fn):
    """fn(p (V,), q (V,)) -> the distribution sampled after a rejection: norm(max(0, p - q)), or p if that is 0"""
    from ..spec_decode.config import residual
    g = torch.Generator().manual_seed(11)
    for V in (2, 5, 33):
        p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
        _close(f"V={V}", torch.as_tensor(fn(p.clone(), q.clone()), dtype=torch.float64), residual(p, q, 0), atol=1e-12)
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    _close("p == q (empty residual: fall back to p)", torch.as_tensor(fn(p.clone(), p.clone()), dtype=torch.float64),
           p, atol=1e-12)
    return ("matches minillm.spec_decode.config.residual: rejected mass goes where the target wants more than "
            "the draft gave")


@checker
def check_ngram_lookup(fn):
    """fn(tokens, k, n) -> up to k tokens that followed the latest earlier occurrence of the last n tokens"""
    cases = [([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3], 2, 3, [4, 5]), ([7, 8, 9], 3, 2, []), ([4, 1, 4, 2, 4], 1, 1, [2]),
             ([5, 6, 5, 6, 7, 5, 6], 2, 2, [7, 5]), ([3, 3, 3], 1, 2, [3])]
    for tokens, k, n, want in cases:
        got = list(fn(list(tokens), k, n))
        assert got[:len(want)] == want and len(got) <= k, f"tokens={tokens}, k={k}, n={n}: got {got}, want {want}"
        assert got == want or len(got) > len(want), f"tokens={tokens}, k={k}, n={n}: got {got}, want {want}"
    return "finds the latest match and copies what followed it"


# ---------------------------------------------------------------- core: the reader's verification rule in the engine
# A target whose next-token distribution depends only on the last token (a Markov chain P, 8 tokens, some
# transitions impossible) and a proposer drafting from another chain Q: every emitted token must follow P, so a
# chi-square test over (previous token, token) counts checks the rule inside the engine. Seeded throughout, so a
# rule passes or fails the same way every run; the significance level says how strong the evidence is.
V8, GAMMA, P_FAIL = 8, 3, 1e-4


def _chains():
    """P (8, 8) the target's transitions, with p = 0 at (a, a + 3 mod 8); Q (8, 8) the draft's, all > 0."""
    g = torch.Generator().manual_seed(8)
    P = 0.6 * torch.softmax(1.5 * torch.randn(V8, V8, generator=g, dtype=torch.float64), -1) + 0.4 / V8
    P[torch.arange(V8), (torch.arange(V8) + 3) % V8] = 0.0
    Q = 0.6 * torch.softmax(1.5 * torch.randn(V8, V8, generator=g, dtype=torch.float64), -1) + 0.4 / V8
    return P / P.sum(-1, keepdim=True), Q


def _markov_target(P):
    from ..config import ModelConfig
    from ..llama.transformer import Transformer

    class MarkovTarget(Transformer):
        """logits at a token = log P[token] (-1e9 where P is 0): no K/V needed, the last token is the state."""

        def __init__(self):
            super().__init__(ModelConfig(dim=2, hidden_dim=2, n_layers=1, n_heads=1, n_kv_heads=1, vocab_size=V8,
                                         max_seq_len=64))
            self.logp = P.log().clamp_min(-1e9)                     # (8, 8)

        def forward(self, tokens, positions, kv, attn, rows=None, return_hidden=False):
            B, T = tokens.shape
            rows = torch.arange(B) * T + T - 1 if rows is None else rows
            return self.logp[tokens.reshape(-1)[rows]]             # (N, 8)
    return MarkovTarget().double().eval()


def _chain_proposer(Q):
    from ..core.batch import Draft
    from ..core.proposer import Proposer, draft_len

    class ChainProposer(Proposer):
        """Drafts GAMMA tokens from Q, each after the previous one, with q = Q[previous token] (seeded)."""

        def __init__(self):
            self.g, self.q = torch.Generator().manual_seed(9), Q.float()

        def num_slots(self, seq):
            return draft_len(seq, GAMMA, 64)

        def propose(self, batch):
            drafts = []
            for row in batch.rows:
                if not row.lookahead:
                    drafts.append(None)
                    continue
                prev, tokens, qs = row.seq.token_ids[-1], [], []
                for _ in range(row.lookahead):                      # x_i ~ q_i = Q[x_{i-1}]
                    qs.append(self.q[prev])
                    prev = int(torch.multinomial(qs[-1], 1, generator=self.g))
                    tokens.append(prev)
                drafts.append(Draft(tokens, torch.stack(qs)))       # q (k, 8)
            return drafts
    return ChainProposer()


class _Guarded:
    """The reader's rule as the engine calls it, on copies of p and q; its answer is checked before the engine
    uses it. The first problem is kept (the engine turns an exception in a rule into that request's error)."""

    def __init__(self, rule):
        self.rule, self.problem, self.error = rule, None, None

    def __call__(self, p, q, draft, generator):
        try:
            out = self.rule(p.clone(), None if q is None else q.clone(), list(draft), generator)
            assert isinstance(out, (tuple, list)) and len(out) == 2, \
                f"the rule must return (n accepted, token), got {type(out).__name__} {out!r:.60}"
            n, tok = int(out[0]), int(out[1])
            assert 0 <= n <= len(draft), f"n accepted = {n}, but only {len(draft)} tokens were drafted"
            assert 0 <= tok < p.shape[-1], (f"token {tok} is not a token id in [0, {p.shape[-1]}) (a cumulative-sum "
                                            f"sampler on a residual not divided by its sum runs off the end)")
            return n, tok
        except BaseException as e:
            if self.problem is None:
                self.error = e
                self.problem = str(e) if isinstance(e, AssertionError) else f"{type(e).__name__}: {e}"
            raise


def _probe(rule, p, q, draft, seeds=range(40)) -> list:
    """[(n, token)] of the rule on one row, once per generator seed."""
    return [rule(p.clone(), q.clone(), list(draft), torch.Generator().manual_seed(s)) for s in seeds]


def _replacement_problem(tok, p, q) -> str:
    """Why a token emitted after a rejection is impossible: max(0, p - q) is 0 there."""
    last = " (the last token: a cumulative-sum sampler on a residual not divided by its sum runs off the end)" \
        if tok == p.shape[-1] - 1 else ""
    return (f"after rejecting the draft, emitted token {tok}, where max(0, p - q) is 0 (p = "
            f"{[round(v, 2) for v in p.tolist()]}, q = {[round(v, 2) for v in q.tolist()]}): sample the replacement "
            f"from norm(max(0, p - q)), not from q or p{last}")


def _probe_rule(rule):
    """Single rows whose answer is certain, each naming one mistake."""
    rule = _Guarded(rule)
    # 1) p(x) = 0: the draft is always rejected; the residual max(0, p - q) is all on tokens 1 and 2
    p, q = torch.tensor([[0.0, 0.5, 0.5, 0.0]] * 2), torch.tensor([[0.5, 0.1, 0.1, 0.3]])
    for n, tok in _probe(rule, p, q, [0]):
        assert n == 0, ("accepted draft token 0 although the target gives it p = 0 (q = 0.5): accept x with "
                        "probability min(1, p(x) / q(x)), 0 here (always accepting, or using q / p, accepts it)")
        assert tok in (1, 2), _replacement_problem(tok, p[0], q[0])
    # 2) p = q at every drafted slot: all accepted, then the bonus token from p[k], here all on token 3
    p = torch.tensor([[0.2, 0.3, 0.5, 0.0], [0.6, 0.2, 0.1, 0.1], [0.3, 0.3, 0.3, 0.1], [0.0, 0.0, 0.0, 1.0]])
    for n, tok in _probe(rule, p, p[:3].clone(), [2, 0, 1]):
        assert not (n == 2 and tok == 1), ("no bonus token: with every draft accepted, return n = k (all of "
                                           "them) and one more token sampled from p[k], the target's distribution "
                                           "after the last draft")
        assert n == 3, (f"rejected draft {n} although p(x) = q(x) there (accept probability min(1, p/q) = 1): "
                        f"accept x with probability min(1, p(x) / q(x))")
        assert tok == 3, (f"all 3 drafts accepted, then emitted token {tok}: the bonus token is sampled from p[k] "
                          f"(p[3], all on token 3 here), the target's distribution after the last draft")
    # 3) p(x) > q(x): accepted for sure, min(1, p / q) = 1 (then the bonus token, from p[1])
    p, q = torch.tensor([[0.2, 0.6, 0.2, 0.0], [0.0, 0.0, 1.0, 0.0]]), torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    try:
        got = _probe(rule, p, q, [1])
    except Exception as e:
        raise AssertionError(f"with p(x) = 0.6 > q(x) = 0.3 (a draft accepted for sure) the rule raised {e}: the "
                             f"acceptance probability is min(1, p(x) / q(x)), capped at 1") from None
    assert (0, 1) not in got, ("no bonus token: with every draft accepted, return n = k (all of them) and one "
                               "more token sampled from p[k], the target's distribution after the last draft")
    assert all(n == 1 for n, _ in got), ("rejected a draft with p(x) = 0.6 > q(x) = 0.3: min(1, p(x) / q(x)) = 1, "
                                         "such a draft is always accepted")
    # 4) a rejection's replacement follows norm(max(0, p - q)) = [0, 4/7, 3/7, 0]
    p, q = torch.tensor([[0.1, 0.5, 0.4, 0.0]] * 2), torch.tensor([[0.7, 0.1, 0.1, 0.1]])
    for n, tok in _probe(rule, p, q, [0], seeds=range(60)):
        assert n == 1 or tok in (1, 2), _replacement_problem(tok, p[0], q[0])


def _transition_counts(rule, requests: int = 200, max_tokens: int = 10):
    """Seeded sampled requests through the engine with the chain target, the chain proposer and the rule.
    -> counts (8, 8) of (previous token, emitted token), the engine's spec_stats, the rule wrapper."""
    from ..config import EngineConfig
    from ..core.sampling import SamplingParams
    from ..engine.engine import LLMEngine
    from .hashmodel import IdTokenizer
    P, Q = _chains()
    guarded = _Guarded(rule)
    target = _markov_target(P)
    cfg = EngineConfig(dtype="float64", max_model_len=64, max_num_seqs=requests, block_size=16,
                       kv_cache_bytes=requests * 64 * target.config.kv_bytes_per_token(8))
    engine = LLMEngine.from_model(target, IdTokenizer(V8), cfg, proposer=_chain_proposer(Q), verify=guarded)
    for i in range(requests):
        engine.add_request([i % V8], SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens, ignore_eos=True))
    counts = torch.zeros(V8, V8, dtype=torch.float64)
    while engine.has_unfinished_requests():
        engine.step()
        if isinstance(guarded.error, NotImplementedError):
            raise guarded.error
        assert guarded.problem is None, f"inside the engine: {guarded.problem}"
        for o in engine.pop_finished():
            ids = o.prompt_token_ids[-1:] + o.outputs[0].token_ids
            for a, b in zip(ids, ids[1:]):
                counts[a, b] += 1
    return counts, engine.spec_stats, P


def _chi_square(counts, P):
    """Pearson's statistic of counts (8, 8) against rows n_a * P[a] (cells expecting < 5 pooled per row),
    its degrees of freedom, the p-value, and the worst cell."""
    stat, df, worst = 0.0, 0, (0.0, None)
    for a in range(V8):
        n = counts[a].sum()
        if n == 0:
            continue
        exp, obs = n * P[a], counts[a]
        big = exp >= 5
        cells = [(obs[big], exp[big])] + ([(obs[~big].sum()[None], exp[~big].sum()[None])] if (~big).any() else [])
        o, e = torch.cat([c[0] for c in cells]), torch.cat([c[1] for c in cells])
        terms = (o - e) ** 2 / e.clamp_min(1e-12)
        stat += float(terms.sum())
        df += len(o) - 1
        j = int(torch.argmax(terms))
        if float(terms[j]) > worst[0] and bool(big.all()):
            worst = (float(terms[j]), (a, j, float(o[j]), float(e[j])))
    pvalue = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2)))
    return stat, df, pvalue, worst[1]


@checker(kind="core", signature="p, q, draft, generator")
def check_verify_rule(rule):
    """rule(p (k + 1, V), q (k, V), draft (k ids), generator) -> (n accepted, token emitted after them).
    A few rows whose answer is certain, then the rule plugged into the engine (verify=rule) on 200 seeded
    requests: the emitted tokens must follow the target's distribution (chi-square, significance 1e-4)."""
    torch.manual_seed(0)                                  # a rule drawing from torch's global generator: seeded too
    _probe_rule(rule)
    counts, stats, P = _transition_counts(rule)
    impossible = counts[P == 0].sum()
    assert impossible == 0, (f"inside the engine: {impossible:.0f} tokens emitted that the target gives "
                             f"probability 0")
    stat, df, pvalue, worst = _chi_square(counts, P)
    where = f"; e.g. after token {worst[0]}, token {worst[1]} {worst[2]:.0f} times, expected {worst[3]:.0f}" \
        if worst else ""
    assert pvalue > P_FAIL, (f"inside the engine the emitted tokens do not follow the target's distribution: "
                             f"chi-square {stat:.0f} on {df} degrees of freedom, p-value {pvalue:.1e} < {P_FAIL:g} "
                             f"({counts.sum():.0f} tokens{where})")
    return (f"exact: {counts.sum():.0f} tokens from the engine follow the target's p (chi-square {stat:.0f} on {df} "
            f"degrees of freedom, p-value {pvalue:.2f}, fails below {P_FAIL:g}; seeded, so the same every run); "
            f"{stats['accepted']} of {stats['drafted']} drafts accepted")
