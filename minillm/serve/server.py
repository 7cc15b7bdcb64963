"""Running the app: in the foreground (`python -m minillm serve`), or in a background thread (tests, notebooks).

The port is bound here, before anything else, so that a port in use is one clear error (not uvicorn's log
line after the model has loaded), and port=0 asks the OS for a free one; uvicorn is then handed the socket.
"""
from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from typing import Optional

from .app import build_app


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket on host:port (port 0: a free one), or a ValueError saying the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto is IPPROTO_TCP, and accepted
    # sockets inherit the listener's; with proto 0 every response's last segment waited for the client's delayed
    # ACK: 44 ms added to every request, /health included
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as uvicorn: a TIME_WAIT port is free
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ValueError(f"port {port} on {host} is already in use (another server?): choose another with "
                             f"--port, or stop the process that holds it") from None
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    return sock


def _server(app, log_level: str = "warning", grace_s: float = 5.0):
    """uvicorn, told to stop waiting for open streams grace_s after a shutdown begins: then their handlers are
    cancelled (which aborts their requests) and the engine loop stops."""
    import uvicorn
    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_keep_alive=30,
                                         timeout_graceful_shutdown=grace_s))


def serve(engine, model_name: str, host: str = "127.0.0.1", port: int = 8000, sock: Optional[socket.socket] = None,
          log_level: str = "info", **app_options):
    """Serve in the foreground until interrupted (Ctrl-C). engine: an LLMEngine (llm.engine); app_options:
    build_app's (lora_modules, max_logprobs, chat_template). Each request's id is logged as it is queued and ends."""
    sock = sock or bind(host, port)
    if not logging.getLogger("minillm").handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s %(message)s"))   # beside uvicorn's
        logging.getLogger("minillm").addHandler(handler)
        logging.getLogger("minillm").setLevel(log_level.upper())
    server = _server(build_app(engine, model_name, **app_options), log_level)
    print(f"minillm serving {model_name!r} at http://{host}:{sock.getsockname()[1]}/v1 (OpenAI API; Ctrl-C stops)",
          flush=True)
    server.run(sockets=[sock])


class BackgroundApp:
    """An ASGI app served on a thread of this process until stop() (or the with block's end); port 0: a free one."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 30.0, name: str = "serve"):
        self.sock = bind(host, port)
        self.host, self.port, self.app = host, self.sock.getsockname()[1], app
        self.server = _server(app, grace_s=1.0)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name=f"minillm-{name}")
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the {name} did not start on {host}:{self.port} within {timeout_s} s")
            time.sleep(0.01)

    @property
    def url(self) -> str:
        """The OpenAI client's base_url."""
        return f"http://{self.host}:{self.port}/v1"

    def stop(self):
        """Stop serving (running requests are aborted). Idempotent."""
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class BackgroundServer(BackgroundApp):
    """The server on a thread of this process: `with BackgroundServer(llm) as s: OpenAI(base_url=s.url, ...)`.
    llm: an LLM (or an LLMEngine); its engine belongs to the server until stop(), then it is the LLM's again."""

    def __init__(self, llm, model_name: Optional[str] = None, host: str = "127.0.0.1", port: int = 0,
                 timeout_s: float = 30.0, **app_options):
        self.model_name = model_name or "minillm"
        super().__init__(build_app(getattr(llm, "engine", llm), self.model_name, **app_options), host, port,
                         timeout_s, "server")
