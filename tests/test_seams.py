"""Every seam of the engine takes a trivial alternative written here, in a test file, with no engine file edited:
the scheduling policy, the block manager, logits processors, the verification rule, the linear op's weight type,
and the proposer. Each runs inside the real engine and is checked against what it must produce."""
from collections import deque

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_scheduler_fuzz import run_schedule

from minillm import LLM, SamplingParams
from minillm.core.batch import Draft, ScheduledBatch
from minillm.core.policies import SchedulingPolicy
from minillm.core.proposer import Proposer

PROMPTS = ["To be, or not to be", "Hamlet", "Who's there?", "O, what a rogue and peasant slave am I!"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tiny64):
    return tiny64


@pytest.fixture(scope="module")
def reference(tiny):
    model, tok = tiny
    return [o.token_ids for o in LLM(model, tokenizer=tok, dtype="float64").generate(PROMPTS, GREEDY)]


# ---------------------------------------------------------------- scheduling policy
class OneAtATime(SchedulingPolicy):
    """Serves requests strictly one after another: the oldest runs to completion before the next starts."""
    name = "one-at-a-time"

    def schedule(self, sched) -> ScheduledBatch:
        batch = ScheduledBatch("decode" if sched.running else "prefill")
        if sched.running:
            sched.extend(batch, sched.running[0])
        elif sched.waiting:
            sched.admit(batch, sched.waiting[0], float("inf"))
        return batch


def test_a_policy_from_a_test_file_runs_the_engine(tiny, reference):
    model, tok = tiny
    llm = LLM(model, tokenizer=tok, dtype="float64", policy=OneAtATime())
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference
    steps = llm.engine.trace.steps
    assert all(len(s.seq_ids) == 1 for s in steps) and len(steps) == len(PROMPTS) * GREEDY.max_tokens


# ---------------------------------------------------------------- block manager
class PlainBlocks:
    """The smallest block manager the scheduler accepts: a free list and reference counts; no prefix caching,
    no swap (written against the interface listed in minillm.core.block_manager's docstring)."""

    def __init__(self, num_blocks, block_size, enable_prefix_caching=False, swap_blocks=0):
        if enable_prefix_caching or swap_blocks:
            raise ValueError("PlainBlocks has no prefix cache and no swap space")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free, self.ref = deque(range(num_blocks)), [0] * num_blocks

    @property
    def num_free(self):
        return len(self.free)

    def _need(self, seq, n):
        return max(0, -(-n // self.block_size) - len(seq.block_table))

    def can_allocate(self, seq, n):
        return self._need(seq, n) <= self.num_free

    def _take(self):
        b = self.free.popleft()
        self.ref[b] = 1
        return b

    def allocate_prompt(self, seq):
        seq.block_table += [self._take() for _ in range(self._need(seq, len(seq)))]
        seq.num_computed = 0
        return 0

    def write_cost(self, seq, start, end):
        shared = sum(1 for i in range(start // self.block_size, min(len(seq.block_table), -(-end // self.block_size)))
                     if self.ref[seq.block_table[i]] > 1)
        return self._need(seq, end) + shared

    def prepare_write(self, seq, start, end):
        seq.block_table += [self._take() for _ in range(self._need(seq, end))]
        copies = []
        for i in range(start // self.block_size, -(-end // self.block_size)):
            b = seq.block_table[i]
            if self.ref[b] > 1:                          # copy-on-write
                self.ref[b] -= 1
                seq.block_table[i] = self._take()
                copies.append((b, seq.block_table[i]))
        return copies

    def fork(self, parent, child):
        child.block_table = list(parent.block_table)
        for b in child.block_table:
            self.ref[b] += 1
        child.num_computed = parent.num_computed

    def _release(self, blocks):
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)

    def free_seq(self, seq):
        self._release(reversed(seq.block_table))
        seq.block_table, seq.num_computed = [], 0

    def truncate(self, seq, n):
        keep = -(-n // self.block_size)
        self._release(reversed(seq.block_table[keep:]))
        del seq.block_table[keep:]

    def mark_computed(self, seq):
        pass

    def check(self, seqs):
        assert sorted(self.free) == [b for b in range(self.num_blocks) if self.ref[b] == 0]


def test_a_block_manager_from_a_test_file_passes_the_hash_model_fuzzer():
    """The paging fuzzer's schedules (n > 1 forks with copy-on-write, preemption, aborts, speculation with rollback)
    through PlainBlocks: outputs equal the sequential reference and every block comes back."""
    reqs = [([3, 4, 5, 3, 4, 5, 6], 20, 0, 2, False), ([3, 4, 5, 7], 14, 0, 3, False), ([9, 9, 10], 25, 1, 1, True),
            ([5] * 30, 9, 2, 2, False), ([12] * 20, 18, 4, 1, False)]
    for block_size, gamma, mode in [(1, 0, "continuous"), (4, 2, "continuous"), (2, 0, "chunked"), (16, 0, "static")]:
        def inject(engine, model):
            assert isinstance(engine.block_manager, PlainBlocks)
        run_schedule(reqs, block_size, mode, False, 4, "recompute", gamma, inject=inject, block_manager=PlainBlocks)


def test_the_block_manager_seam_refuses_what_it_cannot_do(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="PlainBlocks has no prefix cache"):
        LLM(model, tokenizer=tok, block_manager=PlainBlocks, enable_prefix_caching=True)


# ---------------------------------------------------------------- logits processors
def test_logits_processors_ban_and_force_tokens(tiny, reference):
    model, tok = tiny
    llm = LLM(model, tokenizer=tok, dtype="float64")
    banned = reference[0][0]
    ban = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                         logits_processors=[lambda ids, x: x.index_fill(0, torch.tensor([banned]), float("-inf"))])
    force = SamplingParams(temperature=0.8, seed=3, max_tokens=6, ignore_eos=True,
                           logits_processors=[lambda ids, x: torch.where(torch.arange(x.numel()) == 77 + len(ids),
                                                                         0.0, float("-inf"))])
    outs = llm.generate(PROMPTS[:2], [ban, force])
    assert banned not in outs[0].token_ids and outs[0].token_ids != reference[0]
    assert outs[1].token_ids == [77 + i for i in range(6)]       # each processor sees the ids generated so far


# ---------------------------------------------------------------- verification rule
def reject_all(p, q, draft, generator):
    """Accepts no draft; emits a token from p_1 with one draw, exactly as plain sampling does."""
    return 0, int(torch.multinomial(p[0], 1, generator=generator))


def test_a_verification_rule_from_a_test_file_is_the_one_used(tiny):
    """With every draft rejected and one multinomial draw per step, seeded output equals plain sampling's token for
    token (the drafts come from RepeatLast below, which draws nothing); the default rule draws uniforms too, so
    with it the output differs."""
    model, tok = tiny
    sp = SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=16, ignore_eos=True)
    plain = LLM(model, tokenizer=tok, dtype="float64").generate(PROMPTS[0], sp)[0].token_ids
    mine = LLM(model, tokenizer=tok, dtype="float64", verify=reject_all, proposer=RepeatLast(3))
    assert mine.generate(PROMPTS[0], sp)[0].token_ids == plain
    assert mine.engine.spec_stats["drafted"] > 0 and mine.engine.spec_stats["accepted"] == 0
    assert (LLM(model, tokenizer=tok, dtype="float64", proposer=RepeatLast(3)).generate(PROMPTS[0], sp)[0].token_ids
            != plain)


# ---------------------------------------------------------------- linear weight type
class Fp16Linear(nn.Module):
    """A weight type: fp16 storage, computed in the input's dtype (a drop-in where an nn.Linear was)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.register_buffer("w", linear.weight.detach().half())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x):
        return F.linear(x, self.w.to(x.dtype))


def test_a_weight_type_from_a_test_file_runs_in_the_linears(tiny):
    import copy
    model, tok = tiny
    plugged, rounded = copy.deepcopy(model), copy.deepcopy(model)
    for layer, ref in zip(plugged.layers, rounded.layers):
        for name in ("wq", "wk", "wv", "wo"):
            setattr(layer.attention, name, Fp16Linear(getattr(layer.attention, name)))
            w = getattr(ref.attention, name).weight
            w.data = w.data.half().double()                      # the same numbers as ordinary weights
    got = LLM(plugged, tokenizer=tok, dtype="float64").generate(PROMPTS, GREEDY)
    want = LLM(rounded, tokenizer=tok, dtype="float64").generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    with pytest.raises(ValueError, match=r"backend='numba' does not run a linear of type Fp16Linear at="
                                         r"'layers.0.attention.wq' yet; backends that do: torch"):
        LLM(plugged.float(), tokenizer=tok, backend="numba")


# ---------------------------------------------------------------- proposer
class RepeatLast(Proposer):
    """Drafts the newest token k times: a fourth proposer in one class, no engine file touched."""

    def __init__(self, k):
        self.k = k

    def num_slots(self, seq):
        return min(self.k, seq.params.max_tokens - len(seq.output_ids))

    def propose(self, batch):
        return [Draft([r.seq.token_ids[-1]] * r.lookahead) if r.lookahead else None for r in batch.rows]


def test_a_proposer_from_a_test_file_speculates_exactly(tiny, reference):
    model, tok = tiny
    llm = LLM(model, tokenizer=tok, dtype="float64", proposer=RepeatLast(3))
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference
    assert llm.engine.spec_stats["drafted"] > 0
