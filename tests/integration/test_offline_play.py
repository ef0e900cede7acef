"""Offline policy files (§20) end to end, with real processes: a policy cloned from a scripted CartPole
expert (``tether pretrain``) is served by ``tether serve``, which writes ``offline_policy.json`` as it
stops; the CartPole programs of the three SDKs (examples/cartpole_client.py, examples/cpp/cartpole.cpp,
examples/csharp/CartPole.cs) then play with that file and no server, each recording its episodes to a
demonstration file. Each plays far above a random policy measured in the same test, sends nothing,
and writes a file ``tether demos show`` reads: the policy's steps, none logged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cpp import background_build

from .server_process import REPO, ServerProcess
from .test_demonstrations import pretrain, random_return, record_expert, tether

ORT_LIB = REPO / "sdk_cpp" / "third_party" / "onnxruntime" / "lib"
STEPS = "4000"


def last_json(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("{")]
    assert lines, output[-3000:]
    return json.loads(lines[-1])


def cloned_offline_policy(tmp_path: Path) -> Path:
    """The offline policy file ``tether serve`` wrote, serving a clone of a scripted expert."""
    record_expert("cartpole", 10, tmp_path / "expert.jsonl")
    pretrain(tmp_path / "expert.jsonl", tmp_path / "pretrained.pt")
    server = ServerProcess(tmp_path, "--env", "CartPole-v1", "--init-from", str(tmp_path / "pretrained.pt")).start()
    server.stop()
    path = server.logdir / "offline_policy.json"
    assert path.exists(), "\n".join(server.lines[-30:])
    return path


def cpp_cartpole() -> Path:
    background_build.wait("examples")
    build = subprocess.run(["bash", str(REPO / "sdk_cpp" / "scripts" / "build_and_test.sh"), "examples"],
                           capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-5000:]
    return REPO / "sdk_cpp" / "build" / "examples" / "cartpole"


def csharp_cartpole() -> list[str]:
    build = subprocess.run(["bash", str(REPO / "sdk_csharp" / "scripts" / "build_and_test.sh"), "--build-only"],
                           cwd=REPO, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return ["mono", str(REPO / "sdk_csharp" / ".build" / "examples" / "cartpole.exe")]


@pytest.mark.slow
def test_every_sdk_plays_a_served_policy_offline_and_records_it(tmp_path: Path) -> None:
    policy = cloned_offline_policy(tmp_path)
    random = random_return("CartPole-v1", 20)
    programs = {
        "python": ([sys.executable, str(REPO / "examples" / "cartpole_client.py")], "mean_return"),
        "cpp": ([str(cpp_cartpole())], "mean_return_last_100"),
        "csharp": (csharp_cartpole(), "mean_return_last_100"),
    }
    env = dict(os.environ, LD_LIBRARY_PATH=str(ORT_LIB))
    played = {}
    for sdk, (program, key) in programs.items():
        demos = tmp_path / f"{sdk}.jsonl"
        # Port 1: nothing listens there, and an offline client never tries.
        run = subprocess.run([*program, "--port", "1", "--offline-policy", str(policy), "--demo-file", str(demos),
                              "--max-steps", STEPS, "--seed", "3"], capture_output=True, text=True, timeout=300,
                             env=env, cwd=REPO)
        assert run.returncode == 0, (sdk, run.stderr[-3000:])
        report = last_json(run.stdout)
        assert report["env_steps_sent"] == 0 and report["stopped_by"] == "max_steps", (sdk, report)
        shown = tether("demos", "show", str(demos))
        assert shown.returncode == 0, shown.stderr[-3000:]
        counts = json.loads(shown.stdout)["modules"]["default_policy"]
        assert counts["logged_steps"] == 0 and counts["steps"] >= int(STEPS) - 500, (sdk, counts)
        played[sdk] = report[key]
    print(json.dumps({"played": played, "random": random}))
    assert random < 40, random
    assert all(mean > 5 * random for mean in played.values()), (played, random)
