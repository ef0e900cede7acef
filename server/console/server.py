"""Serves the console: one web page (with its script, style and the vendored
uPlot) and a websocket feed, on ``--console-port`` of the same process.

The feed (docs/console.md) sends ``hello`` on connect — the whole history, so a
browser that reconnects draws the run again — and a ``tick`` every second.
A browser sends ``control`` messages, carried out only with the control token:
the server's auth token, or, on a server without one, a token made at start
and printed with the console's address. With an auth token, the page and the
feed need it too (``?token=``).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import secrets
import socket
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from ..config import host_in_url
from .controls import ControlError, apply_control
from .state import ConsoleState, RunLog, episode_answer

PAGE = Path(__file__).resolve().parent / "page"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".png": "image/png", ".txt": "text/plain; charset=utf-8"}
#: Largest message a browser may send (controls are small).
MAX_MESSAGE_BYTES = 64 * 1024
#: Browsers watching at once; more are refused (503): the console shares the process's
#: descriptors and event loop with training.
MAX_BROWSERS = 32
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
TICK_S = 1.0
#: The saved run (the compact metrics log) is rewritten this often, and when the server stops.
SAVE_EVERY_TICKS = 10


class ConsoleServer:
    """The console's HTTP + websocket server and its once-a-second sampler."""

    def __init__(self, state: ConsoleState | None, host: str, port: int, auth_token: str | None,
                 saved_run: dict[str, Any] | None = None, save_to: Path | None = None) -> None:
        #: Live (a ConsoleState) or read-only (``saved_run``, a finished run's saved hello).
        self.state = state
        self.saved_run = saved_run
        #: A saved run's episode steps (id → agents), answered to ``episode`` requests.
        self._saved_details: dict[str, Any] = (saved_run or {}).pop("episode_details", None) or {}
        self.save_to = save_to
        self._log = RunLog(save_to) if save_to is not None else None
        self.host = host
        self.requested_port = port
        #: Needed to view (only when the server has an auth token) and, always, to control.
        self.view_token = auth_token
        self.control_token = auth_token or secrets.token_urlsafe(16)
        self._server: Server | None = None
        self._browsers: set[ServerConnection] = set()
        self._feeds = 0  # feed connections open (in handshake or watching)
        self._ticker: asyncio.Task | None = None
        self._lag_probe: asyncio.Task | None = None
        self.ticks = 0
        self._save_task: asyncio.Task | None = None
        self._names: set[str] | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return next(iter(self._server.sockets)).getsockname()[1]

    @property
    def url(self) -> str:
        """The page's address; with the control token made at start, unless the server has an auth token."""
        base = f"http://{host_in_url(self.host)}:{self.port}/"
        return base if self.view_token is not None else f"{base}?token={self.control_token}"

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._own_names)
        # compression=None: deflating every tick for every browser would cost the training loop's CPU.
        self._server = await serve(self._feed, self.host, self.requested_port, process_request=self._http,
                                   max_size=MAX_MESSAGE_BYTES, ping_interval=20, ping_timeout=20, compression=None)
        if self.state is not None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())
            self._lag_probe = asyncio.get_running_loop().create_task(self._probe_lag())

    async def stop(self) -> None:
        for task in (self._ticker, self._lag_probe):
            if task is not None:
                task.cancel()
        if self._save_task is not None:  # a periodic save still writing: it ends first (or is not written over the final one)
            await asyncio.gather(self._save_task, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await self._save()

    async def _save(self) -> None:
        """Writes console.json: the run is taken on the loop, encoded and written in a thread, so
        a large log does not hold training up; a save that ends after a later one is not
        written over it (:class:`RunLog`)."""
        if self.state is None or self._log is None:
            return
        try:
            number, run = self._log.take(self.state)
            await asyncio.get_running_loop().run_in_executor(None, self._log.write, run, number)
        except Exception as exc:  # the log must not stop training (nor the server's stop)
            print(f"[tether] writing the console log {self.save_to} failed: {exc!r:.200}", flush=True)

    # -- HTTP: the page ------------------------------------------------------------------

    def _allowed(self, query: dict[str, list[str]]) -> bool:
        if self.view_token is None:
            return True
        given = query.get("token", [""])[0]
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self.view_token.encode())

    def _same_origin(self, request: Request) -> bool:
        """Whether a browser's feed request comes from the console's own page.

        Browsers let any page open a websocket anywhere and say where the page came from
        in ``Origin``: a page of another site must not read the run (or, holding a token,
        act on it). Without ``Origin`` (not a browser) the token rules alone apply. On a
        loopback console the page's host must be a loopback name. Elsewhere it must be the
        host the request was sent to, and that host an IP address, the console's own
        --console-host or this machine's name: a name an attacker's DNS points at this
        server (DNS rebinding) is none of these.
        """
        origin = request.headers.get("Origin")
        if origin is None:
            return True
        try:
            page = urlsplit(origin)
            target = urlsplit("//" + request.headers.get("Host", ""))
            page_port = page.port or {"http": 80, "https": 443}.get(page.scheme)
            same_port = page_port == self.port and (target.port is None or target.port == self.port)
        except ValueError:  # a port that is not a number, a bracket left open ("http://[")
            return False
        if self.host in LOOPBACK_NAMES or self.host.startswith("127."):
            allowed = LOOPBACK_NAMES | {self.host}
        elif target.hostname and (_is_ip_address(target.hostname) or target.hostname in LOOPBACK_NAMES
                                  or target.hostname in self._own_names()):
            allowed = {target.hostname}
        else:
            allowed = set()
        return page.scheme in ("http", "https") and page.hostname in allowed and same_port

    def _own_names(self) -> set[str]:
        """The names this console answers to besides IP addresses (looked up once: a DNS
        lookup must not hold the event loop at every request)."""
        if self._names is None:
            names = {self.host.lower(), socket.gethostname().lower()}
            try:
                names.add(socket.getfqdn().lower())
            except OSError:
                pass
            self._names = names
        return self._names

    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        url = urlsplit(request.path)
        query = parse_qs(url.query)
        if url.path == "/feed":
            if not self._same_origin(request):
                return _response(HTTPStatus.FORBIDDEN, b"the console's feed is for the console's own page "
                                 b"(Origin must be this console's address)\n", ".txt")
            if not self._allowed(query):
                return _response(HTTPStatus.UNAUTHORIZED, b"the console needs the server's auth token: ?token=...\n",
                                 ".txt")
            if self._feeds >= MAX_BROWSERS:
                return _response(HTTPStatus.SERVICE_UNAVAILABLE,
                                 f"{self._feeds} browsers are watching, the most at once; try later\n".encode(), ".txt")
            return None  # the websocket handshake goes on
        if not self._allowed(query) and url.path in ("/", "/index.html"):
            return _response(HTTPStatus.UNAUTHORIZED, b"the console needs the server's auth token: ?token=...\n", ".txt")
        name = "index.html" if url.path in ("/", "") else url.path.lstrip("/")
        try:
            path = (PAGE / name).resolve()
            if PAGE not in path.parents or not path.is_file() or path.suffix not in CONTENT_TYPES:
                return _response(HTTPStatus.NOT_FOUND, b"not found\n", ".txt")
            return _response(HTTPStatus.OK, path.read_bytes(), path.suffix)
        except (OSError, ValueError):  # a name too long for the file system, a NUL byte
            return _response(HTTPStatus.NOT_FOUND, b"not found\n", ".txt")

    # -- the feed ------------------------------------------------------------------------

    async def _feed(self, browser: ServerConnection) -> None:
        self._feeds += 1
        try:
            hello = self.saved_run if self.state is None else self.state.hello()
            await browser.send(json.dumps(hello, allow_nan=False))
            self._browsers.add(browser)
            async for raw in browser:
                await browser.send(await self._answer(raw))
        except ConnectionClosed:
            pass
        finally:
            self._feeds -= 1
            self._browsers.discard(browser)

    async def _answer(self, raw: str | bytes) -> str:
        """The answer to one browser message: an ``episode`` request or a ``control``, encoded."""
        try:
            message = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):  # (RecursionError: nested too deep)
            return json.dumps({"type": "control_result", "ok": False, "error": "not JSON"})
        if isinstance(message, dict) and message.get("type") == "episode":
            return await self._episode(message.get("module"), message.get("id"))
        if not isinstance(message, dict) or message.get("type") != "control":
            return json.dumps({"type": "control_result", "ok": False,
                               "error": 'send {"type": "control", "token": ..., "action": ...} '
                                        'or {"type": "episode", "module": ..., "id": ...}'})
        try:
            return json.dumps(await self._control(message))
        except Exception as exc:  # a control that fails in an unforeseen way is refused, the feed goes on
            print(f"[tether] console control failed: {exc!r:.300}", flush=True)
            return json.dumps({"type": "control_result", "ok": False, "action": str(message.get("action"))[:40],
                               "error": f"the control failed: {type(exc).__name__}"})

    async def _episode(self, module: Any, episode_id: Any) -> str:
        """An episode's steps, encoded in a thread (an episode's steps are encoded when first
        asked for; the training loop goes on meanwhile)."""
        if self.state is not None:
            summary, steps = self.state.find_episode(module, episode_id)
            if steps is None:
                return episode_answer(module, episode_id, None, None)
            return await asyncio.to_thread(lambda: episode_answer(module, episode_id, summary, steps.text()))
        summaries = (self.saved_run or {}).get("episodes", {}).get(module, []) \
            if isinstance(module, str) and isinstance(episode_id, int) and not isinstance(episode_id, bool) else []
        summary = next((e for e in summaries if isinstance(e, dict) and e.get("id") == episode_id), None)
        detail = self._saved_details.get(str(episode_id)) if summary is not None else None
        if detail is None:
            return episode_answer(module, episode_id, None, None)
        try:
            encoded = await asyncio.to_thread(json.dumps, detail, allow_nan=False)
        except (ValueError, TypeError):  # a hand-edited log (NaN, which json.loads takes): not shown
            return episode_answer(module, episode_id, None, None)
        return episode_answer(module, episode_id, summary, encoded)

    async def _control(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.state is None:
            return {"type": "control_result", "ok": False, "action": str(message.get("action"))[:40],
                    "error": "this console shows a finished run (read-only)"}
        try:
            done = await apply_control(self.state, self.control_token, message)
        except ControlError as exc:
            return {"type": "control_result", "ok": False, "action": str(message.get("action"))[:40], "error": str(exc)}
        return {"type": "control_result", "ok": True, **done}

    async def _tick_forever(self) -> None:
        sent_errors = self.state.last_error_seq
        while True:
            await asyncio.sleep(TICK_S)
            try:
                values = self.state.sample()
                if self._browsers:
                    message = json.dumps(self.state.tick(values, sent_errors), allow_nan=False)
                    for browser in list(self._browsers):
                        try:
                            await asyncio.wait_for(browser.send(message), timeout=TICK_S)
                        except (ConnectionClosed, TimeoutError):
                            # A browser that cannot keep up is dropped, not waited for; its connection is
                            # cut too (a send cut short leaves it mid-message), and it may reconnect.
                            self._browsers.discard(browser)
                            if browser.transport is not None:
                                browser.transport.abort()
                sent_errors = self.state.last_error_seq
                self.ticks += 1
                if self.ticks % SAVE_EVERY_TICKS == 0 and (self._save_task is None or self._save_task.done()):
                    # Its own task (one at a time): the ticks go on while a large log is encoded and written.
                    self._save_task = asyncio.get_running_loop().create_task(self._save())
            except Exception as exc:  # the console must never stop training
                print(f"[tether] console tick failed: {exc!r:.300}", flush=True)

    async def _probe_lag(self) -> None:
        """How late the event loop runs a 100 ms timer: its lag, as the console shows it."""
        loop = asyncio.get_running_loop()
        worst = 0.0
        last_report = loop.time()
        while True:
            start = loop.time()
            await asyncio.sleep(0.1)
            worst = max(worst, (loop.time() - start - 0.1) * 1e3)
            if loop.time() - last_report >= TICK_S:
                self.state.loop_lag_ms = round(worst, 2)
                worst, last_report = 0.0, loop.time()


def _is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _response(status: HTTPStatus, body: bytes, suffix: str) -> Response:
    headers = Headers([("Content-Type", CONTENT_TYPES[suffix]), ("Content-Length", str(len(body))),
                       ("Cache-Control", "no-store"), ("Date", time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()))])
    return Response(status.value, status.phrase, headers, body)
