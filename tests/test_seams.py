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
from minillm.core.order import FCFS
from minillm.core.policies import Chunked, Continuous, SchedulingPolicy
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

    def save(self):
        return list(self.free), list(self.ref)

    def restore(self, saved):
        self.free, self.ref = deque(saved[0]), list(saved[1])

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


# ---------------------------------------------------------------- an order that serves the newest first
class NewestFirst(FCFS):
    """FCFS's admission and victim (the newest running sequence), but the running sequences get the step newest
    first. So the newest already has its row when an older one runs out of blocks and preempts it: the scheduler
    must take that row out of the step, since the blocks it would read and write are gone (no shipped order
    extends its victim before the sequence that preempts it)."""
    name = "newest-first"

    def running(self, sched):
        return sched.running[::-1]


def count_preempted_rows(engine):
    """Wrap the scheduler so that it counts the preemptions of a sequence extended earlier in the same step (whose
    row was in the batch being built) -> a dict the wrappers update."""
    sched, seen = engine.scheduler, {"with a row": 0, "all": 0}
    extended, extend, preempt, schedule = set(), sched.extend, sched.preempt, sched.schedule

    def schedule_(*args, **kwargs):
        extended.clear()
        return schedule(*args, **kwargs)

    def extend_(batch, seq, *args, **kwargs):
        n = extend(batch, seq, *args, **kwargs)
        if n:                                        # it has a row (0: it did not fit, or preempted itself)
            extended.add(seq.seq_id)
        return n

    def preempt_(seq, *args, **kwargs):
        seen["all"] += 1
        seen["with a row"] += seq.seq_id in extended
        return preempt(seq, *args, **kwargs)
    sched.schedule, sched.extend, sched.preempt = schedule_, extend_, preempt_
    return seen


def test_an_order_that_extends_the_newest_first_gives_the_sequential_output(tiny, reference):
    """A pool of 12 blocks of 4 for 4 requests that need 25 together (4 to 9 each): sequences are preempted (by
    recompute) after their own row was built, and the greedy output still equals the reference (float64, exact);
    every block comes back."""
    model, tok = tiny
    per_block = 4 * model.config.kv_bytes_per_token(8)
    llm = LLM(model, tokenizer=tok, dtype="float64", block_size=4, max_model_len=40, kv_cache_bytes=12 * per_block,
              policy=Continuous(NewestFirst()))
    seen = count_preempted_rows(llm.engine)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference
    assert seen["with a row"] > 0, seen
    bm = llm.engine.block_manager
    bm.check([])
    assert bm.num_free == bm.num_blocks


# Schedules in the fuzzer's format (prompt, max_tokens, arrival step, n, aborted; then block size, mode, prefix
# caching, pool in blocks of 16 tokens, gamma), picked from random ones for their variety: n = 2 and 3 forks with
# copy-on-write, aborts, prefix caching, n-gram speculation, block sizes 1 to 16. Without the scheduler taking a
# preempted sequence's row out of the step, each of them reads given-back blocks (in 71 of 150 random schedules).
NEWEST_FIRST_SCHEDULES = [
    ([([8, 10, 4, 12, 3, 10], 23, 1, 1, False), ([12, 8, 6, 5, 7, 3, 12, 7, 5, 3, 7], 25, 0, 2, False)],
     1, "chunked", True, 5, 0),
    ([([11, 10, 10, 11, 4, 7, 4, 11, 12, 4, 3, 12, 6, 7, 10, 12, 4, 4, 6], 6, 0, 1, False),
      ([5, 4, 10, 11, 3], 12, 3, 3, False)], 16, "chunked", True, 4, 1),
    ([([9, 3, 8, 6, 5, 5, 6, 3, 9, 9, 10, 12, 10, 10, 4, 10, 7, 3, 11, 12, 9, 10, 4], 4, 5, 1, True),
      ([5, 6, 8, 8, 8, 8, 10, 11, 10, 3, 8, 8, 11, 11, 8, 9, 6, 8], 25, 6, 3, False)], 1, "continuous", True, 4, 3),
    ([([3, 4, 8, 6, 3, 11, 6, 8, 3, 10, 7, 3, 3, 5, 5, 7, 7, 6, 7, 7], 25, 1, 3, False),
      ([9, 9, 8, 9], 13, 6, 2, False), ([3, 12, 12, 11, 12, 5, 7, 6, 4, 8, 6, 5, 5, 5], 12, 0, 1, False)],
     4, "continuous", False, 7, 3),
    ([([12, 3, 7, 6, 9, 3, 4, 7], 5, 6, 1, False), ([3, 6, 5, 8, 3, 5, 3, 11, 10, 11, 10, 7], 4, 3, 1, False),
      ([6, 5, 7, 9, 10, 3, 6, 12, 9, 5, 6, 12, 4, 3, 10, 11, 9, 5, 7, 6], 7, 4, 1, False),
      ([6, 4, 8, 5, 8, 6, 11, 12, 9, 11, 4, 6, 10, 8, 8, 7], 12, 3, 2, False)], 2, "continuous", False, 4, 1),
    ([([11, 10, 7], 11, 6, 1, False), ([7, 4, 10, 4, 10, 8, 8, 8, 9], 15, 4, 1, False),
      ([3, 11, 6, 4, 12, 6, 6, 10, 5, 7, 4], 20, 0, 3, True), ([4, 7, 10, 8, 6, 4, 4, 9, 8, 5], 18, 3, 2, False)],
     4, "chunked", True, 4, 0),
]


@pytest.mark.parametrize("reqs,block_size,mode,caching,pool_blocks16,gamma", NEWEST_FIRST_SCHEDULES)
def test_the_paging_fuzzer_under_an_order_that_extends_the_newest_first(reqs, block_size, mode, caching,
                                                                         pool_blocks16, gamma):
    """The scheduler fuzzer's run (tests/test_scheduler_fuzz.py: the hash model, whose next token hashes the K/V it
    reads back, so a row computed over given-back blocks changes the output) under NewestFirst: outputs equal the
    sequential reference and nothing leaks (preemption by recompute; swap below)."""
    policy, counts = (Chunked if mode == "chunked" else Continuous)(NewestFirst()), []
    run_schedule(reqs, block_size, mode, caching, pool_blocks16, "recompute", gamma, policy=policy,
                 inject=lambda engine, model: counts.append(count_preempted_rows(engine)))
    assert counts[0]["with a row"] > 0, counts        # the case in point happened


def test_a_sample_swapped_out_after_its_copy_on_write_was_planned_keeps_its_kv():
    """NewestFirst with preemption_mode="swap": a forked sample gets its row, with a copy-on-write copy into a new
    block; an older sequence then preempts it and it is swapped out. The copy is dropped with its row, so the
    swap-out must read the copy's source, not the unfilled new block (before the fix: 32 of 300 random schedules
    swapped stale K/V back in; this is one of them)."""
    reqs = [([9, 3, 12, 3, 9, 4, 7, 6, 8, 5, 4, 5, 8, 3, 6, 3, 3, 9, 11, 3, 5, 4, 12, 12, 6, 4, 10], 7, 6, 1, False),
            ([9, 4, 11, 5, 6, 6, 9, 9, 10, 3, 9, 6, 9, 3, 12, 7, 3, 12, 8, 8], 11, 5, 3, False),
            ([11, 4, 7, 4, 4, 7, 3, 5, 12, 5, 9, 6, 12, 8, 6, 9, 11, 11, 4, 11], 4, 5, 3, True)]
    counts = []
    run_schedule(reqs, 16, "chunked", False, 5, "swap", 0, policy=Chunked(NewestFirst()),
                 inject=lambda engine, model: counts.append(count_preempted_rows(engine)))
    assert counts[0]["with a row"] > 0, counts


# ---------------------------------------------------------------- post-processors as plug-ins
def test_post_processors_join_the_step_when_a_request_first_needs_them(tiny, reference):
    """A plain greedy batch runs no post-processor; a logprobs request switches Logprobs on (and only it), a guided
    one JumpForward, a beam request BeamStep; each stays on, and the plain requests' tokens do not change."""
    from minillm.core.logprobs import Logprobs
    from minillm.decoding.beam import BeamStep
    from minillm.guided import JumpForward
    model, tok = tiny
    llm = LLM(model, tokenizer=tok, dtype="float64")
    e = llm.engine
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference and e.post == []
    out = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2))
    assert [type(s) for s in e.post] == [Logprobs] and len(out[0].outputs[0].logprobs) == 4
    llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=4, guided_choice=["yes", "no"]))
    llm.engine.enqueue(e.make_beam_request(PROMPTS[1], 2, 4))
    while e.has_unfinished_requests():
        e.step()
    assert [type(s) for s in e.post] == [Logprobs, JumpForward, BeamStep]
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference
