"""The C# SDK's example programs (examples/csharp) against a real Python server.

cartpole.exe: the C# CartPole-v1 (gymnasium's physics) learns against ``tether
serve --stop-at-return 450`` to a mean return of at least 450 over its last 100
episodes; a uniformly random policy, played by the same program (--random),
stays far below.

multiagent.exe: the relay game of examples/cpp/multi_agent.cpp in C#, two
modules chosen by the server's policy mapping and one group
(examples/configs/cpp_multi_agent.json), learns far above a random policy
played by the same program, with one inference run per module per frame.

checkclient.exe: ``tether check-client --port 0`` (the scripted server that
walks a client through the spec) passes every one of its checks against the
C# SDK.

The programs are built by sdk_csharp/scripts/build_and_test.sh and run under
mono with the ONNX Runtime library the repo fetches.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.cpp.test_cpp_examples import (cartpole_learns, passes_every_check, refused_by_name, relay_game_learns,
                                         relay_game_plays_self_play)
from tests.integration.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "sdk_csharp" / ".build"


@pytest.fixture(scope="module")
def examples() -> Path:
    build = subprocess.run(["bash", str(REPO / "sdk_csharp" / "scripts" / "build_and_test.sh"), "--build-only"],
                           cwd=REPO, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return BUILD / "examples"


ORT_LIB = REPO / "sdk_cpp" / "third_party" / "onnxruntime" / "lib"


def mono(program: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, LD_LIBRARY_PATH=str(ORT_LIB))
    return subprocess.run(["mono", str(program), *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_csharp_check_client_passes_every_check(examples: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", str(ORT_LIB))
    passes_every_check(["mono", str(examples / "checkclient.exe")])


def last_json(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


@pytest.mark.slow
def test_csharp_cartpole_learns_to_450_and_random_does_not(examples: Path, tmp_path: Path) -> None:
    env = dict(os.environ, LD_LIBRARY_PATH=str(ORT_LIB))
    cartpole_learns(["mono", str(examples / "cartpole.exe")], tmp_path, env)


def test_csharp_multi_agent_learns_above_random(examples: Path, tmp_path: Path) -> None:
    env = dict(os.environ, LD_LIBRARY_PATH=str(ORT_LIB))
    print("C# multi-agent:", relay_game_learns(["mono", str(examples / "multiagent.exe")], tmp_path, env))


def test_csharp_multi_agent_plays_self_play_unchanged(examples: Path, tmp_path: Path) -> None:
    env = dict(os.environ, LD_LIBRARY_PATH=str(ORT_LIB))
    print("C# self-play:", relay_game_plays_self_play(["mono", str(examples / "multiagent.exe")], tmp_path, env))


@pytest.mark.parametrize(("program", "argv", "says"), [
    ("cartpole.exe", ["--port", "55x"], "cartpole: --port takes a whole number from 0 to 65535, not '55x'"),
    ("cartpole.exe", ["--seed", "-1"], "cartpole: --seed takes a whole number from 0 to 18446744073709551615, not '-1'"),
    ("cartpole.exe", ["--seed", " -1"], "cartpole: --seed takes a whole number from 0 to 18446744073709551615, not ' -1'"),
    ("cartpole.exe", ["--port", "-0"], "cartpole: --port takes a whole number from 0 to 65535, not '-0'"),
    ("multiagent.exe", ["--reconnect-timeout", "NaN"], "multiagent: --reconnect-timeout takes a number, not 'NaN'"),
    ("multiagent.exe", ["--reconnect-timeout", "soon"], "multiagent: --reconnect-timeout takes a number, not 'soon'"),
    ("multiagent.exe", ["--max-steps"], "multiagent: --max-steps needs a value (N)"),
    ("checkclient.exe", ["--steps", "3", "--colour", "red"], "checkclient: unknown flag '--colour'\nusage: checkclient "
     "[--host H] [--port P] [--steps N] [--idle-s S] [--auth-token T] [--seed S]"),
])
def test_csharp_examples_refuse_a_bad_command_line_by_name(examples: Path, program: str, argv: list[str],
                                                           says: str) -> None:
    """The C# examples parse their flags as the C++ ones do (examples/csharp/Shared/Flags.cs, the same
    messages as examples/cpp/flags.h): exit status 2 and a line naming the flag, not an unhandled
    FormatException."""
    refused_by_name(mono(examples / program, *argv, timeout=60), says)
