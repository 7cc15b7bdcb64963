"""AsyncEngine: the engine loop behind `minillm serve`, an asyncio task that alone owns one LLMEngine.

    HTTP handler ──Add──> a prepare thread: tokenize, validate, compile guided_*, load an adapter ──┐
    HTTP handler ──Abort / Stats──> inbox (asyncio.Queue) <── Enqueue (the built requests) ───────┘
                                      └──> the loop: apply every waiting command, engine.step() in a worker thread
    HTTP handler <──Update (deltas)──── the request group's queue <── each request's new text and tokens

Handlers never call the engine: they put a command in the inbox and read their requests' updates from their own
queue, so the engine is only ever touched between steps, by one task, and a step stays the transaction it is in
LLM.generate. The step runs in a single worker thread (always the same one: torch's and numba's thread pools stay
where the engine set them up) so that, meanwhile, the event loop accepts connections, parses requests and sends
the previous step's tokens. A request is built (LLMEngine.make_request: tokenizing, validating, compiling its
guided pattern within its budget, loading its adapter) in a small pool of prepare threads, beside the steps and off
the event loop, so that a slow build (a hostile schema) delays no stream and no /health; it builds nothing in the
engine, and the built requests join the engine through the inbox, between steps, in the order they were built. A
client that goes away cancels its handler, whose `finally` queues an Abort: the engine finishes the request with
"abort" and frees its blocks before the next step.

This is vLLM's v0 AsyncLLMEngine (a background loop over LLMEngine.step feeding a per-request AsyncStream); v1
moves the engine core into its own process behind ZeroMQ queues: the same shape, with a process boundary where
this has a thread.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Optional

from ..guided.workers import CompileWorkers
from .stream import DeltaTracker

log = logging.getLogger("minillm.serve")
PREPARE_THREADS = 4     # requests built at once (a slow guided compile holds one for up to its budget)
COMPILE_PROCESSES = 2   # guided patterns compiled at once, each in its own process (minillm.guided.workers)
CONTEXT = {"clip": "max_tokens as given: the output stops at max_model_len (the engine's own rule)",
           "fill": "max_tokens = what the context leaves after the prompt (chat without max_tokens, as vLLM)",
           "refuse": "a prompt + max_tokens the context cannot hold is refused, naming both (vLLM's server)"}


class EngineDown(RuntimeError):
    """The engine loop is not running (it was never started, or it died: AsyncEngine.health says why)."""


@dataclass
class Update:
    """What one step did for one request: a delta per sample that changed; the RequestOutput once it finished."""
    request_id: str
    deltas: list                # [minillm.serve.stream.Delta]
    finished: bool = False
    output: object = None


@dataclass
class _Add:
    prompts: list
    params: object
    request_ids: list
    priority: int
    client: object
    context: str                # max_tokens against the context (see CONTEXT)
    lora: object                # the LoRA adapter a served adapter name stands for (None: the base model)
    queue: asyncio.Queue
    accepted: asyncio.Future    # -> each prompt's token ids, or the ValueError that refused them (nothing queued)


@dataclass
class _Enqueue:
    add: _Add
    requests: list              # [minillm.core.request.Request], built by a prepare thread


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Stats:
    answer: asyncio.Future


@dataclass
class _Stream:
    queue: asyncio.Queue
    tracker: DeltaTracker


class RequestGroup:
    """The requests of one HTTP call (one per prompt), read as (prompt index, Update) in the order the engine made
    them, until all have finished. close() aborts those still running (idempotent)."""

    def __init__(self, owner: "AsyncEngine", request_ids: list, prompt_ids: list, queue: asyncio.Queue):
        self.owner, self.request_ids, self.prompt_ids, self.queue = owner, request_ids, prompt_ids, queue
        self.index = {rid: i for i, rid in enumerate(request_ids)}
        self.pending = set(request_ids)

    def __aiter__(self):
        return self

    async def __anext__(self) -> tuple[int, Update]:
        if not self.pending:
            raise StopAsyncIteration
        update = await self.queue.get()
        if update.finished:
            self.pending.discard(update.request_id)
        return self.index[update.request_id], update

    def close(self):
        for rid in sorted(self.pending):
            self.owner.inbox.put_nowait(_Abort(rid))
        self.pending.clear()


class AsyncEngine:
    def __init__(self, engine):
        self.engine = engine
        self.inbox: Optional[asyncio.Queue] = None
        self.streams: dict[str, _Stream] = {}
        self.live: set = set()                  # ids this loop queued that are still in the engine
        self.counts = {"added": 0, "finished": 0, "aborted": 0, "errors": 0, "steps": 0, "prompt_tokens": 0,
                       "generation_tokens": 0}
        self.recent: collections.deque = collections.deque()   # (time, tokens generated) per step, the last 10 s
        self._task: Optional[asyncio.Task] = None
        self.down: Optional[str] = None            # why the loop ended, if it did by itself
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minillm-step")
        self._prepare_pool = ThreadPoolExecutor(max_workers=PREPARE_THREADS, thread_name_prefix="minillm-prepare")
        self._compile_workers: Optional[CompileWorkers] = None   # guided_* patterns compile in these processes
        self._preparing: set = set()            # the prepare tasks running (kept: the loop holds tasks weakly)
        self._ids = itertools.count()

    # ------------------------------------------------------------------ lifecycle (in the server's event loop)
    async def start(self):
        self._compile_workers = CompileWorkers(COMPILE_PROCESSES).start()
        self.inbox = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="minillm engine loop")
        self._task.add_done_callback(self._ended)

    def _ended(self, task):
        """The loop task ended: by stop() (cancelled), or by a bug in the loop itself. Then every live request
        ends with an error event (none may hang) and health() says why."""
        if task.cancelled():
            return
        error = task.exception()
        self.down = f"the engine loop stopped: {type(error).__name__}: {error}" if error else "the engine loop ended"
        log.critical(self.down)
        for rid in sorted(self.live):
            self._abort(rid, error=self.down)
        while not self.inbox.empty():                      # commands nobody will apply
            cmd = self.inbox.get_nowait()
            future = cmd.add.accepted if isinstance(cmd, _Enqueue) else getattr(cmd, "answer", None)
            if future is not None and not future.done():
                future.set_exception(EngineDown(self.down))

    def health(self) -> Optional[str]:
        """None while the loop runs; else why it does not (/health answers 503 with it)."""
        if self._task is None:
            return "the engine loop has not started"
        return self.down if self._task.done() else None

    async def stop(self):
        """End the loop; the requests it queued that are still there are aborted and dropped (their blocks freed,
        their streams told), so the engine goes back to its owner as it came."""
        for task in list(self._preparing):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):       # a loop that died was reported when it did (_ended)
                pass
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)   # a step still running ends
        self._prepare_pool.shutdown(wait=False, cancel_futures=True)     # a build still running is dropped
        if self._compile_workers is not None:
            self._compile_workers.close()
        for rid in sorted(self.live):
            self._abort(rid)

    # ------------------------------------------------------------------ the handlers' side
    async def submit(self, prompts: list, params, *, request_id: Optional[str] = None, priority: int = 0,
                     client=None, context: str = "clip", lora=None) -> RequestGroup:
        """Queue one request per prompt, all validated before any is queued (the engine's ValueError if one is
        refused; "prompt i: ..." when there are several). The caller iterates the group and closes it in a
        `finally`: closing early aborts what still runs."""
        if self._task is None or self._task.done():
            raise EngineDown(self.down or "the engine loop is not running (AsyncEngine.start() first)")
        base = request_id or f"req-{next(self._ids)}"
        rids = [base] if len(prompts) == 1 else [f"{base}-{i}" for i in range(len(prompts))]
        queue, accepted = asyncio.Queue(), asyncio.get_running_loop().create_future()
        task = asyncio.get_running_loop().create_task(
            self._prepare(_Add(list(prompts), params, rids, priority, client, context, lora, queue, accepted)))
        self._preparing.add(task)
        task.add_done_callback(self._preparing.discard)
        try:
            prompt_ids = await accepted
        except asyncio.CancelledError:                   # the client left while its requests were being queued
            for rid in rids:
                self.inbox.put_nowait(_Abort(rid))
            raise
        return RequestGroup(self, rids, prompt_ids, queue)

    async def stats(self) -> dict:
        """The engine's counters (requests, queues, free blocks ...), read by the loop between steps."""
        answer = asyncio.get_running_loop().create_future()
        await self.inbox.put(_Stats(answer))
        return await answer

    # ------------------------------------------------------------------ the loop
    async def _loop(self):
        loop, engine = asyncio.get_running_loop(), self.engine
        while True:
            if not engine.has_unfinished_requests():
                self._apply(await self.inbox.get())        # idle: sleep until a command arrives
            while not self.inbox.empty():
                self._apply(self.inbox.get_nowait())
            if not engine.has_unfinished_requests():
                continue
            try:
                outputs = await loop.run_in_executor(self._pool, engine.step)
            except asyncio.CancelledError:                 # stop(): the loop ends
                raise
            except BaseException as e:                     # noqa: BLE001 - SystemExit, KeyboardInterrupt from code
                log.exception("engine step failed")        # in the step too: the step rolled back; ITS requests end
                                                           # with an error, their blocks freed; the others go on
                step = getattr(e, "request_ids", None)     # (a request's own error never gets here: see verify)
                for rid in [r for r in self.live if step is None or r in step]:
                    self._abort(rid, error=f"engine step failed: {type(e).__name__}: {e}")
                continue
            self.counts["steps"] += 1
            before = self.counts["generation_tokens"]
            for out in outputs:
                self._publish(out)
            for out in engine.pop_finished():              # finished in this step
                self._publish(out)
                self.live.discard(out.request_id)
            self._count_rate(self.counts["generation_tokens"] - before)
            if not outputs:
                await asyncio.sleep(0.001)                 # nothing ran (e.g. a batching window): do not spin

    def _count_rate(self, tokens: int, window_s: float = 10.0):
        now = time.monotonic()
        self.recent.append((now, tokens))
        while self.recent and self.recent[0][0] < now - window_s:
            self.recent.popleft()

    def tokens_per_s(self, window_s: float = 10.0) -> float:
        """Tokens generated per second over the last window_s seconds (0 when idle that long)."""
        now = time.monotonic()
        return sum(n for t, n in self.recent if t >= now - window_s) / window_s

    def _apply(self, cmd):
        engine = self.engine
        if isinstance(cmd, _Enqueue):
            add, requests = cmd.add, cmd.requests
            if add.accepted.done():                        # the client left while they were built: nothing to free
                return
            taken = [r.request_id for r in requests if r.request_id in engine.requests]
            if taken:                                      # another request took the id while this one was built
                add.accepted.set_exception(ValueError(f"request_id {taken[0]!r} is already in use"))
                return
            for r in requests:
                engine.enqueue(r)
                self.live.add(r.request_id)
                self.streams[r.request_id] = _Stream(add.queue, DeltaTracker(r.params.stop))
                self.counts["added"] += 1
                self.counts["prompt_tokens"] += len(r.prompt_ids)
                log.info("request %s queued: %d prompt tokens", r.request_id, len(r.prompt_ids))
            add.accepted.set_result([list(r.prompt_ids) for r in requests])
        elif isinstance(cmd, _Abort):
            self._abort(cmd.request_id)
        elif isinstance(cmd, _Stats):
            bm, sched = engine.block_manager, engine.scheduler
            cmd.answer.set_result({**self.counts, "requests": len(engine.requests), "running": len(sched.running),
                                   "waiting": len(sched.waiting), "swapped": len(sched.swapped),
                                   "num_blocks": bm.num_blocks, "free_blocks": bm.num_free,
                                   "streams": len(self.streams), "tokens_per_s": self.tokens_per_s()})

    async def _prepare(self, cmd: _Add):
        """Build cmd's requests in a prepare thread (every prompt validated first), then hand them to the loop; a
        refusal (ValueError) or a bug (anything else, BaseException included: it must not reach the event loop)
        fails this call alone."""
        try:
            requests = await asyncio.get_running_loop().run_in_executor(
                self._prepare_pool, lambda: [self._make(cmd, i) for i in range(len(cmd.prompts))])
        except asyncio.CancelledError:                     # stop(): the server is going down
            if not cmd.accepted.done():
                cmd.accepted.set_exception(EngineDown("the server is stopping"))
            raise
        except ValueError as e:
            self._refuse(cmd, e)
            return
        except BaseException as e:                         # noqa: BLE001 - a bug, not the user's mistake
            log.error("building a request failed", exc_info=e)
            self._refuse(cmd, RuntimeError(f"{type(e).__name__}: {e}"))
            return
        if self.health() is not None:                      # the loop died meanwhile: nobody would enqueue them
            self._refuse(cmd, EngineDown(self.health()))
        elif not cmd.accepted.done():                      # (done: the client left meanwhile)
            self.inbox.put_nowait(_Enqueue(cmd, requests))

    @staticmethod
    def _refuse(cmd: _Add, error: BaseException):
        if not cmd.accepted.done():
            cmd.accepted.set_exception(error)

    def _make(self, cmd: _Add, i: int):
        engine, prompt, params = self.engine, cmd.prompts[i], cmd.params
        try:
            if cmd.context != "clip":
                ids, limit = engine.validate(prompt), engine.config.max_model_len
                if cmd.context == "fill":
                    params = replace(params, max_tokens=max(1, limit - len(ids)))
                elif len(ids) + params.max_tokens > limit:
                    raise ValueError(f"SamplingParams.max_tokens={params.max_tokens}: with the prompt's {len(ids)} "
                                     f"tokens that passes this model's context of max_model_len={limit} tokens: "
                                     f"ask for at most {max(0, limit - len(ids))}")
            return engine.make_request(prompt, params, cmd.request_ids[i], priority=cmd.priority, client=cmd.client,
                                       lora=cmd.lora, compile_workers=self._compile_workers)
        except ValueError as e:
            raise ValueError(f"prompt {i}: {e}" if len(cmd.prompts) > 1 else str(e)) from None

    def _abort(self, rid: str, error: Optional[str] = None):
        """End a request now: its blocks freed, its stream (if anyone still reads it) told why."""
        engine = self.engine
        stream = self.streams.pop(rid, None)
        self.live.discard(rid)
        if rid not in engine.requests:
            return
        if not engine.requests[rid].finished:
            engine.abort(rid)
            self.counts["aborted"] += 1
            log.info("request %s aborted%s", rid, f": {error}" if error else "")
        out = engine.requests.pop(rid).output()
        if stream is not None:
            deltas = stream.tracker.deltas(out)
            for d in deltas:
                d.finish_reason, d.error = ("error", error) if error else (d.finish_reason, d.error)
            stream.queue.put_nowait(Update(rid, deltas, True, out))

    def _publish(self, out):
        stream = self.streams.get(out.request_id)
        if stream is None:
            return
        deltas = stream.tracker.deltas(out)
        self.counts["generation_tokens"] += sum(len(d.token_ids) for d in deltas)
        if out.finished:
            del self.streams[out.request_id]
            self.counts["finished"] += 1
            self.counts["errors"] += any(c.finish_reason == "error" for c in out.outputs)
            log.info("request %s finished: %s", out.request_id, ", ".join(
                f"{len(c.token_ids)} tokens ({c.finish_reason}{': ' + c.error if c.error else ''})"
                for c in out.outputs))
        if deltas or out.finished:
            stream.queue.put_nowait(Update(out.request_id, deltas, out.finished, out if out.finished else None))
