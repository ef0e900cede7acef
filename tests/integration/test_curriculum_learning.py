"""A curriculum (docs/curriculum.md, protocol §19) on a real server with the Python SDK's example
client: Reach, whose target distance is an environment parameter, moves from lesson to lesson as
the measure holds; each change reaches the client with the answer to the batch that made it; the
final lesson is learned, where a random policy almost never reaches the target."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from multiagent.envs.reach import random_reach_rate

from .server_process import REPO, ServerProcess

CONFIG = REPO / "examples" / "configs" / "reach_curriculum.toml"
STEPS_PER_BATCH = 250  # env_steps_per_sample of the config


@pytest.mark.slow
def test_lessons_advance_reach_the_client_within_a_batch_and_the_last_is_learned(tmp_path) -> None:
    random_rate = random_reach_rate(8, seed=1)  # about 0.001
    server = ServerProcess(tmp_path, "--config", str(CONFIG), "--max-env-steps", "20000", "--seed", "0").start()
    try:
        out = subprocess.run([sys.executable, str(REPO / "examples" / "curriculum_client.py"), "--port",
                              str(server.port), "--seed", "1"], cwd=REPO, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-3000:]
        summary = server.wait(60)
    finally:
        server.kill()
    played = json.loads(out.stdout.strip().splitlines()[-1])
    curriculum = summary["curriculum"]
    # Lessons 0 -> 1 -> 2, each when the mean return of its last 40 episodes reached 0.8.
    # (Measured: the last lesson from about 11.5k env steps; greedy reach rate 1.0 at distance 8.)
    assert curriculum["lesson"] == 2 and curriculum["lesson_name"] == "far", curriculum
    advances = [c for c in curriculum["changes"] if c["cause"] == "lesson"]
    assert [c["lesson"] for c in advances] == [1, 2] and all(c["measure"] >= 0.8 for c in advances), advances
    received = {r["seq"]: r for r in played["received"]}
    for change in advances:
        # The client waits for each batch's answer: it holds the new set before it plays another batch.
        seen = received[change["set_seq"]]
        assert change["env_steps"] <= seen["env_steps"] <= change["env_steps"] + STEPS_PER_BATCH, (change, seen)
        assert seen["lesson"] == change["lesson"]
    assert received[advances[-1]["set_seq"]]["values"] == {"distance": 8.0}
    # Every distance was played, and the records saying so were accepted (a value its set cannot
    # give is refused): the server counted the episodes toward their lessons.
    assert set(played["distances"]) == {"2", "4", "8"}, played["distances"]
    assert curriculum["episodes"] >= 80, curriculum
    assert played["final_distance"] == 8
    assert played["greedy_reach_rate"] >= random_rate + 0.5, (played, random_rate)
