"""Notebook 05's core exercise: check_chunked_policy runs the reader's scheduling policy in the engine and names
what differs from the engine's chunked policy."""
import pytest

from minillm.core.batch import ScheduledBatch
from minillm.core.policies import Chunked, Continuous, SchedulingPolicy
from minillm.core.sequence import Status
from minillm.labs import check_chunked_policy


class Variant(SchedulingPolicy):
    """The chunked policy; variant(rule=False) switches one rule off (each a mistake a reader makes)."""
    decodes_first = chunk = stop_at_first = wait_for_swapped = spend = True

    def schedule(self, sched):
        batch, budget = ScheduledBatch("mixed"), sched.budget

        def running():
            for decoding in (True, False):
                for seq in list(sched.running):
                    if seq.status is Status.RUNNING and (len(seq) - seq.num_computed == 1) == decoding and budget > 0 \
                            and all(r.seq is not seq for r in batch.rows):
                        yield seq

        def admit():
            nonlocal budget
            for seq in list(sched.waiting) if not (sched.swapped and self.wait_for_swapped) else []:
                if not self.stop_at_first and len(seq) > budget:
                    continue
                n = sched.admit(batch, seq, budget, chunk=self.chunk) if budget > 0 else 0
                if not n and self.stop_at_first:
                    break
                budget -= n if self.spend else 0
        if not self.decodes_first:
            admit()
        for seq in running():
            n = sched.extend(batch, seq, budget)
            budget -= n if self.spend else 0
        if self.decodes_first:
            admit()
        return batch


def mine(cls):
    """The engine's own class as a reader's subclass: checkers refuse minillm's own objects as answers."""
    return type(cls.__name__, (cls,), {})


def variant(**rules):
    return type("Variant", (Variant,), rules)


def test_the_engine_policy_passes():
    result = check_chunked_policy(mine(Chunked))
    assert result.passed and result.kind == "core", repr(result)


@pytest.mark.parametrize("policy,named", [
    (variant(chunk=False), "over the budget of 16 tokens per step"),            # whole prompts admitted
    (variant(spend=False), "over the budget"),                                   # budget never decremented
    (variant(decodes_first=False), "decodes go first"),                          # prompts before decodes
    (Continuous, "decodes go first"),                                          # the policy without chunks
    (variant(stop_at_first=False), "was waiting and fit"),                       # skips prompts longer than the budget
    (variant(wait_for_swapped=False), "wait in sched.swapped"),                  # admits while preempted ones wait
])
def test_wrong_policies_fail_and_name_the_mistake(policy, named):
    result = check_chunked_policy(mine(policy) if policy is Continuous else policy)
    assert not result.passed and named in result.message, repr(result)
    assert result.message.startswith("step "), repr(result)                     # and says where


class Raises(SchedulingPolicy):
    def schedule(self, sched):
        sched.waiting.clear()                   # leaves its engine broken: the next attempt must not see it
        raise ValueError("my bug")


class ReturnsList(SchedulingPolicy):
    def schedule(self, sched):
        return []


def test_bad_policies_fail_cleanly_and_the_next_attempt_passes():
    result = check_chunked_policy(Raises)
    assert not result.passed and "ValueError: my bug" in result.message, repr(result)
    result = check_chunked_policy(ReturnsList)
    assert not result.passed and "must return a ScheduledBatch, got list" in result.message, repr(result)
    assert check_chunked_policy(mine(Chunked)).passed
