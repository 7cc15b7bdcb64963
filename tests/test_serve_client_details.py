"""What an OpenAI-client user meets after the first request (issue 36), each as vLLM answers it: usage on every
answer and in every stream that asks, stop strings split across chunks, seeds reproducible across calls, LoRA
adapters served as models and listed, /health and Prometheus /metrics, request ids in answers and logs."""
import logging
import re

import pytest

from minillm import LLM, SamplingParams

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from minillm.serve.server import BackgroundServer  # noqa: E402

MODEL = "shakespeare"
ADAPTER = "comedies"                      # a shipped LoRA adapter (minillm/models/lora/)
CHAT = [{"role": "user", "content": "Who art thou?"}]


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL, enable_lora=True)


@pytest.fixture(scope="module")
def refs(llm):
    greedy = SamplingParams(temperature=0, max_tokens=40)
    plain = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=60))[0]
    tok, ids = llm.engine.tokenizer, plain.token_ids
    ends = [len(tok.decode(ids[:i], prev_token=plain.prompt_token_ids[-1])) for i in range(1, len(ids))]
    stop = plain.text[20:26]                                  # six characters from the middle of the text
    first = plain.text.index(stop)
    assert any(first < e < first + len(stop) for e in ends)   # a token boundary inside it: it arrives in pieces
    return {"stop": stop, "stopped": llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=60,
                                                                           stop=[stop, "\n\n\n"]))[0],
            "lora": llm.generate("ROMEO:", greedy, lora=ADAPTER)[0], "base": llm.generate("ROMEO:", greedy)[0]}


@pytest.fixture(scope="module")
def server(llm, refs):
    with BackgroundServer(llm, MODEL, lora_modules={"comedy": ADAPTER}) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)


def metrics(server) -> dict:
    text = httpx.get(server.url.removesuffix("/v1") + "/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^minillm:(\w+)\{[^}]*\} (\S+)$", text, re.M)}


def test_usage_on_every_answer_and_in_streams_that_ask(client):
    r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=5, temperature=0)
    c = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, temperature=0)
    assert r.usage.completion_tokens == 5 and c.usage.completion_tokens == 5 and c.usage.prompt_tokens > 5
    chunks = list(client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=5, temperature=0, n=2,
                                            seed=1, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10      # both samples counted
    assert all(ch.usage is None for ch in chunks[:-1])
    plain = list(client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=5, temperature=0, stream=True))
    assert all(ch.usage is None for ch in plain)


def test_stop_strings_split_across_chunks_end_the_stream_where_generate_ends(client, refs):
    want = refs["stopped"]
    assert want.outputs[0].finish_reason == "stop" and want.outputs[0].stop_reason == refs["stop"]
    chunks = [ch.choices[0].text for ch in client.completions.create(
        model=MODEL, prompt="ROMEO:", max_tokens=60, temperature=0, stop=[refs["stop"], "\n\n\n"], stream=True)]
    assert "".join(chunks) == want.text and refs["stop"] not in "".join(chunks) and len(chunks) > 3


def test_a_seed_reproduces_the_samples_across_calls(client):
    def sample(seed):
        return [c.text for c in client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=16, n=2,
                                                          temperature=1.0, seed=seed).choices]
    assert sample(7) == sample(7) and sample(7) != sample(8)


def test_lora_adapters_are_models_listed_and_served(client, refs):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL, "comedy"] and models[1].model_extra["parent"] == MODEL
    r = client.completions.create(model="comedy", prompt="ROMEO:", max_tokens=40, temperature=0)
    assert r.choices[0].text == refs["lora"].text != refs["base"].text and r.model == "comedy"   # as asked
    with pytest.raises(openai.NotFoundError, match="'shakespeare', 'comedy'"):
        client.completions.create(model="tragedy", prompt="ROMEO:", max_tokens=4)


def test_health_and_prometheus_metrics(server, client):
    assert httpx.get(server.url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
    before = metrics(server)
    assert {"num_requests_running", "num_requests_waiting", "kv_blocks_used", "generation_tokens_total",
            "generation_tokens_per_second"} <= set(before)
    r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=7, temperature=0,
                                  extra_body={"ignore_eos": True})
    after = metrics(server)
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == r.usage.completion_tokens == 7
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == r.usage.prompt_tokens
    assert after["generation_tokens_per_second"] > 0
    assert after["request_success_total"] == before["request_success_total"] + 1
    assert after["kv_blocks_used"] == 0 and after["num_requests_running"] == 0


def test_request_ids_in_answers_and_logs(client, caplog):
    with caplog.at_level(logging.INFO, logger="minillm.serve"):
        r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=3, temperature=0)
        c = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, temperature=0)
    assert r.id.startswith("cmpl-") and c.id.startswith("chatcmpl-")
    logged = caplog.text
    assert f"request {r.id} queued" in logged and f"request {r.id} finished: 3 tokens (length)" in logged
    assert f"request {c.id} finished" in logged
