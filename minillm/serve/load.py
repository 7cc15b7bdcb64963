"""Many concurrent streaming clients against a server, each stream kept and checked; TTFT and throughput measured.

    python -m minillm.serve.load --model shakespeare --clients 200 --max-tokens 16

starts a BackgroundServer on a free port (or uses --url's server), runs each prompt ALONE first (LLM.generate,
greedy: the reference), then opens every client at once with the official `openai` client (AsyncOpenAI,
stream=True, vLLM's return_token_ids so token ids are compared, not only text), and reports: wrong streams (text
or token ids differing from the reference: a lost, duplicated or mixed-up token), blocks still held once all are
done, time to first token (request sent -> first token received) and output tokens per second over the whole run.
Greedy equality needs a batch-invariant backend: numba (the default on a CPU) sums in a fixed order, so a
sequence's logits do not depend on what shares its batch. With the server on a thread of this process, clients
and server share one interpreter (and its GIL): --url measures a separate `python -m minillm serve` instead.
"""
from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from typing import Optional

LEAVER_TOKENS = 400     # what a client that will leave asks for: only an abort can end it after 2 chunks


@dataclass
class StreamRecord:
    prompt_index: int
    text: str = ""
    token_ids: list = field(default_factory=list)
    finish_reason: Optional[str] = None
    ttft_s: Optional[float] = None
    total_s: float = 0.0
    disconnected: bool = False
    error: Optional[str] = None     # the error event that ended the stream (finish_reason "error")


@dataclass
class LoadResult:
    records: list
    wall_s: float

    def summary(self) -> dict:
        done = [r for r in self.records if not r.disconnected]
        ttft = sorted(r.ttft_s for r in done if r.ttft_s is not None)
        tokens = sum(len(r.token_ids) for r in self.records)
        pick = (lambda q: ttft[min(len(ttft) - 1, int(q * len(ttft)))] * 1e3) if ttft else (lambda q: None)
        return {"clients": len(self.records), "completed": len(done), "disconnected": len(self.records) - len(done),
                "output_tokens": tokens, "wall_s": round(self.wall_s, 3),
                "output_tokens_per_s": round(tokens / self.wall_s, 1) if self.wall_s else None,
                "ttft_median_ms": round(statistics.median(ttft) * 1e3, 1) if ttft else None,
                "ttft_p90_ms": round(pick(0.9), 1) if ttft else None, "ttft_max_ms": round(ttft[-1] * 1e3, 1)
                if ttft else None}

    def wrong(self, references: list, failing=()) -> list:
        """Indices of completed streams whose text or token ids differ from references[i] (text, token ids), of
        disconnected ones whose partial stream is not a prefix of the reference, and of streams that ended with an
        error but are not among `failing` (or are, and did not)."""
        bad = []
        for r in self.records:
            if (r.error is not None) != (r.prompt_index in failing):
                bad.append(r.prompt_index)
                continue
            if r.error is not None:
                continue
            text, ids = references[r.prompt_index]
            if r.disconnected:
                ok = text.startswith(r.text) and ids[:len(r.token_ids)] == r.token_ids
            else:
                ok = r.text == text and r.token_ids == ids
            if not ok:
                bad.append(r.prompt_index)
        return bad


async def one_stream(client, model: str, i: int, prompt: str, max_tokens: int, disconnect_after: Optional[int],
                     extra: Optional[dict] = None):
    """One streaming completion; disconnect_after=k closes the connection after k chunks (of an answer asked to
    be LEAVER_TOKENS long, so that only an abort can end it early); extra: more request fields. A stream that
    ends with an error event is recorded with its message."""
    from openai import APIError
    rec, t0 = StreamRecord(i), time.perf_counter()
    if disconnect_after is not None:
        max_tokens = max(max_tokens, LEAVER_TOKENS)
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, extra_body={"return_token_ids": True, "ignore_eos": True,
                                                                      **(extra or {})})
    chunks = 0
    try:
        async for chunk in stream:
            c = chunk.choices[0]
            ids = (c.model_extra or {}).get("token_ids") or []
            if ids and rec.ttft_s is None:
                rec.ttft_s = time.perf_counter() - t0
            rec.text += c.text
            rec.token_ids += ids
            rec.finish_reason = c.finish_reason or rec.finish_reason
            chunks += 1
            if disconnect_after is not None and chunks >= disconnect_after:
                rec.disconnected = True
                break
    except APIError as e:
        rec.finish_reason, rec.error = "error", str(e)
    finally:
        await stream.close()
    rec.total_s = time.perf_counter() - t0
    return rec


async def run_load(url: str, model: str, prompts: list, max_tokens: int, disconnect: Optional[dict] = None,
                   timeout_s: float = 600.0, extra: Optional[dict] = None) -> LoadResult:
    """Every prompt as its own streaming client, all at once. disconnect: {prompt index: chunks before closing};
    extra: {prompt index: more request fields}."""
    from openai import AsyncOpenAI
    disconnect, extra = disconnect or {}, extra or {}
    async with AsyncOpenAI(base_url=url, api_key="none", timeout=timeout_s, max_retries=0) as client:
        t0 = time.perf_counter()
        records = await asyncio.gather(*(one_stream(client, model, i, p, max_tokens, disconnect.get(i), extra.get(i))
                                         for i, p in enumerate(prompts)))
        return LoadResult(list(records), time.perf_counter() - t0)


def sample_prompts(n: int) -> list:
    """n distinct prompts: the packaged held-out slice's lines (cut at 60 characters), numbered when it runs out."""
    import os

    from ..paths import MODELS_DIR
    lines = [ln[:60] for ln in open(os.path.join(MODELS_DIR, "val_slice.txt"), encoding="utf-8").read().splitlines()
             if ln.strip()]
    lines = list(dict.fromkeys(lines))
    return [lines[i % len(lines)] + ("" if i < len(lines) else f" {i}") for i in range(n)]


def references(llm, prompts: list, max_tokens: int) -> list:
    """Each prompt run alone (a batch of one), greedy: (text, token ids)."""
    from ..core.sampling import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [(o.text, list(o.token_ids)) for o in (llm.generate(p, params)[0] for p in prompts)]


def main(argv=None) -> int:
    import argparse
    import contextlib
    import json

    import httpx

    from ..engine.llm import LLM
    from .server import BackgroundServer
    ap = argparse.ArgumentParser(prog="python -m minillm.serve.load")
    ap.add_argument("--model", default="shakespeare")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--disconnect-every", type=int, default=0, help="every k-th client leaves after 2 chunks")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--url", default=None, help="a server already running (python -m minillm serve), e.g. "
                    "http://127.0.0.1:8000/v1; default: one on a thread of this process")
    a = ap.parse_args(argv)
    prompts = sample_prompts(a.clients)
    llm = LLM(a.model, max_num_seqs=a.max_num_seqs)
    refs = references(llm, prompts, a.max_tokens)
    leave = {i: 2 for i in range(0, a.clients, a.disconnect_every)} if a.disconnect_every else {}
    with contextlib.ExitStack() as stack:
        url = a.url or stack.enter_context(BackgroundServer(llm, a.model)).url
        result = asyncio.run(run_load(url, a.model, prompts, a.max_tokens, leave))
        for _ in range(100):                       # aborts are applied by the loop: wait until it is idle
            stats = httpx.get(url.removesuffix("/v1") + "/stats").json()
            if stats["requests"] == 0:
                break
            time.sleep(0.05)
    report = {**result.summary(), "wrong_streams": len(result.wrong(refs)),
              "leaked_blocks": stats["num_blocks"] - stats["free_blocks"], "requests_left": stats["requests"],
              "aborted": stats["aborted"],
              "backend": llm.engine.backend}
    print(json.dumps(report, indent=1))
    return 0 if report["wrong_streams"] == 0 and report["leaked_blocks"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
