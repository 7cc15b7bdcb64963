"""minillm.serve: an OpenAI-compatible HTTP server (FastAPI + uvicorn) on an asyncio engine loop, and streaming.

    python -m minillm serve --model shakespeare --port 8000 [engine options]
    OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none").completions.create(model="shakespeare", ...)

stream.py        deltas of text and token ids as the engine makes them; stream(engine, prompt, params)
async_engine.py  the engine loop: one asyncio task owns the LLMEngine, handlers reach it through a queue
protocol.py      OpenAI's request and response objects, its error shape
app.py           the routes: /v1/completions, /v1/chat/completions, /v1/models (+ /health, /stats)
server.py        run it: in the foreground, or in a background thread (BackgroundServer)
load.py          many concurrent streaming clients: every stream checked, TTFT and throughput measured

fastapi, uvicorn (and openai, for load.py and the tests) are the optional extra "serve": `pip install -e .[serve]`.
"""
from .stream import Delta, DeltaTracker, stream

__all__ = ["Delta", "DeltaTracker", "stream"]
