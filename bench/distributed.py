"""One rank against two: CartPole to a mean return of 450 with two clients, on one server and on a
group of two ranks started by torchrun (gloo on loopback, one client per rank; docs/scale-out.md).

Per setup: ``seconds_to_target`` (from the server's start to its stop rule's decision; with two
ranks, to the later of the two ranks' rules, as the group needs both) and ``env_steps_to_target``
(the env steps received by then; with two ranks, by the group's stop, just after), ``ingest_steps_per_s`` per
rank (env steps received / wall seconds), and for the group ``update_comm_s_per_update`` (seconds
an update spends in collectives: the plan, the gradient sums, rank 0's model; waiting for the
slower rank included) and ``weights_identical`` (both ranks' final networks and Adam states,
compared bit for bit). ``speedup`` is one rank's ``seconds_to_target`` over the group's.
On a machine with fewer cores than processes (two ranks and two clients on two cores), the group
is expected to be slower: the figure that matters there is that it learns, identically on both
ranks. Prints one JSON object, e.g.::

    {"one_rank": {"seconds_to_target": 60.1, "env_steps_to_target": 98000, "ingest_steps_per_s": [1630.0]},
     "two_ranks": {"seconds_to_target": 70.3, "env_steps_to_target": 110000, "ingest_steps_per_s": [790.0, 810.0],
                   "update_comm_s_per_update": 0.05, "weights_identical": true}, "speedup": 0.85, "target": 450}
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO_ROOT, add_quiet_argument, free_port, log

import torch  # noqa: E402

from tether.server.checkpoint import load_checkpoint  # noqa: E402
from tests.integration.server_process import two_free_ports  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=float, default=450.0, help="mean return to reach (default: 450)")
    parser.add_argument("--max-env-steps", type=int, default=400_000, help="budget of each run (default: 400000)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run at most (default: 600)")
    add_quiet_argument(parser)
    return parser.parse_args(argv)


def run(ranks: int, args: argparse.Namespace, folder: Path) -> dict:
    """One run to the target with two CartPole clients; the figures of its summaries."""
    port = free_port()
    serve = ["serve", "--env", "CartPole-v1", "--stop-at-return", str(args.target), "--max-env-steps",
             str(args.max_env_steps), "--logdir", str(folder / "run"), "--summary-file", str(folder / "summary.json"),
             "--no-tensorboard"]
    if ranks == 1:
        cmd = [sys.executable, "-m", "tether.server.cli", *serve, "--port", str(port)]
        client_ports = [port, port]
    else:
        port = two_free_ports()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), "-m", "tether.server.cli", *serve, "--port", str(port)]
        client_ports = [port + i for i in range(ranks)]
    server = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              process_group=0)
    clients = []
    try:
        _wait_serving(server, ranks)
        clients = [subprocess.Popen([sys.executable, str(REPO_ROOT / "examples" / "cartpole_client.py"), "--port",
                                     str(p), "--seed", str(i)], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL) for i, p in enumerate(client_ports)]
        server.wait(args.timeout)
    finally:
        for proc in clients:
            proc.kill()
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()
    paths = [folder / "summary.json"] + [folder / f"summary.rank-{r}.json" for r in range(1, ranks)]
    summaries = [json.loads(path.read_text()) for path in paths]
    # The run reached the target when the group's stop rule did: every rank judges the same sums at the
    # same agreement (scale-out.md), each recording it on its own clock.
    reached = [s["reached_target_at"] for s in summaries if s["reached_target_at"] is not None]
    decided = max(reached) if reached else None
    out = {
        "seconds_to_target": round(decided - min(s["started_at"] for s in summaries), 1) if decided else None,
        # (a rank's env_steps_at_target is the group's when it has several ranks: the judged view's)
        "env_steps_to_target": summaries[0]["env_steps_at_target"] if decided else None,
        "ingest_steps_per_s": [round(s["env_steps"] / s["wall_s"], 1) for s in summaries],
        "updates": summaries[0]["updates"],
        "return_mean": [s["return_mean"] for s in summaries],
    }
    if ranks > 1:
        out["update_comm_s_per_update"] = round(summaries[0]["group"]["update_comm_s"] / max(1, summaries[0]["updates"]), 4)
        out["weights_identical"] = _identical([load_checkpoint(folder / "run" / f"rank-{r}" / "checkpoint.pt")
                                               for r in range(ranks)])
    return out


def _identical(checkpoints: list[dict]) -> bool:
    first = checkpoints[0]["modules"]
    for other in checkpoints[1:]:
        for module_id, saved in first.items():
            theirs = other["modules"][module_id]["learner"]
            if saved["weights_seq_no"] != other["modules"][module_id]["weights_seq_no"]:
                return False
            if any(not torch.equal(t, theirs["model"][k]) for k, t in saved["learner"]["model"].items()):
                return False
            for slot, state in saved["learner"]["optimizer"]["state"].items():
                if any(not torch.equal(v, theirs["optimizer"]["state"][slot][k]) for k, v in state.items()):
                    return False
    return True


def _wait_serving(server: subprocess.Popen, ranks: int, timeout: float = 120) -> None:
    """Read the server's output until every rank said where it serves (then drain it on a thread)."""
    import threading

    assert server.stdout is not None
    deadline, serving = time.monotonic() + timeout, 0
    while serving < ranks:
        line = server.stdout.readline()
        if not line or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start (exit {server.poll()})")
        serving += "serving on" in line
    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict = {"target": args.target}
    for name, ranks in (("one_rank", 1), ("two_ranks", 2)):
        with tempfile.TemporaryDirectory(prefix=f"tether-bench-{ranks}-") as folder:
            result[name] = run(ranks, args, Path(folder))
        log(f"{name}: {result[name]}")
    one, two = result["one_rank"]["seconds_to_target"], result["two_ranks"]["seconds_to_target"]
    result["speedup"] = round(one / two, 2) if one and two else None
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
