"""The do-nothing defaults of the engine's optional features (DESIGN.md, "One path"): null objects.

The scheduler, the model runner and the engine call these hooks on every step without asking whether the feature
is on; a feature is an object with the same methods, given to the engine's parts when they are built
(minillm.engine.parts.prepare). Nothing here changes what a step computes.

    NoEviction     the KV cache keeps every token (kv_eviction=None); minillm.kv_eviction's policies replace it
    NoAdapters     every row runs the base model (enable_lora=False); minillm.lora.adapters.LoRASlots replaces it
    NoSwap         preemption recomputes (no swap space); minillm.llama.kv_cache.SwapSpace replaces it
    VerdictStep    what acts on a step's verdicts after the acceptance rule (logprobs, jump-forward, beam search)
"""
from __future__ import annotations

import math
from contextlib import nullcontext


class NoEviction:
    """Which cached blocks leave a sequence after a step: none. The interface of an eviction policy."""
    chunk = math.inf           # tokens a row may compute at most (an evicting sequence prefills in chunks)
    window = None              # attention's visibility rule (sinks, window), or None: every cached token
    scores = False             # does the policy read the attention probabilities each cached token receives?

    def context_limit(self, max_model_len: int) -> int:
        """Tokens a sequence may reach in all (eviction keeps the cache flat, so a sequence may outgrow it)."""
        return max_model_len

    def allocate_prompt(self, block_manager, seq) -> int:
        """Blocks for a waiting sequence's prompt (all of it). -> tokens the prefix cache had."""
        return block_manager.allocate_prompt(seq)

    def admitted(self, block_manager, seq, end: int):
        """seq was just given blocks for its prompt and will compute up to `end` this step."""

    def evict(self, block_manager, seq) -> list:
        """After seq's update: free the blocks that leave. -> the block ids freed."""
        return []

    def prepare(self, attn, batch_size: int, context_lens):
        """Before the forward: set what attention needs (keys rotated on read, the window, score buffers)."""

    def observe(self, rows: list, attn, context_lens):
        """After the forward: read what attention recorded (H2O's received probabilities)."""

    def save(self, seqs: list) -> list:
        """What a failed step must put back (a step is a transaction). -> a token for restore()."""
        return []

    def restore(self, saved: list):
        pass


class NoAdapters:
    """The LoRA adapter slots: none (enable_lora=False). Every sequence runs the base weights."""
    loads = evictions = 0

    def get(self, spec):
        """A request's lora= -> its adapter: None (the base model) is all this engine serves."""
        if spec is None:
            return None
        raise ValueError(f"lora={spec!r} needs an engine made with enable_lora=True (LLM(..., enable_lora=True))")

    def admit(self, seq, sched) -> bool:
        """A slot for seq's adapter as it is admitted; False: every slot holds an adapter in use (seq waits)."""
        return True

    def use(self, rows: list, num_tokens: int):
        """A context in which the model's linears apply each row's adapter (rows: the step's Rows, T tokens each)."""
        return nullcontext()


class NoSwap:
    """No swap space (preemption_mode "recompute", or swap_bytes=0): a step never swaps a block."""

    def swap_in(self, kv, pairs: list):
        assert not pairs, "a swap-in without swap space"

    def swap_out(self, kv, pairs: list):
        assert not pairs, "a swap-out without swap space"


class VerdictStep:
    """A post-processor of the step's verdicts, run by LLMEngine.advance after the acceptance rule (verify), in
    three places (verdicts: one per row, then one per fork):
      on_verdicts    inside the step's transaction: edits the verdicts only (a failed step discards them);
      before_update  before the scheduler's update: may change what the scheduler holds (beam search finishes
                     pruned beams and queues forks), and then puts back its own state in restore();
      on_update      after the update: sees what it really appended.
    All three run inside the step's transaction: save(batch) is taken before the step, restore(saved) if it fails.
    The engine runs a post-processor only once a request `wants` it (LLMEngine.use_steps)."""

    def wants(self, request) -> bool:
        """Does this request need the post-processor? (True unless a subclass knows better)"""
        return True

    def on_verdicts(self, batch, out, verdicts: list):
        pass

    def before_update(self, batch, out, verdicts: list):
        pass

    def on_update(self, batch, verdicts: list):
        pass

    def save(self, batch):
        """Its own state a failed step must put back (the scheduler's queues and sequences are the engine's)."""

    def restore(self, saved):
        pass
