"""`minillm serve`: the official openai client, unchanged, against the server on a free port; streamed and
non-streamed answers equal LLM.generate's; bad input is HTTP 400 (404: unknown model) in OpenAI's error shape
with SamplingParams' own messages; a client that disconnects has its request aborted and its blocks freed."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from minillm import LLM, SamplingParams
from minillm.formats.chat_template import CHAT_TEMPLATE, render_chat

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
from serve_helpers import stats, wait_idle  # noqa: E402

from minillm.serve.server import BackgroundServer  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")
MODEL = "shakespeare"
GREEDY = SamplingParams(temperature=0, max_tokens=24)
CHAT = [{"role": "user", "content": "Who art thou?"}]


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL)


@pytest.fixture(scope="module")
def refs(llm):
    """What LLM.generate says, computed before the server owns the engine."""
    chat_prompt = render_chat(CHAT, CHAT_TEMPLATE).removeprefix("<s>")
    return {"romeo": llm.generate("ROMEO:", GREEDY)[0],
            "both": llm.generate(["ROMEO:", "Good morrow"], GREEDY),
            "chat": llm.generate(chat_prompt, SamplingParams(temperature=0, max_tokens=40, stop=["\n\n"]))[0],
            "sampled": llm.generate("ROMEO:", SamplingParams(temperature=1.0, seed=11, max_tokens=12, n=2))[0],
            "logprobs": llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=6, logprobs=2))[0]}


@pytest.fixture(scope="module")
def server(llm, refs):
    with BackgroundServer(llm, MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)


# ---------------------------------------------------------------------------- the openai client, unchanged
def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completions_equal_generate(client, refs):
    r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=24, temperature=0)
    want = refs["romeo"]
    assert r.choices[0].text == want.text and r.choices[0].finish_reason == want.outputs[0].finish_reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(want.prompt_token_ids), len(want.token_ids))


def test_streamed_completions_equal_generate_token_for_token(client, refs):
    text, ids, reasons = "", [], []
    for chunk in client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=24, temperature=0, stream=True,
                                           extra_body={"return_token_ids": True}):
        text += chunk.choices[0].text
        ids += chunk.choices[0].model_extra["token_ids"]
        reasons.append(chunk.choices[0].finish_reason)
    assert (text, ids) == (refs["romeo"].text, refs["romeo"].token_ids)
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None} and len(reasons) > 3    # it really streamed


def test_several_prompts_and_samples_become_numbered_choices(client, refs):
    r = client.completions.create(model=MODEL, prompt=["ROMEO:", "Good morrow"], max_tokens=24, temperature=0)
    assert [(c.index, c.text) for c in r.choices] == [(i, o.text) for i, o in enumerate(refs["both"])]
    want = [c.text for c in refs["sampled"].outputs]                    # seeded sampling: the same two samples
    r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=12, temperature=1.0, seed=11, n=2)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == want
    got = {0: "", 1: ""}
    for chunk in client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=12, temperature=1.0, seed=11, n=2,
                                           stream=True):
        for c in chunk.choices:
            got[c.index] += c.text
    assert [got[0], got[1]] == want


def test_logprobs_are_the_engines(client, refs):
    r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=6, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    want = [next(iter(d.values())) for d in refs["logprobs"].outputs[0].logprobs]
    assert lp.token_logprobs == pytest.approx(want, abs=1e-6) and len(lp.top_logprobs) == 6
    assert "".join(lp.tokens).lstrip() == r.choices[0].text.lstrip()


def test_chat_streams_one_speech_and_equals_the_template_prompt_run_alone(client, refs):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=40)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == refs["chat"].text
    parts, usage = [], None
    for chunk in client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=40,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        usage = chunk.usage or usage
    assert "".join(parts) == refs["chat"].text and "\n\n" not in refs["chat"].text
    assert usage.completion_tokens == len(refs["chat"].token_ids)


# ---------------------------------------------------------------------------- bad input
def post(server, body, path="/v1/completions"):
    data = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(server.url.removesuffix("/v1") + path, content=data,
                      headers={"content-type": "application/json"}, timeout=30)


def error_of(r, status=400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}              # OpenAI's shape
    return err


def test_an_empty_body_says_so(server):
    assert "has no body" in error_of(post(server, ""))["message"]


def test_malformed_json_and_a_body_that_is_not_an_object(server):
    assert error_of(post(server, '{"model": "shakespeare", "prompt": '))["message"].startswith("malformed JSON body")
    assert error_of(post(server, "[1, 2]"))["message"] == "the request body must be a JSON object"


def test_an_unknown_model_is_404_model_not_found(server, client):
    err = error_of(post(server, {"model": "gpt-4", "prompt": "hi"}), 404)
    assert err["code"] == "model_not_found" and "gpt-4" in err["message"] and err["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi")


@pytest.mark.parametrize("field, value", [("temperature", -1), ("temperature", "hot"), ("top_p", 0), ("top_k", -3),
                                          ("n", 0), ("max_tokens", -1), ("seed", -5), ("stop", [""]),
                                          ("presence_penalty", 3), ("min_p", 2), ("ignore_eos", "yes")])
def test_bad_sampling_values_get_samplingparams_own_message(server, field, value):
    with pytest.raises(ValueError) as want:
        SamplingParams(**{field: value})
    err = error_of(post(server, {"model": MODEL, "prompt": "hi", field: value}))
    assert err["message"] == str(want.value) and err["param"] == field and err["type"] == "invalid_request_error"


def test_the_openai_client_raises_bad_request_with_the_message(client):
    with pytest.raises(openai.BadRequestError, match="SamplingParams.top_p must be a number in"):
        client.completions.create(model=MODEL, prompt="hi", top_p=1.5)
    with pytest.raises(openai.BadRequestError, match="SamplingParams.temperature"):
        client.chat.completions.create(model=MODEL, messages=CHAT, temperature=-0.5)


def test_a_prompt_longer_than_the_context_and_other_refusals(server):
    err = error_of(post(server, {"model": MODEL, "prompt": "to be " * 700}))
    assert "max_model_len is 1024" in err["message"] and err["param"] == "prompt"
    assert "prompt token ids must be integers in [0, 4096)" in \
        error_of(post(server, {"model": MODEL, "prompt": [1, 99999]}))["message"]
    assert error_of(post(server, {"model": MODEL, "prompt": "hi", "foo": 1}))["message"] == \
        "unsupported parameter 'foo': this server does not take it"
    assert error_of(post(server, {"model": MODEL}))["message"] == "missing required parameter 'prompt'"
    assert "role" in error_of(post(server, {"model": MODEL, "messages": [{"role": "king", "content": "x"}]},
                                   "/v1/chat/completions"))["param"]
    assert error_of(post(server, {"model": MODEL, "prompt": ["ok", "to be " * 700]}))["message"].startswith("prompt 1:")
    assert error_of(post(server, {"model": MODEL, "prompt": "x", "best_of": 3, "n": 1, "temperature": 1,
                                  "stream": True}))["param"] == "best_of"
    assert wait_idle(server)["requests"] == 0                            # nothing refused was queued


# ---------------------------------------------------------------------------- disconnects
def test_a_client_leaving_mid_stream_aborts_its_request_and_frees_its_blocks(server):
    before = stats(server)
    body = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 900, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as c, c.stream("POST", server.url + "/completions", json=body) as r:
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data:")
            if events == 3:
                break                                                    # and the connection closes
    after = wait_idle(server)
    assert after["aborted"] == before["aborted"] + 1 and after["finished"] == before["finished"]
    assert after["free_blocks"] == after["num_blocks"] and after["streams"] == 0


def test_a_client_leaving_a_non_streaming_request_aborts_it_too(server):
    before = stats(server)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/completions", json={"model": MODEL, "prompt": "ROMEO:", "max_tokens": 900,
                                                      "ignore_eos": True}, timeout=0.5)
    after = wait_idle(server)
    assert after["aborted"] == before["aborted"] + 1 and after["free_blocks"] == after["num_blocks"]


def test_json_object_and_a_too_deep_pattern_are_400_and_the_server_keeps_serving(server, client, refs):
    """response_format json_object (any JSON object) is outside guided_json's subset: refused, named. A pattern
    nested past the parser's limit is a 400 too, never an exception that stops the engine loop."""
    chat = {"model": MODEL, "messages": CHAT, "max_tokens": 8, "response_format": {"type": "json_object"}}
    assert "json_object" in error_of(post(server, chat, "/v1/chat/completions"))["message"]
    deep = {"model": MODEL, "prompt": "hi", "max_tokens": 8, "guided_regex": "(" * 300 + "a" + ")" * 300}
    assert "nested more than" in error_of(post(server, deep))["message"]
    test_completions_equal_generate(client, refs)                  # and the loop still serves


def test_a_failing_step_ends_its_requests_with_an_error_and_the_server_goes_on(server, client, llm, refs):
    runner, real = llm.engine.runner, llm.engine.runner.run
    calls = []

    def broken(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected failure")
        return real(*args)
    runner.run = broken
    try:
        with pytest.raises(openai.APIError, match="injected failure"):
            for _ in client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=20, temperature=0,
                                               stream=True):
                pass
    finally:
        runner.run = real
    assert wait_idle(server)["free_blocks"] == stats(server)["num_blocks"]
    assert client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=24, temperature=0).choices[0].text == \
        refs["romeo"].text


# ---------------------------------------------------------------------------- the command line
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_serve_command_answers_and_a_port_in_use_is_a_clear_error(refs):
    env = dict(os.environ, MINILLM_PROGRESS="0", PYTHONPATH=os.path.abspath(ROOT))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", MODEL, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.1)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        assert c.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=24, temperature=0).choices[0].text == \
            refs["romeo"].text
        taken = subprocess.run([sys.executable, "-m", "minillm", "serve", "--model", MODEL, "--port", str(port)],
                               capture_output=True, text=True, env=env, timeout=60)
        assert taken.returncode == 2
        assert f"port {port} on 127.0.0.1 is already in use" in taken.stderr and "--port" in taken.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_stopping_the_server_mid_stream_hands_back_a_clean_engine(llm, refs, server):
    body = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 900, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as c, c.stream("POST", server.url + "/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data:")
        server.stop()                                                    # while this stream is still open
    assert not llm.engine.requests and not llm.engine.has_unfinished_requests()
    assert llm.engine.block_manager.num_free == llm.engine.block_manager.num_blocks
    assert llm.generate("ROMEO:", GREEDY)[0].text == refs["romeo"].text   # LLM.generate works as before

