"""The C++ SDK's example programs (examples/cpp) against real Python servers.

The examples are a separate CMake project that adds the SDK with
add_subdirectory; sdk_cpp/scripts/build_and_test.sh examples configures it
into sdk_cpp/build/examples with ONNX Runtime from sdk_cpp/third_party/onnxruntime
(fetched if missing) and builds it, in the background while the Python tests
run (tests/conftest.py).

* cartpole: the C++ CartPole-v1 learns against ``tether serve`` (the flags of
  the server's CartPole demo: --stop-at-return 450) to a mean return of the
  last 100 episodes >= 450, which a random policy, measured in the same test
  with the same program (--random), stays far below; it stops when the server
  says training is done (ERROR TRAINING_DONE, §6.6), without reconnecting.
* check_client: ``tether check-client --port 0`` against the C++ program
  passes every row.
* multi_agent: a C++ game with two modules chosen by policy mapping and one
  agent group (examples/configs/cpp_multi_agent.json) trains against ``tether
  serve`` through the MultiAgentClient; its mean return of the last 100
  episodes clearly beats a random policy's, measured in the same test with the
  same program (--random).
* pixel_catch: the catch game of multiagent/envs/pixel_catch.py in C++,
  observed only through its 8x8 uint8 camera image (a byte box, protocol
  1.4), learned with the CNN against ``tether serve``: its catch rate over the
  last 100 episodes beats a random policy's (the same program, --random) by 0.5.
* scripted_team: CartPoles side by side, the even ones played by a scripted expert whose actions the
  frame logs (protocol 1.6), the odd ones by the policy: the policy trains above random play, and the
  demonstration file the client writes holds every cart's episodes, the expert's steps logged.
* memory_cue: the game of multiagent/envs/memory_cue.py in C++ (protocol 1.5),
  which only a policy with memory wins: trained against ``tether serve`` with a
  GRU, its greedy episodes (compute_action with an episode id) reach a mean
  return near +1, while the same program against an MLP server stays near 0,
  the memoryless ceiling.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[2]
IMAGE_SPACE = '{"type": "Box", "shape": [8, 8, 1], "dtype": "uint8", "low": 0, "high": 255}'
CATCH_CNN = '{"encoder": "cnn", "image_shape": [8, 8, 1], "conv": [[16, 3, 1], [32, 3, 1]], "dense": 128}'
ROW = re.compile(r"^(\w+)\s+(PASS|FAIL)\s+(.*)$")
ALL_ROWS = {"handshake", "records_valid", "engine_gets_clipped_action", "raw_box_samples", "logp_from_served_model",
            "batch_ids", "error_reply", "model_swap", "drop_reconnect", "resend_same_seq", "duplicate_reply",
            "garbage_reconnect", "connection_error", "heartbeat"}


def last_json(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("{")]
    assert lines, output[-3000:]
    return json.loads(lines[-1])


def cartpole_learns(program: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> dict:
    """The CartPole example of an engine SDK (examples/cpp/cartpole.cpp or its C# port) played at
    random, then trained against ``tether serve`` until the server stops at return 450; checks
    that it reached 450 far beyond random and that the server said why it stopped (§6.6).
    Returns the example's last JSON line."""
    random_run = subprocess.run([*program, "--random", "--max-steps", "20000", "--seed", "1"],
                                capture_output=True, text=True, timeout=120, env=env)
    assert random_run.returncode == 0, random_run.stderr
    baseline = last_json(random_run.stdout)
    assert baseline["mean_return_last_100"] < 100, baseline  # about 22

    server = ServerProcess(tmp_path, "--env", "CartPole-v1", "--stop-at-return", "450", "--max-env-steps", "300000",
                           "--seed", "0").start()
    started = time.monotonic()
    try:
        # The program plays until the server says training is done (its own step budget is only a
        # bound): a fast engine on a loaded machine makes steps faster than the server takes them.
        run = subprocess.run([*program, "--port", str(server.port), "--max-steps", "5000000",
                              "--seed", "0", "--reconnect-timeout", "5"], capture_output=True, text=True,
                             timeout=900, env=env)
        wall_s = time.monotonic() - started
        try:
            summary = server.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError("the server did not stop after the program ended: "
                                 + run.stdout[-2000:] + run.stderr[-2000:]) from None
    finally:
        server.kill()
    result = last_json(run.stdout)
    print(f"{Path(program[-1]).name}: {result}; server: return {summary.get('return_mean')} after "
          f"{summary.get('env_steps')} env steps; wall {wall_s:.1f} s; random baseline {baseline['mean_return_last_100']}")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert result["stopped_by"] == "training_done", result  # the server reached its target and said so (§6.6)
    assert result["summary"]["reason"] == "stop_at_return", result  # the summary that came with TRAINING_DONE
    assert summary["reached_target_at"] is not None, summary
    assert result["mean_return_last_100"] >= 450, result
    assert result["mean_return_last_100"] > baseline["mean_return_last_100"] + 300
    assert result["env_steps_sent"] > 0
    return result


@pytest.mark.slow
def test_cpp_cartpole_learns_to_450_and_random_does_not(examples: Path, tmp_path: Path) -> None:
    assert cartpole_learns([str(examples / "cartpole")], tmp_path)["models_loaded"] > 1


def server_flags(config: Path) -> list[str]:
    """``tether serve`` flags for the options in a JSON config (keys starting with "_" are comments)."""
    flags: list[str] = []
    for key, value in json.loads(config.read_text()).items():
        if key.startswith("_"):
            continue
        flag = "--" + key.replace("_", "-")
        if key == "hidden_sizes":
            flags += [flag, ",".join(str(v) for v in value)]
        elif isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def relay_game_learns(program: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> str:
    """The relay game of examples/cpp/multi_agent.cpp (or its C# port) played at random, then
    trained against ``tether serve`` with examples/configs/cpp_multi_agent.json; checks that it
    learns far beyond random, with one inference run per module per frame and every step
    delivered. Returns a summary line."""
    random_run = subprocess.run([*program, "--random", "--max-steps", "4000", "--seed", "1"], capture_output=True,
                                text=True, timeout=120, env=env)
    assert random_run.returncode == 0, random_run.stderr
    baseline = last_json(random_run.stdout)["mean_return_last_100"]  # about 16 of 40
    assert 10 < baseline < 22, baseline

    flags = server_flags(REPO / "examples" / "configs" / "cpp_multi_agent.json")
    server = ServerProcess(tmp_path, *flags, "--seed", "0").start()
    started = time.monotonic()
    try:
        run = subprocess.run([*program, "--port", str(server.port), "--max-steps", "6000", "--seed", "0",
                              "--reconnect-timeout", "5"], capture_output=True, text=True, timeout=300, env=env)
        wall_s = time.monotonic() - started
    finally:
        server.kill()
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = last_json(run.stdout)
    assert result["stopped_by"] == "max_steps", result
    assert result["mean_return_last_100"] > baseline + 12, (result, baseline)
    assert result["mean_return_last_100"] > result["mean_return_first_100"] + 5, result
    # Two modules, one inference run each per frame; every step delivered.
    assert result["inference_runs"] == 2 * result["env_steps"], result
    assert result["env_steps_sent"] == result["env_steps"] and result["agent_steps_sent"] > result["env_steps"]
    assert result["models_loaded"] > 2, result
    return f"{result}; wall {wall_s:.1f} s; random baseline {baseline}"


def test_cpp_multi_agent_learns_beyond_random(examples: Path, tmp_path: Path) -> None:
    print("C++ multi-agent:", relay_game_learns([str(examples / "multi_agent")], tmp_path))


def relay_game_plays_self_play(program: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> str:
    """The relay game's two scouts as the two teams of a self-play run (docs/self_play.md), the
    program unchanged: per episode the server draws which scout learns and whether the other plays
    the latest "scout" or a snapshot of it, and the program's SDK asks (MAP_AGENTS, §9.8) and acts
    with the snapshot models the server sends. Every step is delivered and accepted (a seat
    reported on another module than the one drawn would be refused), the snapshots' models are
    loaded and played, and their games rated. Returns a summary line."""
    flags = server_flags(REPO / "examples" / "configs" / "cpp_multi_agent.json")
    self_play = {"teams": ["scout_0", "scout_1"], "snapshot_every": 1, "window": 3, "latest_share": 0.2}
    server = ServerProcess(tmp_path, *flags, "--seed", "0", "--self-play", json.dumps(self_play),
                           "--max-env-steps", "4000").start()
    try:
        run = subprocess.run([*program, "--port", str(server.port), "--max-steps", "100000", "--seed", "0",
                              "--reconnect-timeout", "5"], capture_output=True, text=True, timeout=300, env=env)
        summary = server.wait(timeout=60)
    finally:
        server.kill()
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = last_json(run.stdout)
    assert result["stopped_by"] == "training_done", result
    # No batch refused (the program prints each error of the server), every step delivered but those
    # of the batch in flight when the server's budget ran out (env_steps_per_sample 200).
    refused = [line for line in run.stdout.splitlines() if "server reported" in line and "TRAINING_DONE" not in line]
    assert not refused, refused
    assert result["env_steps_sent"] >= result["env_steps"] - 200, result
    snapshots = summary["self_play"]["modules"]["scout"]["snapshots"]
    assert len(snapshots) == 3 and summary["self_play"]["games_rated"] > 50, summary["self_play"]
    played = {m for m in summary["module_return_mean"] if m.startswith("scout@")}
    assert len(played) >= 2, summary["module_return_mean"]  # the snapshots acted in the program's frames
    # The initial model of 3 slots and 2 modules, then new models as snapshots replace each other.
    assert result["models_loaded"] > 5 + 3, result
    assert summary["modules_weights_seq_no"]["scout@0"] >= 2, summary["modules_weights_seq_no"]
    # The lifters' group is on no team: its module keeps no snapshots.
    assert not any(m.startswith("lifter@") for m in summary["modules_weights_seq_no"]), summary["modules_weights_seq_no"]
    return f"{result}; rated {summary['self_play']['games_rated']}"


def test_cpp_multi_agent_plays_self_play_unchanged(examples: Path, tmp_path: Path) -> None:
    print("C++ self-play:", relay_game_plays_self_play([str(examples / "multi_agent")], tmp_path))


@pytest.mark.slow
def test_cpp_logged_expert_carts_and_policy_carts_train(examples: Path, tmp_path: Path) -> None:
    """A C++ frame of logged expert carts and policy carts (AgentFrame::log_action, protocol 1.6) trains
    the policy above random play of the same program (--random), and the frames it played are written
    to a demonstration file the server's reader takes back, the expert's steps logged."""
    from tether.protocol.demonstrations import read_demonstrations

    program = str(examples / "scripted_team")
    random_run = subprocess.run([program, "--random", "--max-steps", "30000", "--seed", "1"], capture_output=True,
                                text=True, timeout=60)
    assert random_run.returncode == 0, random_run.stderr
    baseline = last_json(random_run.stdout)
    assert baseline["expert_return_mean"] == 500 and baseline["policy_return_last"] < 50, baseline
    demos = tmp_path / "team.jsonl"
    with ServerProcess(tmp_path, "--train-batch-size", "1000", "--env-steps-per-sample", "250", "--seed", "0") as server:
        run = subprocess.run([program, "--port", str(server.port), "--max-steps", "30000", "--seed", "0",
                              "--demo-file", str(demos)], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        summary = server.stop()
    result = last_json(run.stdout)
    print(f"C++ scripted team: {result}; random baseline {baseline}")
    assert result["expert_return_mean"] == 500
    # (seeds 0 and 1 reached 87 and 243 over their last 20 episodes; random play about 25)
    assert result["policy_return_last"] > baseline["policy_return_last"] + 30, (result, baseline)
    assert summary["env_steps"] >= 20_000, summary
    written = read_demonstrations(demos)
    experts = [e for e in written.episodes if int(e.agent_id.split("_")[1]) % 2 == 0]
    policy = [e for e in written.episodes if int(e.agent_id.split("_")[1]) % 2 == 1]
    assert experts and policy and all(e.chunk.logged is not None and e.chunk.logged.all() for e in experts)
    assert all(e.chunk.logged is None for e in policy)


@pytest.mark.slow
def test_cpp_pixel_catch_learns_from_pixels_with_the_cnn(examples: Path, tmp_path: Path) -> None:
    program = str(examples / "pixel_catch")
    random_run = subprocess.run([program, "--random", "--max-steps", "20000", "--seed", "1"], capture_output=True,
                                text=True, timeout=60)
    assert random_run.returncode == 0, random_run.stderr
    baseline = last_json(random_run.stdout)["catch_rate"]  # about 0.12
    server = ServerProcess(tmp_path, "--observation-space", IMAGE_SPACE, "--action-space",
                           '{"type": "Discrete", "n": 3}', "--hidden-sizes", "64", "--model", CATCH_CNN,
                           "--max-env-steps", "20000", "--seed", "0").start()
    try:
        run = subprocess.run([program, "--port", str(server.port), "--seed", "3"], capture_output=True, text=True,
                             timeout=300)
        summary = server.wait(60)
    finally:
        server.kill()
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = last_json(run.stdout)
    print(f"C++ pixel catch: {result}; server return {summary.get('return_mean')}; random {baseline}")
    assert result["stopped_by"] == "training_done" and result["models_loaded"] > 2, result
    # (0.88 measured on a loaded machine, sampled actions; random play about 0.12)
    assert result["catch_rate_last_100"] >= baseline + 0.5, (result, baseline)
    assert summary["return_mean"] > 2 * baseline - 1 + 0.8, (summary, baseline)


MEMORY_CUE_FLAGS = ["--observation-space", '{"type": "Box", "shape": [3], "low": 0, "high": 1}',
                    "--action-space", '{"type": "Discrete", "n": 2}', "--hidden-sizes", "32",
                    "--train-batch-size", "1200", "--env-steps-per-sample", "300", "--minibatch-size", "240",
                    "--max-env-steps", "12000"]


def memory_cue_trained(program: str, tmp_path: Path, model: str, seed: int) -> tuple[dict, float]:
    """examples/cpp/memory_cue.cpp trained against ``tether serve --model MODEL`` until the server's
    run is done, then played greedily; (its JSON line, wall seconds)."""
    server = ServerProcess(tmp_path, *MEMORY_CUE_FLAGS, "--model", model, "--seed", str(seed),
                           name="recurrent" if "recurrent" in model else "memoryless").start()
    started = time.monotonic()
    try:
        run = subprocess.run([program, "--port", str(server.port), "--seed", str(seed), "--reconnect-timeout", "5"],
                             capture_output=True, text=True, timeout=300)
        wall_s = time.monotonic() - started
        server.wait(60)
    finally:
        server.kill()
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = last_json(run.stdout)
    assert result["stopped_by"] == "training_done" and result["models_loaded"] > 2, result
    assert result["greedy_episodes"] == 200, result
    return result, wall_s


@pytest.mark.slow
def test_cpp_memory_cue_learns_only_with_memory(examples: Path, tmp_path: Path) -> None:
    """A recurrent model (GRU) wins the memory cue game through the C++ SDK, which carries its state
    (§12.4); an MLP, trained alike, cannot beat chance (0). Measured on two cores: GRU greedy 1.0 over
    server seeds 0-2 (11-29 s each), MLP 0.08, -0.07, -0.07; the test takes about 30 s."""
    program = str(examples / "memory_cue")
    random_run = subprocess.run([program, "--random", "--max-steps", "6000", "--seed", "1"], capture_output=True,
                                text=True, timeout=60)
    assert random_run.returncode == 0, random_run.stderr
    assert abs(last_json(random_run.stdout)["greedy_return"]) < 0.3  # chance
    recurrent, recurrent_s = memory_cue_trained(
        program, tmp_path, '{"recurrent": {"type": "gru", "size": 32, "seq_len": 8, "burn_in": 2}}', 0)
    memoryless, memoryless_s = memory_cue_trained(program, tmp_path, '{"encoder": "mlp"}', 0)
    print(f"C++ memory cue: GRU {recurrent} ({recurrent_s:.1f} s); MLP {memoryless} ({memoryless_s:.1f} s)")
    assert recurrent["greedy_return"] >= 0.6, recurrent
    assert memoryless["greedy_return"] < 0.3, memoryless


def run_check(program: list[str], timeout: float = 120.0) -> tuple[int, dict[str, tuple[str, str]], str, str]:
    """Start the checker on a free port, run ``program --port P`` against it; (exit status, rows, outputs)."""
    checker = subprocess.Popen([sys.executable, "-m", "tether.server.cli", "check-client", "--port", "0",
                                "--timeout", "60"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        assert checker.stdout is not None
        first = checker.stdout.readline()
        match = re.search(r"listening on [\d.]+:(\d+)", first)
        assert match, first
        client = subprocess.run([*program, "--port", match.group(1)], cwd=REPO, capture_output=True, text=True,
                                timeout=timeout)
        out, _ = checker.communicate(timeout=timeout)
    finally:
        if checker.poll() is None:
            checker.kill()
            checker.wait()
    rows = {m.group(1): (m.group(2), m.group(3)) for m in map(ROW.match, out.splitlines()) if m and m.group(1) != "check"}
    return checker.returncode, rows, out, client.stdout + client.stderr + f"\n(exit status {client.returncode})"


def passes_every_check(program: list[str]) -> None:
    """``tether check-client`` against ``program``: every check reported and passed, the
    refusal of batch 1 reached the program, which ended normally."""
    status, rows, out, client_out = run_check(program)
    assert set(rows) == ALL_ROWS, out + "\n--- client ---\n" + client_out[-3000:]
    failed = {name: reason for name, (result, reason) in rows.items() if result == "FAIL"}
    assert not failed, out + "\n--- client ---\n" + client_out[-3000:]
    assert status == 0
    assert "INVALID_FIELD" in client_out  # the refusal of batch 1 reached the program
    assert "(exit status 0)" in client_out


def test_cpp_check_client_passes_every_check(examples: Path) -> None:
    passes_every_check([str(examples / "check_client")])


@pytest.mark.parametrize(("program", "argv", "says"), [
    ("cartpole", ["--port", "55x"], "cartpole: --port takes a whole number from 0 to 65535, not '55x'"),
    ("cartpole", ["--port", "70000"], "cartpole: --port takes a whole number from 0 to 65535, not '70000'"),
    ("cartpole", ["--when-queue-full", "sometimes"],
     "cartpole: --when-queue-full takes one of wait|drop_oldest, not 'sometimes'"),
    ("memory_cue", ["--seed", "-1"], "memory_cue: --seed takes a whole number from 0 to 18446744073709551615, not '-1'"),
    ("memory_cue", ["--seed", " -1"], "memory_cue: --seed takes a whole number from 0 to 18446744073709551615, not ' -1'"),
    ("multi_agent", ["--reconnect-timeout", "nan"], "multi_agent: --reconnect-timeout takes a number, not 'nan'"),
    ("cartpole", ["--port", "-0"], "cartpole: --port takes a whole number from 0 to 65535, not '-0'"),
    ("memory_cue", ["--cues", "1"], "memory_cue: --cues and --length are at least 2"),
    ("multi_agent", ["--reconnect-timeout", "soon"], "multi_agent: --reconnect-timeout takes a number, not 'soon'"),
    ("pixel_catch", ["--max-steps"], "pixel_catch: --max-steps needs a value (N)"),
    ("scripted_team", ["--agents", "1"], "scripted_team: --agents is at least 2"),
    ("scripted_team", ["--agents", "3000000000"], "scripted_team: --agents takes a whole number, not '3000000000'"),
    ("check_client", ["--steps", "3", "--colour", "red"], "check_client: unknown flag '--colour'\nusage: check_client "
     "[--host H] [--port P] [--steps N] [--idle-s S] [--auth-token T] [--seed S]"),
])
def test_cpp_examples_refuse_a_bad_command_line_by_name(examples: Path, program: str, argv: list[str],
                                                        says: str) -> None:
    """Every example program parses its flags alike (examples/cpp/flags.h): a value of the wrong kind, a
    missing value or an unknown flag ends it with exit status 2, before it connects, and a line naming
    the flag (a value that does not fit the flag's type is refused, not read as 0 or wrapped)."""
    refused_by_name(subprocess.run([str(examples / program), *argv], capture_output=True, text=True, timeout=30), says)


def refused_by_name(run: subprocess.CompletedProcess, says: str) -> None:
    """An example program that refused its command line: exit status 2, stderr starting with `says`."""
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert run.stderr.startswith(says), run.stderr
