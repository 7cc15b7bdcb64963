"""echo, max_tokens=0, prompt_logprobs and vLLM's tokenizer endpoints on the server (how evaluation harnesses score
text), checked against the engine's own prompt_logprobs (LLM.generate) within 1e-5: the same engine and weights
compute both, in float32, so only the order of a batched reduction could differ."""
import os

import pytest

from minillm import LLM, SamplingParams
from minillm.paths import MODELS_DIR

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from minillm.formats.chat_template import CHAT_STOP, CHAT_TEMPLATE  # noqa: E402
from minillm.serve.app import chat_text  # noqa: E402
from minillm.serve.server import BackgroundServer  # noqa: E402

MODEL = "shakespeare"
CHAT = [{"role": "user", "content": "hi"}]
LINES = [line for line in open(os.path.join(MODELS_DIR, "val_slice.txt")).read().splitlines() if len(line) > 20][:3]


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL)


@pytest.fixture(scope="module")
def tok(llm):
    return llm.engine.tokenizer


@pytest.fixture(scope="module")
def refs(llm, tok):
    ids = [tok.encode(line, bos=False) for line in LINES]
    scored = llm.generate(ids, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=3))
    generated = llm.generate(LINES[0], SamplingParams(max_tokens=5, temperature=0, logprobs=1, prompt_logprobs=1))[0]
    chat = llm.generate(chat_text(CHAT, CHAT_TEMPLATE, tok), SamplingParams(max_tokens=4, temperature=0, logprobs=2,
                                                                          stop=[CHAT_STOP]))[0]
    return {"ids": ids, "scored": scored, "generated": generated, "chat": chat}


@pytest.fixture(scope="module")
def server(llm, refs):                       # the references first: then the server owns the engine
    with BackgroundServer(llm, MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=60)


def chosen(entries) -> list:
    """The prompt token's own logprob per position (None first)."""
    return [None if d is None else next(iter(d.values())) for d in entries]


def test_echo_with_max_tokens_0_scores_the_prompt_as_prompt_logprobs_do(client, refs, tok):
    r = client.completions.create(model=MODEL, prompt=refs["ids"], echo=True, logprobs=1, max_tokens=0,
                                  temperature=0)
    assert len(r.choices) == len(LINES) and r.usage.completion_tokens == 0
    for c, ids, want in zip(sorted(r.choices, key=lambda c: c.index), refs["ids"], refs["scored"]):
        lp = c.logprobs
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None      # nothing predicts the first token
        assert lp.token_logprobs[1:] == pytest.approx(chosen(want.prompt_logprobs)[1:], abs=1e-5)
        assert len(lp.tokens) == len(ids) and c.finish_reason == "length"
        assert c.text == tok.decode(ids) and all(len(t) <= 2 for t in lp.top_logprobs[1:])   # the token, top 1
        best = [max(d.values()) for d in want.prompt_logprobs[1:]]
        assert [max(t.values()) for t in lp.top_logprobs[1:]] == pytest.approx(best, abs=1e-5)


def test_echo_with_generation_puts_the_prompt_before_the_completion(client, refs):
    want = refs["generated"]
    r = client.completions.create(model=MODEL, prompt=LINES[0], echo=True, logprobs=1, max_tokens=5, temperature=0,
                                  extra_body={"return_token_ids": True})
    c = r.choices[0]
    assert c.text == LINES[0] + want.text and c.model_extra["token_ids"] == want.prompt_token_ids + want.token_ids
    lp = c.logprobs.token_logprobs
    assert lp[0] is None and lp[1:] == pytest.approx(chosen(want.prompt_logprobs)[1:] +
                                                     chosen(want.outputs[0].logprobs), abs=1e-5)
    assert r.usage.completion_tokens == 5 and c.logprobs.tokens[0] == "<s>"
    offsets = c.logprobs.text_offset
    assert offsets == sorted(offsets) and offsets[0] == 0
    plain = client.completions.create(model=MODEL, prompt=LINES[0], echo=True, max_tokens=5, temperature=0)
    assert plain.choices[0].text == c.text and plain.choices[0].logprobs is None


def test_prompt_logprobs_is_vllms_field_with_ranks(server, refs, tok):
    body = {"model": MODEL, "prompt": refs["ids"][0], "max_tokens": 1, "temperature": 0, "prompt_logprobs": 3}
    c = httpx.post(server.url + "/completions", json=body, timeout=30).json()["choices"][0]
    got, want = c["prompt_logprobs"], refs["scored"][0].prompt_logprobs
    assert got[0] is None and len(got) == len(want)
    for g, w in zip(got[1:], want[1:]):
        assert {int(t): e["logprob"] for t, e in g.items()} == pytest.approx(w, abs=1e-5)
        ranks = sorted(e["rank"] for e in g.values() if e["rank"] is not None)
        assert ranks == [1, 2, 3] and all(e["decoded_token"] == tok.pieces[int(t)].decode(errors="replace")
                                          for t, e in g.items())
    assert c["text"] and c["logprobs"] is None                          # no echo: the completion as before


def test_tokenize_and_detokenize_are_the_engines_tokenizer(server, tok):
    base = server.url.removesuffix("/v1")
    for text in LINES:
        got = httpx.post(base + "/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
        assert got["tokens"] == tok.encode(text, bos=False) and got["count"] == len(got["tokens"])
        assert httpx.post(base + "/tokenize", json={"prompt": text}).json()["tokens"] == tok.encode(text)
        assert httpx.post(base + "/detokenize", json={"tokens": got["tokens"]}).json()["prompt"] == text
    info = httpx.get(base + "/tokenizer_info").json()
    ids = [httpx.post(base + "/tokenize", json={"prompt": info[k], "add_special_tokens": False}).json()["tokens"]
           for k in ("bos_token", "eos_token")]
    assert ids == [[tok.bos_id], [tok.eos_id]] and info["model_max_length"] == 1024
    chat = httpx.post(base + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > 3
    err = httpx.post(base + "/detokenize", json={"tokens": [1, 99999]}).json()["error"]
    assert err["param"] == "tokens" and "[0, 4096)" in err["message"]


def test_chat_top_logprobs_are_the_engines(client, refs):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=2)
    want = refs["chat"].outputs[0].logprobs                              # per token {id: logprob}, the token's first
    content = r.choices[0].logprobs.content
    assert [e.logprob for e in content] == pytest.approx(chosen(want), abs=1e-5)
    assert [t.logprob for e in content for t in e.top_logprobs] == \
        pytest.approx([x for d in want for x in sorted(d.values(), reverse=True)[:2]], abs=1e-5)


@pytest.mark.parametrize("body, param, words", [
    ({"echo": True, "stream": True}, "echo", "cannot stream"),
    ({"max_tokens": 0}, "max_tokens", "needs echo=true"),
    ({"logprobs": 21}, "logprobs", "limit of 20"),
    ({"echo": True, "prompt_logprobs": 50}, "prompt_logprobs", "limit of 20"),
    ({"suffix": "x"}, "suffix", "not supported"),
])
def test_echo_refusals_are_400s_naming_the_field(server, body, param, words):
    r = httpx.post(server.url + "/completions", json={"model": MODEL, "prompt": "hi", **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param and words in err["message"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 30}
    assert httpx.post(server.url + "/chat/completions", json=chat).json()["error"]["param"] == "top_logprobs"
