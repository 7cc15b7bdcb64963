"""Notebook 11's checkers: the solution passes; the common mistakes fail with a message that names them; a student
class that raises or returns nonsense fails cleanly and leaves nothing behind for the next attempt."""
import math

from minillm.labs import check_goodput, check_mlfq_order
from minillm.scheduling.orders import Order


def goodput(ttfts, tpots, slo_ttft, slo_tpot, seconds):
    return sum(1 for a, b in zip(ttfts, tpots) if a <= slo_ttft and (b is None or b <= slo_tpot)) / seconds


def test_goodput_passes_and_names_the_mistakes():
    assert check_goodput(goodput)
    either = check_goodput(lambda t, p, a, b, s: sum(1 for x, y in zip(t, p) if x <= a or (y or 0) <= b) / s)
    assert not either and "EITHER target" in either.message
    count = check_goodput(lambda t, p, a, b, s: sum(1 for x, y in zip(t, p) if x <= a and (y or 0) <= b))
    assert not count and "per second" in count.message
    single = check_goodput(lambda t, p, a, b, s: sum(1 for x, y in zip(t, p)
                                                     if x <= a and y is not None and y <= b) / s)
    assert not single and "one-token requests" in single.message
    assert not check_goodput(lambda t, p, a, b, s: "fast")


class MLFQSolution(Order):
    name = "mlfq-solution"
    preemptive = True

    def __init__(self, quantum=4, levels=4):
        self.quantum, self.levels = quantum, levels

    def level(self, served):
        return min(self.levels - 1, int(math.log2(served / self.quantum + 1)))

    def key(self, seq):
        return (self.level(len(seq.output_ids)),) + self.tiebreak(seq)


def test_mlfq_solution_passes_in_the_engine():
    result = check_mlfq_order(MLFQSolution)
    assert result, repr(result)
    assert "the same sequences as the engine's MLFQ at every step" in result.message


def test_mlfq_mistakes_are_named():
    class Linear(MLFQSolution):                      # every queue gets the same quantum
        def level(self, served):
            return min(served // self.quantum, self.levels - 1)

    class WithPrompt(MLFQSolution):                  # counts the prompt as service
        def key(self, seq):
            return (self.level(len(seq)),) + self.tiebreak(seq)

    class Reversed(MLFQSolution):                    # the most served first
        def key(self, seq):
            return (-self.level(len(seq.output_ids)),) + self.tiebreak(seq)

    class NoTiebreak(MLFQSolution):
        def key(self, seq):
            return (self.level(len(seq.output_ids)),)

    class Uncapped(MLFQSolution):
        def level(self, served):
            return int(math.log2(served / self.quantum + 1))

    class StrictlyMore(MLFQSolution):                # demoted only after more than the quantum
        def level(self, served):
            level, used = 0, 0
            while level < self.levels - 1 and served > used + self.quantum * 2 ** level:
                used, level = used + self.quantum * 2 ** level, level + 1
            return level

    class NotPreemptive(MLFQSolution):
        preemptive = False

    for cls, words in [(Linear, "twice the one before"), (WithPrompt, "the prompt is not service"),
                       (Reversed, "lower level runs first"), (NoTiebreak, "self.tiebreak(seq)"),
                       (Uncapped, "only 4 queues"), (StrictlyMore, ">=, not >"), (NotPreemptive, "preemptive = True")]:
        result = check_mlfq_order(cls)
        assert not result and words in result.message, (cls.__name__, result.message)


def test_an_order_that_breaks_in_the_engine_fails_by_step():
    class LevelsFromNothing(MLFQSolution):           # passes the unit checks, ranks differently in the engine
        def key(self, seq):
            lvl = self.level(len(seq.output_ids))
            return (lvl if len(seq.output_ids) < 9 else 0,) + self.tiebreak(seq)
    result = check_mlfq_order(LevelsFromNothing)
    assert not result and result.message.startswith("step ") and "the engine's MLFQ ran" in result.message


def test_a_raising_or_nonsense_order_fails_cleanly_and_the_next_attempt_passes():
    class Raises(MLFQSolution):
        def key(self, seq):
            raise RuntimeError("oops")

    class NoneKey(MLFQSolution):
        def level(self, served):
            return None

    class NoArgs(Order):                             # cannot be built as MyMLFQ(quantum=..., levels=...)
        def __init__(self):
            pass

    for cls, words in [(Raises, "RuntimeError: oops"), (NoneKey, "not an integer"), (NoArgs, "TypeError")]:
        result = check_mlfq_order(cls)
        assert not result and words in result.message, result.message
    assert check_mlfq_order(MLFQSolution)
