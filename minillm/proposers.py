"""Proposers for speculative decoding: who drafts the gamma tokens the target then verifies.

    NgramProposer   prompt lookup (Saxena 2023; vLLM's "ngram"): find the context's latest earlier
                    occurrence of its last n tokens and propose what followed it. Free to run; q is one-hot.
    DraftProposer   a small draft model (the shipped distilled draft) decoding gamma tokens ahead on its
                    own paged KV pool, sampled with the request's own parameters and generator; q is its
                    distribution. After verification its cache is rolled back with the target's.
    Medusa          see minillm.medusa (heads on the target's own hidden state, a candidate tree).

A proposal for one sequence is (tokens, q): the drafted ids and q (k, V) float, or None for one-hot.
Every proposer also has the hooks of Proposer below, which the engine calls as sequences change.
"""
from __future__ import annotations

import torch

from .block_manager import BlockManager
from .kv_cache import KVCache
from .model_runner import ModelRunner, backend_model
from .sampling import probs_from_logits
from .scheduler import ScheduledBatch
from .sequence import Sequence


def ngram_lookup(tokens: list[int], k: int, ngram_max: int = 3, ngram_min: int = 1) -> list[int]:
    """k tokens copied from what followed the most recent earlier occurrence of the context's last n
    tokens, trying n = ngram_max first, down to ngram_min; [] when nothing matches. A copy that reaches
    the end of the context goes on through the tokens it has just proposed (a loop of period P repeats:
    the copy runs P tokens behind), so a short loop still fills all k."""
    L = len(tokens)
    for n in range(min(ngram_max, L - 1), ngram_min - 1, -1):
        suffix = tokens[L - n:]
        for i in range(L - n - 1, -1, -1):            # latest first; a match must end before the suffix
            if tokens[i:i + n] == suffix:
                ext = list(tokens)
                for j in range(i + n, i + n + k):     # j < len(ext) always: the copy trails by L - i - n >= 1
                    ext.append(ext[j])
                return ext[L:]
    return []


class Proposer:
    """The hooks, and what a stateless proposer does with them: nothing."""

    def rollback(self, seq: Sequence, valid: int):
        """Only the first `valid` tokens of seq stand; anything computed past them is stale."""

    def drop(self, seq: Sequence):
        """seq is gone (aborted): free what is held for it."""

    def fork(self, parent: Sequence, child: Sequence):
        """child is a new sample sharing parent's prefix (n > 1)."""

    def gc(self, running: set, swapped: set):
        """After a step: free what is held for sequences no longer running (swapped ones may come back)."""


class NgramProposer(Proposer):
    def __init__(self, gamma: int, ngram_max: int = 3, ngram_min: int = 1):
        self.gamma, self.ngram_max, self.ngram_min = gamma, ngram_max, ngram_min

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[tuple]:
        return [(ngram_lookup(s.token_ids, k, self.ngram_max, self.ngram_min) if k else [], None)
                for s, k in zip(seqs, ks)]


class DraftProposer(Proposer):
    """The draft model keeps a shadow of each speculating sequence (same tokens, its own block table in
    its own pool) and decodes k tokens ahead, k rounds of one batched forward (the first round also
    catches up on the tokens the target accepted since the last step). Its pool is sized for every running
    token plus each sequence's drafts; where samples or prefix-cache hits share the target's blocks the
    copies do not, and a sequence the draft pool cannot hold this step drafts nothing (it decodes plainly)."""

    def __init__(self, draft, num_blocks: int, block_size: int, kv_dtype=torch.float32, backend: str = "torch"):
        self.model = draft
        self.kv = KVCache(draft.config, num_blocks, block_size, kv_dtype)
        self.blocks = BlockManager(num_blocks, block_size)
        self.runner = ModelRunner(backend_model(draft, backend), self.kv)
        self.shadows: dict[int, Sequence] = {}           # target seq_id -> the draft's copy

    def _shadow(self, seq: Sequence) -> Sequence:
        sh = self.shadows.get(seq.seq_id)
        if sh is None:
            sh = self.shadows[seq.seq_id] = Sequence(seq.seq_id, seq.request_id, seq.index, [], seq.params, 0, 0.0)
        sh.prompt_ids, sh.output_ids = list(seq.token_ids), []
        return sh

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[tuple]:
        out = [([], [] if not s.params.greedy else None) for s in seqs]
        ks, free, active = list(ks), self.blocks.num_free, []
        for b, (s, k) in enumerate(zip(seqs, ks)):
            if k == 0:
                continue
            sh = self._shadow(s)
            need = self.blocks.blocks_needed(sh, len(sh) + k - 1)      # it computes positions up to len + k - 2
            if need > free:                                           # no room: no drafts for it this step
                self.drop(s)
                ks[b] = 0
                continue
            free -= need
            active.append((b, s, sh))
        for j in range(max(ks, default=0)):
            rows = [(b, s, sh) for b, s, sh in active if ks[b] > j]
            batch = ScheduledBatch("decode")
            for _, _, sh in rows:
                self.blocks.allocate(sh, len(sh))
                batch.add(sh, sh.num_computed, len(sh))
            logits = self.runner.run(batch)                                   # (R, V)
            for (b, s, sh), row in zip(rows, logits):
                p = s.params
                if p.greedy:
                    x = int(torch.argmax(row))
                else:
                    q = probs_from_logits(row, p.temperature, p.top_k, p.top_p)  # (V,)
                    x = int(torch.multinomial(q, 1, generator=s.generator))
                    out[b][1].append(q)
                sh.num_computed = len(sh)
                sh.output_ids.append(x)
                out[b][0].append(x)
        return [(toks, torch.stack(q) if q else None) for toks, q in out]

    def rollback(self, seq: Sequence, valid: int):
        sh = self.shadows.get(seq.seq_id)
        if sh is not None:
            sh.num_computed = min(sh.num_computed, valid)
            self.blocks.truncate(sh, sh.num_computed)

    def drop(self, seq: Sequence):
        sh = self.shadows.pop(seq.seq_id, None)
        if sh is not None:
            self.blocks.free_seq(sh)

    def gc(self, running: set, swapped: set):
        """Free the shadows of sequences no longer running (finished, aborted, preempted, swapped: a shadow is
        cheap to rebuild, and its blocks are better used by the sequences that run)."""
        for seq_id in [i for i in self.shadows if i not in running]:
            self.blocks.free_seq(self.shadows.pop(seq_id))


def same_tokenizer(a, b) -> bool:
    """Do two tokenizers map text to the same ids? llama2.c vocabularies: the same pieces in the same
    order; others: the same size and the same ids for a probe text."""
    if a is b:
        return True
    if hasattr(a, "pieces") and hasattr(b, "pieces"):
        return a.pieces == b.pieces
    probe = "To be, or not to be: that is the question.\n"
    return type(a) is type(b) and a.vocab_size == b.vocab_size and a.encode(probe) == b.encode(probe)


def load_draft(spec_model, target, tokenizer, dtype: str, seed: int):
    """The draft model for method "draft": a name or path (default: the shipped distilled draft), or a
    Transformer (which then shares the target's tokenizer). Its tokenizer must be the target's."""
    from .loader import load
    from .model import Transformer
    if isinstance(spec_model, Transformer):
        draft, draft_tok = spec_model, tokenizer
    else:
        draft, draft_tok = load(spec_model or "shakespeare-draft", None, dtype, seed)
    if not same_tokenizer(draft_tok, tokenizer) or draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"the draft model {spec_model or 'shakespeare-draft'!r} uses a different tokenizer from the "
                         f"target's (vocab {draft.config.vocab_size} vs {target.config.vocab_size}, or different "
                         f"tokens): speculative decoding verifies token ids, so both must share one tokenizer")
    if next(draft.parameters()).dtype != next(target.parameters()).dtype:
        draft = draft.to(next(target.parameters()).dtype)
    return draft.eval()


class MedusaProposer(Proposer):
    """Medusa (Cai et al. 2024): K heads on the target's own last hidden state guess the tokens 2..K+1
    ahead; their top candidates form a tree (minillm.medusa.build_tree) that the target verifies in one
    forward through a tree attention mask. Greedy only: the longest path the target agrees with is kept,
    its K/V moved into consecutive slots, and the target's token after it emitted."""

    def __init__(self, target, heads, choices, max_model_len: int):
        self.target, self.heads, self.choices, self.max_model_len = target, heads, list(choices), max_model_len
        self.hidden: dict[int, torch.Tensor] = {}          # seq_id -> (C,) the target's hidden state at its last computed token

    @classmethod
    def for_target(cls, target, spec, max_model_len: int):
        import os
        from .loader import MODELS_DIR
        from .medusa import DEFAULT_CHOICES, build_tree, load_medusa
        heads = load_medusa(spec.heads or os.path.join(MODELS_DIR, "shakespeare-medusa.bin"), target)
        choices = [tuple(c) for c in (spec.tree or DEFAULT_CHOICES)]
        build_tree(0, torch.zeros(heads.weight.shape[0], target.config.vocab_size), choices)  # validates the tree now
        return cls(target, heads, choices, max_model_len)

    def _choices(self, seq: Sequence, k: int) -> list:
        """The tree cut to depth k (gamma, fewer near max_tokens) and to the slots left before max_model_len."""
        room = self.max_model_len - len(seq)
        return [c for c in self.choices if len(c) <= k][:max(0, room)]

    def num_slots(self, seq: Sequence, k: int) -> int:
        return len(self._choices(seq, k))

    def observe(self, seqs, hidden, done):
        """After a target forward (prefill or plain decode): each finished row's hidden state (B, C)."""
        for s, h, d in zip(seqs, hidden, done):
            if d:
                self.hidden[s.seq_id] = h

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], ks: list[int]) -> list:
        from .medusa import MedusaTree, build_tree
        trees = []
        for s, k in zip(seqs, ks):
            choices = self._choices(s, k)
            if not choices:
                trees.append(MedusaTree([s.token_ids[-1]], [-1], [0], torch.ones(1, 1, dtype=torch.bool), [()]))
                continue
            head_logits = self.heads(self.hidden[s.seq_id], self.target.output.weight)      # (K, V)
            trees.append(build_tree(s.token_ids[-1], head_logits, choices))
        return trees

    def verify(self, seq: Sequence, tree, logits, hidden, kv) -> tuple:
        """logits (T, V), hidden (T, C) at the tree's nodes (T >= N, padded). -> (the drafted chain, n accepted,
        tokens to emit, alpha terms). The chain reported is the accepted path plus the best-ranked child the
        target turned down, if any (what the coloured text shows)."""
        from .medusa import greedy_accept
        N = len(tree.tokens)
        nxt = logits[:N].argmax(-1).tolist()
        path = greedy_accept(tree, nxt)
        last = path[-1] if path else 0
        base, bs = len(seq) - 1, kv.block_size
        slot = lambda pos: seq.block_table[pos // bs] * bs + pos % bs           # noqa: E731
        moves = [(base + a, base + 1 + i) for i, a in enumerate(path) if a != i + 1]
        kv.move_slots([slot(a) for a, _ in moves], [slot(b) for _, b in moves])  # the path into consecutive slots
        self.hidden[seq.seq_id] = hidden[last]
        refused = next((c for c in range(N) if tree.parents[c] == last), None)   # children come in rank order
        chain = [tree.tokens[a] for a in path] + ([tree.tokens[refused]] if refused is not None else [])
        return chain, len(path), [tree.tokens[a] for a in path] + [nxt[last]], [1.0] * len(path) + [0.0] * (refused is not None)

    def drop(self, seq: Sequence):
        self.hidden.pop(seq.seq_id, None)

    def fork(self, parent: Sequence, child: Sequence):
        self.hidden[child.seq_id] = self.hidden[parent.seq_id]       # the same prefix, the same hidden state

    def gc(self, running: set, swapped: set):
        """Keep swapped sequences' states: they resume decoding without a new prefill to refresh them."""
        for seq_id in [i for i in self.hidden if i not in running and i not in swapped]:
            del self.hidden[seq_id]
