"""A simulated clock for serving lessons: what one engine step costs, as a model calibrated on this machine.

A serving replay measured with the wall clock is at the mercy of everything else the machine runs: on a busy
laptop its latency curves lose their shape. With `replay(..., step_cost=cost)` the engine still computes every
token for real, but time advances by `cost(batch)` per model call instead of by the wall clock, so the same
workload gives the same timeline on any machine, busy or not, and only the scale comes from this machine:

    seconds(step) = overhead_s + row_s * rows + token_s * tokens

(rows: sequences in the step, padding rows included; tokens: positions computed, drafts included). On a CPU
the per-call overhead and the per-row work (attention, sampling) dominate small batches; the per-token term
(the matmuls) dominates prefill. `StepCost.calibrate` measures decode steps at batch 1, 4 and 16 and prefills of
8 to 96 tokens on the wall clock and fits the three terms to their medians (about half a second); decode steps
at several batch sizes are what separate the per-step overhead from the per-row cost, which is what batching
saves. `StepCost.from_trace` fits them to any trace you have measured. The clock itself is
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
    def calibrate(cls, model, tokenizer, max_model_len: int = 256, seed: int = 0, batch_sizes=(1, 4, 16),
                  prompt_lens=(8, 32, 96), decode_context: int = 48, repeats: int = 7, **options) -> "StepCost":
        """Measure the steps the cost model must price, each kind `repeats` times on the wall clock, and fit the
        three terms to their medians: decode steps at every batch size, each row `decode_context` tokens into its
        sequence (the per-step overhead; a row's attention over its context is its per-row cost), prefills of
        every prompt length (the per-token cost). Medians, so a step that
        other work stalled does not bend the fit. About half a second for the shipped model. A fit whose terms are
        not all positive is refused (ValueError): the machine was too busy to measure. options: more
        EngineConfig options, those of the engines the cost will price (a backend's prefill and decode costs
        differ: numba computes a prompt token by token, torch in one matmul)."""
        from ..config import EngineConfig
        from ..core.sampling import SamplingParams
        from ..engine.engine import LLMEngine
        config = EngineConfig(**{"max_model_len": max_model_len, "max_num_seqs": max(batch_sizes), "seed": seed,
                                 "enable_prefix_caching": False, "trace": True, **options})
        engine = LLMEngine.from_model(model, tokenizer, config)
        vocab = model.config.vocab_size

        def run(prompts, max_tokens):
            for i, p in enumerate(prompts):
                engine.add_request([1] + [3 + (7 * i + j) % (vocab - 3) for j in range(p - 1)],
                                   SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
            while engine.has_unfinished_requests():
                engine.step()
            engine.pop_finished()
        run([8, 8], 4)                                                   # warm-up: first calls compile, allocate
        engine.trace.steps.clear()
        for n in prompt_lens:
            for _ in range(repeats):
                run([n], 1)                                              # one prefill step of n tokens
        for b in batch_sizes:
            run([decode_context] * b, repeats + 1)                       # a prefill, then `repeats` decode steps
        groups: dict = {}
        for s in engine.trace.steps:
            groups.setdefault((len(s.seq_ids), s.num_prefill_tokens + s.num_decode_tokens), []).append(s.seconds)
        return cls.fit_medians(groups, source="calibrated on this machine")

    @classmethod
    def fit_medians(cls, groups: dict, source: str = "fitted") -> "StepCost":
        """{(rows, tokens): [seconds of each such step]} -> the three terms fitted to the medians, by relative error
        (a 1 ms decode step counts as much as a 60 ms prefill). ValueError if a term is not positive."""
        rows = [(r, t, float(np.median(v))) for (r, t), v in sorted(groups.items())]
        y = np.array([m for *_, m in rows])
        x = np.array([[1.0, r, t] for r, t, _ in rows]) / y[:, None]
        coef = np.linalg.lstsq(x, np.ones(len(rows)), rcond=None)[0]
        if not (coef > 0).all():
            raise ValueError(f"the step cost fitted here has a term that is not positive (overhead "
                             f"{coef[0] * 1e3:.3f} ms, per row {coef[1] * 1e3:.3f} ms, per token {coef[2] * 1e6:.1f} "
                             "us): the machine was too busy to measure; calibrate again when it is idle")
        return cls(float(coef[0]), float(coef[1]), float(coef[2]), source=source)

    def describe(self) -> str:
        return (f"{self.overhead_s * 1e3:.2f} ms per step + {self.row_s * 1e3:.3f} ms per sequence + "
                f"{self.token_s * 1e6:.1f} us per token ({self.source})")
