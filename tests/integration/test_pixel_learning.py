"""A game seen through pixels is learned with the CNN from the Python SDK: the catch game of
multiagent/envs/pixel_catch.py, its 8x8 images sent as bytes (protocol 1.4), against a random policy
measured here. (The camera alone, with the same CNN, is learned through the C++ SDK:
tests/cpp/test_cpp_examples.py's test_cpp_pixel_catch_learns_from_pixels_with_the_cnn.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from multiagent.envs.pixel_catch import random_catch_rate

from .server_process import REPO, ServerProcess

IMAGE = '{"type": "Box", "shape": [8, 8, 1], "dtype": "uint8", "low": 0, "high": 255}'


def train_and_play(tmp_path, space: str, model: str, env_steps: int, *client_flags: str) -> tuple[dict, dict]:
    """A server for catch with ``space`` and ``model``, the example client playing until training is
    done and then greedy: (the server's summary, the client's report)."""
    server = ServerProcess(tmp_path, "--observation-space", space, "--action-space", '{"type": "Discrete", "n": 3}',
                           "--hidden-sizes", "64", "--model", model, "--max-env-steps", str(env_steps),
                           "--seed", "0").start()
    try:
        out = subprocess.run([sys.executable, str(REPO / "examples" / "pixel_catch_client.py"), *client_flags,
                              "--port", str(server.port), "--seed", "3"], cwd=REPO, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        summary = server.wait(60)
    finally:
        server.kill()
    played = json.loads(out.stdout.strip().splitlines()[-1])
    assert played["training_done"], played
    return summary, played


def test_the_camera_only_example_trains_and_plays(tmp_path) -> None:
    """examples/pixel_catch_client.py without --composite (the camera alone, the CNN with its own
    image_shape): its images reach the learner and it plays greedy when training is done. (Whether
    that camera is learned: the C++ SDK's test named in the module docstring, same game, same CNN.)"""
    cnn = '{"encoder": "cnn", "image_shape": [8, 8, 1], "conv": [[16, 3, 1], [32, 3, 1]], "dense": 128}'
    summary, played = train_and_play(tmp_path, IMAGE, cnn, 2000)
    assert summary["env_steps"] >= 2000 and summary["weights_seq_no"] >= 1, summary
    assert played["episodes"] > 0 and 0.0 <= played["greedy_catch_rate"] <= 1.0, played


COMPOSITE = json.dumps({"type": "Dict", "spaces": {
    "camera": json.loads(IMAGE), "paddle": {"type": "Box", "shape": [8], "dtype": "float32", "low": 0, "high": 1}}})
COMPOSITE_CNN = '{"encoder": "cnn", "conv": [[8, 3, 1], [16, 3, 1]], "dense": 64}'


@pytest.mark.slow
def test_a_camera_and_a_vector_are_learned_together(tmp_path) -> None:
    """The composite variant (§8.6): the camera shows only the ball, the paddle is a vector leaf, so
    catching needs both: a CNN reads the camera, its features meet the vector in the heads."""
    random_rate = random_catch_rate(1000, seed=3)
    # Greedy catch rate after 45k env steps, 4 runs (server seeds 3-6): 0.98-1.0, training return
    # 0.52-0.62. After 35k 0.795-1.0 over 13 runs, and once 0.55 (a CI machine): too few steps.
    # After 40k 0.90-1.0 (3 runs); after 30k 0.545-0.78 (3 runs).
    summary, played = train_and_play(tmp_path, COMPOSITE, COMPOSITE_CNN, 45000, "--composite")
    assert summary["return_mean"] > 2 * random_rate - 1 + 0.5, (summary["return_mean"], random_rate)
    assert played["greedy_catch_rate"] >= random_rate + 0.5, (played, random_rate)
