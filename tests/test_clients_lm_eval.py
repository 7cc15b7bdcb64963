"""lm-evaluation-harness against `minillm serve`, as a user runs a standard evaluation on an OpenAI-compatible
server: its own model classes (`local-completions` for loglikelihood and loglikelihood_rolling, with the remote
tokenizer it finds at /tokenize; `local-chat-completions` for generate_until), driven from Python on held-out
lines of the packaged text (no hub data). Each number equals the engine's own, computed with LLM.generate before
the server starts, within 1e-4 nats (the issue's goal; both sides are the same float32 forward, so only the order
of a batched reduction can differ: several requests run concurrently here).

Run by `make test-clients` (lm_eval is the `clients` extra, kept out of the default install: it pulls datasets,
scikit-learn and pandas); `pytest -m clients tests`.
"""
import json
import os

import pytest

from minillm import LLM, SamplingParams
from minillm.formats.chat_template import CHAT_STOP, CHAT_TEMPLATE
from minillm.paths import MODELS_DIR
from minillm.serve.app import chat_text
from minillm.serve.server import BackgroundServer

pytestmark = pytest.mark.clients      # lm_eval is imported by the tests (deselected without -m clients), and a
                                      # missing lm_eval under `make test-clients` is an error, never a skip
MODEL = "shakespeare"
LINES = [line.strip() for line in open(os.path.join(MODELS_DIR, "val_slice.txt")).read().splitlines()
         if len(line.split()) >= 6][:8]
PAIRS = [(" ".join(line.split()[:3]), " " + " ".join(line.split()[3:])) for line in LINES] + [("", LINES[0])]
CHATS = [[{"role": "user", "content": line}] for line in LINES[:3]]
UNTIL = {"until": ["\n\n"], "max_gen_toks": 30}


def engine_loglikelihood(llm, context_ids: list, continuation_ids: list) -> tuple[float, bool]:
    """The continuation's log-likelihood and whether it is the greedy one, from the engine's prompt_logprobs."""
    out = llm.generate([context_ids + continuation_ids], SamplingParams(max_tokens=1, temperature=0,
                                                                        prompt_logprobs=1))[0]
    scored = out.prompt_logprobs[len(context_ids):]                   # {token: lp, top-1: lp} per continuation token
    return sum(next(iter(d.values())) for d in scored), all(next(iter(d.values())) >= max(d.values())
                                                             for d in scored)


@pytest.fixture(scope="module")
def setup():
    llm = LLM(MODEL)
    tok = llm.engine.tokenizer
    want = {"loglikelihood": [], "rolling": [], "generate": []}
    for context, continuation in PAIRS:                 # lm_eval's split: whole minus context (or BOS as context)
        ctx = tok.encode(context, bos=False) if context else [tok.bos_id]
        whole = tok.encode(context + continuation, bos=False) if context else ctx + tok.encode(continuation, bos=False)
        want["loglikelihood"].append(engine_loglikelihood(llm, ctx, whole[len(ctx):]))
    for line in LINES:                                  # one window each: BOS, then every token scored
        want["rolling"].append(engine_loglikelihood(llm, [tok.bos_id], tok.encode(line, bos=False))[0])
    for chat in CHATS:
        params = SamplingParams(temperature=0, max_tokens=UNTIL["max_gen_toks"], stop=UNTIL["until"] + [CHAT_STOP])
        want["generate"].append(llm.generate(chat_text(chat, CHAT_TEMPLATE, tok), params)[0].text)
    with BackgroundServer(llm, MODEL) as server:
        yield server, want


def completions(server, **kw):
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    return LocalCompletionsAPI(base_url=server.url + "/completions", model=MODEL, max_length=512, max_retries=1, **kw)


def test_lm_eval_finds_the_remote_tokenizer(setup):
    server, _ = setup
    lm = completions(server)
    assert lm.tokenizer_backend == "remote" and (lm.prefix_token_id, lm.eot_token_id) == (1, 2)


@pytest.mark.parametrize("batch_size, concurrent", [(1, 1), (4, 2)])
def test_loglikelihood_equals_the_engines_prompt_logprobs(setup, batch_size, concurrent):
    server, want = setup
    from lm_eval.api.instance import Instance
    lm = completions(server, batch_size=batch_size, num_concurrent=concurrent)
    got = lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(PAIRS)],
                           disable_tqdm=True)
    assert [g for g, _ in got] == pytest.approx([w for w, _ in want["loglikelihood"]], abs=1e-4)
    assert [g for _, g in got] == [w for _, w in want["loglikelihood"]]
    assert all(g < 0 for g, _ in got)


def test_loglikelihood_rolling_equals_the_engines(setup):
    from lm_eval.api.instance import Instance
    server, want = setup
    got = completions(server).loglikelihood_rolling(
        [Instance("loglikelihood_rolling", {}, (line,), i) for i, line in enumerate(LINES)], disable_tqdm=True)
    assert got == pytest.approx(want["rolling"], abs=1e-4)


def test_generate_until_through_chat_completions_equals_the_engines(setup):
    from lm_eval.api.instance import Instance
    from lm_eval.models.api_models import JsonChatStr
    from lm_eval.models.openai_completions import LocalChatCompletion
    server, want = setup
    lm = LocalChatCompletion(base_url=server.url + "/chat/completions", model=MODEL, max_retries=1)
    requests = [Instance("generate_until", {}, (JsonChatStr(json.dumps(chat)), dict(UNTIL)), i)
                for i, chat in enumerate(CHATS)]
    got = lm.generate_until(requests, disable_tqdm=True)
    assert got == want["generate"] and all(got)
