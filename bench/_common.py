"""Helpers shared by the benchmark scripts: free ports, waiting for a server,
and process cleanup that runs however the benchmark ends."""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
# Benchmarks import the project's own test helpers (tests.conformance, examples) from the checkout.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def _require_the_install() -> None:
    """Every benchmark runs Tether from the project's virtual environment: without it, one line
    says how to get it (not an ImportError traceback)."""
    import importlib.util

    missing = [m for m in ("tether", "numpy", "onnxruntime", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"{Path(sys.argv[0]).name}: {', '.join(missing)} not importable with {sys.executable}: run "
              f"`bash scripts/install.sh`, then run the benchmark with .venv/bin/python", file=sys.stderr, flush=True)
        sys.exit(2)


_require_the_install()

_children: list[subprocess.Popen] = []


def log(*parts: object) -> None:
    """Progress goes to stderr; stdout is reserved for the one JSON result."""
    print("[bench]", *parts, file=sys.stderr, flush=True)


def ensure_installed(script: str, tools: list[str] = (), modules: list[str] = (), what: str = "this benchmark",
                     skip_flag: str | None = None, files: list[str] = ()) -> None:
    """Install what ``what`` needs through the project's own ``script``, then check ``tools``
    (executables), ``modules`` (Python) and ``files`` (paths under the repository); if anything is
    still missing, exit with one line naming the script to run (and ``skip_flag``, if any). A
    toolchain script always runs (it installs more than the tools it is checked by, and does nothing
    when all is there); for Python modules or files alone it runs only when one is missing (the
    project's install takes seconds even when it has nothing to do)."""
    import importlib
    import importlib.util
    import shutil

    def missing_now() -> list[str]:
        importlib.invalidate_caches()
        return ([t for t in tools if shutil.which(t) is None]
                + [m for m in modules if importlib.util.find_spec(m) is None]
                + [f for f in files if not (REPO_ROOT / f).exists()])

    missing = missing_now()
    if (missing or tools) and script.endswith(".sh"):
        subprocess.run(["bash", str(REPO_ROOT / script)], cwd=str(REPO_ROOT), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
        missing = missing_now()
    if missing:
        skip = f", or pass {skip_flag} to leave them out" if skip_flag else ""
        print(f"{Path(sys.argv[0]).name}: {what} need(s) {', '.join(missing)}: run `bash {script}` "
              f"(it installs them){skip}", file=sys.stderr, flush=True)
        sys.exit(2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """Environment for child processes: the repository importable, output unbuffered."""
    path = str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")


def spawn(cmd: list[str], **kw: object) -> subprocess.Popen:
    """Start a child in its own process group (so its own children die with it)
    and remember it for cleanup. It stays in this session: a new session would be a scheduling
    autogroup of its own, with its own share of the CPU beside everything else on the machine."""
    kw.setdefault("env", child_env())
    kw.setdefault("cwd", str(REPO_ROOT))
    proc = subprocess.Popen(cmd, process_group=0, **kw)  # type: ignore[call-overload]
    _children.append(proc)
    return proc


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen, grace_s: float = 5.0) -> int | None:
    """SIGTERM the child's process group, then SIGKILL after ``grace_s``."""
    if proc.poll() is None:
        _kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
    else:
        # The leader exited; make sure nothing it started lingers.
        _kill_group(proc, signal.SIGKILL)
    return proc.returncode


def stop_all() -> None:
    while _children:
        proc = _children.pop()
        stop(proc, grace_s=2.0)


def _on_signal(signum: int, _frame: object) -> None:
    stop_all()
    sys.exit(128 + signum)


def install_cleanup() -> None:
    """Children are stopped at exit, on SIGTERM/SIGINT/SIGHUP, and on exceptions."""
    atexit.register(stop_all)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)


def _host_busy_s() -> float | None:
    """CPU seconds all cores spent busy since boot (Linux /proc/stat), or None."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


class HostLoad:
    """How busy the host was during a benchmark apart from the benchmark itself.

    ``other_cores`` = (all cores' busy time - this process's and its reaped
    children's CPU time) / wall time: about 0 on a quiet machine, about 1 when
    another process kept one core busy. Call ``stop`` after the children were
    waited for, so their CPU time is counted as ours.
    """

    def __init__(self) -> None:
        self._t = time.monotonic()
        self._host = _host_busy_s()
        self._own = self._own_cpu()

    @staticmethod
    def _own_cpu() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def stop(self, extra_own_cpu_s: float = 0.0) -> dict[str, float | int | None]:
        wall = time.monotonic() - self._t
        host = _host_busy_s()
        own = self._own_cpu() - self._own + extra_own_cpu_s
        other = None if host is None or self._host is None else max(0.0, (host - self._host - own) / wall)
        return {
            "cpu_count": os.cpu_count(),
            "own_cpu_cores": round(own / wall, 2),
            "other_load_cores": None if other is None else round(other, 2),
        }


def wait_until_quiet(max_wait_s: float, threshold_cores: float = 0.3, sample_s: float = 1.0) -> float | None:
    """Wait (at most ``max_wait_s``) until other processes use less than
    ``threshold_cores`` of the CPU over a ``sample_s`` sample; returns the last
    sample's busy cores (None where /proc/stat is unreadable)."""
    deadline = time.monotonic() + max_wait_s
    while True:
        before = _host_busy_s()
        time.sleep(sample_s)
        after = _host_busy_s()
        if before is None or after is None:
            return None
        busy = (after - before) / sample_s
        if busy < threshold_cores or time.monotonic() + sample_s > deadline:
            if busy >= threshold_cores:
                log(f"host still busy ({busy:.2f} cores in use by other processes); measuring anyway")
            return round(busy, 2)
        log(f"host busy ({busy:.2f} cores in use by other processes); waiting")


def add_run_arguments(parser: argparse.ArgumentParser, timeout_s: float, server_args: bool = True) -> None:
    """The options every end-to-end benchmark shares: --seed, --port, --timeout, --show-server-output,
    --server-arg (with ``server_args``) and --wait-quiet."""
    parser.add_argument("--seed", type=int, default=0, help="learner seed; client i uses seed + i (default: 0)")
    parser.add_argument("--port", type=int, default=None, help="server port (default: a free port)")
    parser.add_argument("--timeout", type=float, default=timeout_s,
                        help=f"give up after this many seconds of wall time (default: {timeout_s:g})")
    if server_args:
        parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                            help="extra argument for `tether serve` (repeatable), e.g. --server-arg=--no-tensorboard")
    parser.add_argument("--show-server-output", action="store_true",
                        help="let the server print its progress lines (to stderr) instead of --quiet")
    add_quiet_argument(parser)


def begin(args: argparse.Namespace) -> int:
    """Clean up children however the benchmark ends, wait for a quiet machine if asked, and
    return the server port (--port, or a free one)."""
    install_cleanup()
    if args.wait_quiet > 0:
        wait_until_quiet(args.wait_quiet)
    return args.port or free_port()


def add_quiet_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to SECONDS for other processes to leave the CPU idle "
                             "(useful on a shared machine; default: 0, do not wait)")


def wait_for_port(port: int, proc: subprocess.Popen | None, timeout_s: float, poll_s: float = 0.005) -> float:
    """Block until something accepts TCP connections on ``port``; returns time.time() then."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return time.time()
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on port {port} after {timeout_s} s") from None
            time.sleep(poll_s)


def run_server_with_clients(
    server_args: list[str],
    client_cmds: list[list[str]],
    port: int,
    timeout_s: float,
    show_server_output: bool = False,
    on_listening: Any = None,
) -> dict:
    """Start ``tether serve`` (with ``server_args``), then the clients once it
    listens; wait for the server to stop by itself (target or budget) or the
    timeout. Returns the server's summary plus the bench's own timings:
    ``t0`` (before the server started), ``listening_s``, ``wall_s`` and the host load."""
    import json
    import tempfile
    import time
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        summary_file = Path(tmp) / "summary.json"
        cmd = [sys.executable, "-m", "tether.server.cli", "serve", "--summary-file", str(summary_file),
               "--logdir", str(Path(tmp) / "run"), "--port", str(port), *server_args]
        if not show_server_output:
            cmd.append("--quiet")
        host_load = HostLoad()
        t0 = time.time()
        server = spawn(cmd, stdout=sys.stderr if show_server_output else subprocess.DEVNULL)
        clients: list[subprocess.Popen] = []
        try:
            listening_at = wait_for_port(port, server, timeout_s=timeout_s)
            log(f"server listening on {port} after {listening_at - t0:.2f} s; starting {len(client_cmds)} client(s)")
            if on_listening is not None:
                on_listening()
            clients = [spawn(c, stdout=subprocess.DEVNULL) for c in client_cmds]
            try:
                server.wait(timeout=max(1.0, timeout_s - (time.time() - t0)))
            except subprocess.TimeoutExpired:
                log(f"timeout after {timeout_s} s; stopping the server")
                stop(server, grace_s=10.0)
        finally:
            for c in clients:
                stop(c, grace_s=2.0)
            stop(server, grace_s=10.0)
        wall = time.time() - t0
        load = host_load.stop()
        if not summary_file.exists():
            raise RuntimeError(f"server wrote no summary (exit code {server.returncode})")
        summary = json.loads(summary_file.read_text())
    return {"summary": summary, "t0": t0, "listening_s": listening_at - t0, "wall_s": wall, "load": load}


def pettingzoo_client(game: str, port: int, seed: int) -> list[str]:
    """The command line of one examples/pettingzoo_client.py process playing ``game``."""
    return [sys.executable, str(REPO_ROOT / "examples/pettingzoo_client.py"), "--game", game,
            "--port", str(port), "--seed", str(seed)]


def target_reached(run: dict) -> tuple[float | None, int | None]:
    """Seconds (from the server's start) and env steps at which a ``--stop-at-return`` run reached its
    target, or ``(None, None)`` when it did not."""
    summary = run["summary"]
    reached_at = summary.get("reached_target_at")
    if reached_at is None:
        return None, None
    return round(reached_at - run["t0"], 3), summary.get("env_steps_at_target")


def emit(result: dict, echo: bool = True) -> None:
    """Print a benchmark's one JSON object on stdout (and, with ``echo``, on stderr beside the log)."""
    import json

    text = json.dumps(result)
    if echo:
        log(text)
    print(text, flush=True)
