"""A simulated clock for serving lessons: what one engine step costs, as a model calibrated on this machine.

A serving replay measured with the wall clock is at the mercy of everything else the machine runs: on a busy
laptop its latency curves lose their shape. With `replay(..., step_cost=cost)` the engine still computes every
token for real, but time advances by `cost(batch)` per model call instead of by the wall clock, so the same
workload gives the same timeline on any machine, busy or not, and only the scale comes from this machine:

    seconds(step) = overhead_s + row_s * rows + token_s * tokens

(rows: sequences in the step, padding rows included; tokens: positions computed, drafts included). On a CPU
the per-call overhead and the per-row work (attention, sampling) dominate small batches; the per-token term
(the matmuls) dominates prefill. `StepCost.calibrate` fits the three terms to one short wall-clock replay
(about a second); `StepCost.from_trace` fits them to any trace you have measured. The clock itself is
workload.SimClock; the replay loop that drives it is bench/replay.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepCost:
    overhead_s: float       # per model call
    row_s: float            # per sequence in the step
    token_s: float          # per position computed
    source: str = "given"   # how it was obtained (shown in lessons beside the numbers it produced)

    def seconds(self, rows: int, tokens: int) -> float:
        return self.overhead_s + self.row_s * rows + self.token_s * tokens

    def __call__(self, batch) -> float:
        """The cost of one ScheduledBatch (what the scheduler planned for one step)."""
        return self.seconds(len(batch.rows), sum(max(1, r.end - r.start) + r.lookahead for r in batch.rows))

    @classmethod
    def from_trace(cls, steps, source: str = "fitted") -> "StepCost":
        """Least-squares fit of the three terms to measured StepRecords, none negative."""
        x = np.array([[1.0, len(s.seq_ids) + s.num_padding, s.num_prefill_tokens + s.num_decode_tokens + s.num_padding]
                      for s in steps])
        y = np.array([s.seconds for s in steps])
        keep = [0, 1, 2]
        while True:                                    # drop a term that fits negative, refit the rest
            coef = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
            if (coef >= 0).all() or len(keep) == 1:
                break
            keep.pop(int(np.argmin(coef)))
        full = np.zeros(3)
        full[keep] = np.maximum(coef, 0.0)
        return cls(float(full[0]), float(full[1]), float(full[2]), source)

    @classmethod
    def calibrate(cls, model, tokenizer, max_model_len: int = 256, seed: int = 0, **options) -> "StepCost":
        """Measure one short replay on the wall clock (prompts of 4-96 tokens arriving over time, so steps of
        every size run) and fit the cost model to its steps. About a second for the shipped model. options: more
        EngineConfig options, those of the engines the cost will price (a backend's prefill and decode costs
        differ: numba computes a prompt token by token, torch in one matmul)."""
        from ..workload import make_workload
        from .replay import replay
        wl = make_workload(12, model.config.vocab_size, rate=200.0, prompt_median=24, prompt_sigma=1.0,
                           output_median=12, output_sigma=0.5, max_len=max_model_len, seed=seed)
        replay(model, tokenizer, wl[:2], max_model_len=max_model_len, **options)    # warm-up
        _, engine, _ = replay(model, tokenizer, wl, return_engine=True, max_model_len=max_model_len,
                              **{"max_num_seqs": 8, **options})
        steps = engine.trace.steps
        first = cls.from_trace(steps)
        calm = [s for s in steps if s.seconds <= 2 * first.seconds(len(s.seq_ids) + s.num_padding,
                                                                  s.num_prefill_tokens + s.num_decode_tokens)]
        return cls.from_trace(calm or steps, source="calibrated on this machine")   # without steps other work stalled

    def describe(self) -> str:
        return (f"{self.overhead_s * 1e3:.2f} ms per step + {self.row_s * 1e3:.3f} ms per sequence + "
                f"{self.token_s * 1e6:.1f} us per token ({self.source})")
