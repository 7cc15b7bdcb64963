"""A replica: one LLMEngine on its own simulated clock, priced by the step cost model.

Several engines serving at once are several machines (or GPUs) working in parallel, so each gets its own clock:
a step moves only its own engine's time, by the cost model's price for that step (minillm.bench.step_cost), while
the tokens are still computed for real. minillm.cluster.sim interleaves the replicas' steps in time order, so
that what one replica sees (a request routed to it, a KV handover) arrives at the time it was sent.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..config import EngineConfig
from ..core.sampling import SamplingParams
from ..engine.engine import LLMEngine
from ..workload import SimClock

STALL_S = 1e-3      # a busy replica whose step ran no model call (a batching window) waits this long, or to the
                    # next event


def trace_params(max_tokens: int) -> SamplingParams:
    """A trace request's parameters: greedy, exactly max_tokens (ignore_eos), as every serving bench here."""
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


class SimReplica:
    """engine: an LLMEngine whose clock is `clock` (a SimClock); step_cost: batch -> seconds."""

    def __init__(self, engine: LLMEngine, clock: SimClock, step_cost: Callable, name: str = ""):
        self.engine, self.clock, self.step_cost, self.name = engine, clock, step_cost, name
        self.busy_s = 0.0                           # modelled seconds spent in model calls
        self.prepare: Optional[Callable] = None     # called before each step (a decode engine takes in handovers)
        run = engine.runner.run

        def run_and_advance(batch, drafts):         # the model call takes the modelled time, not the wall's
            out = run(batch, drafts)
            seconds = step_cost(batch)
            clock.advance(seconds)
            self.busy_s += seconds
            return out
        engine.runner.run = run_and_advance

    @classmethod
    def build(cls, model, tokenizer, step_cost: Callable, name: str = "", **options) -> "SimReplica":
        """A fresh engine with these EngineConfig options on a new SimClock at 0."""
        clock = SimClock()
        return cls(LLMEngine.from_model(model, tokenizer, EngineConfig(**options), clock=clock), clock, step_cost,
                   name)

    def now(self) -> float:
        return self.clock()

    @property
    def busy(self) -> bool:
        return self.engine.has_unfinished_requests()

    def wake(self, t: float):
        """Something arrives at time t: an idle replica's clock catches up (a busy one is mid-step: it waits)."""
        if not self.busy:
            self.clock.skip_to(t)

    def add(self, prompt_ids: list, max_tokens: int, request_id: str, arrival: float):
        """A trace request (trace_params) arriving at `arrival`."""
        self.wake(arrival)
        self.engine.add_request(prompt_ids, trace_params(max_tokens), request_id=request_id, arrival_time=arrival)

    def step(self, horizon: Optional[float] = None) -> list:
        """One engine step -> the RequestOutputs that finished in it. A step that ran no model call (nothing could
        be scheduled yet) moves the clock to the horizon (the next event) or by STALL_S."""
        if self.prepare is not None:
            self.prepare()
        before = self.engine.trace.count
        if self.engine.has_unfinished_requests():
            self.engine.step()
        if self.engine.trace.count == before:
            now = self.now()
            self.clock.skip_to(horizon if horizon is not None and horizon > now else now + STALL_S)
        return self.engine.pop_finished()
