"""Each benchmark runs with a tiny budget and prints its JSON contract keys."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cpp import background_build

REPO = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout: float = 240) -> dict:
    out = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], cwd=REPO, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, out.stdout  # exactly one JSON object on stdout
    return json.loads(lines[0])


@pytest.mark.cpp_build("normal")
def test_act_latency_keys() -> None:
    """One run of the bench, all three SDKs: the Python, C++ and C# figures against the same servers."""
    background_build.wait("normal")  # the bench builds sdk_cpp/build/normal itself if it is not built
    result = run_bench("act_latency.py", "--calls", "500", "--warmup", "100", "--batch-calls", "50",
                       "--sending-seconds", "4", "--cnn-calls", "20", "--lstm-calls", "50", timeout=900)
    for key in ("onnxruntime_us_p50", "sdk_python_us_p50", "sdk_python_us_p99", "batch256_us_p50",
                "ort_python_cnn_us_p50", "sdk_python_cnn_us_p50", "ort_python_lstm_us_p50", "sdk_python_lstm_us_p50",
                "ort_csharp_lstm_us_p50", "sdk_csharp_lstm_us_p50"):
        assert result[key] > 0
    assert result["cnn_same_model_as_server"] is True
    assert result["same_model_as_server"] is True
    assert result["sdk_python_lstm_us_p50"] >= result["ort_python_lstm_us_p50"] * 0.5
    # The C# SDK's figures (mono, the same model and servers).
    for key in ("ort_csharp_us_p50", "sdk_csharp_us_p50", "sdk_csharp_us_p99", "ort_csharp_cnn_us_p50",
                "sdk_csharp_cnn_us_p50", "sdk_csharp_cnn_ratio", "ort_csharp_batch256_paced_us_p99",
                "sdk_csharp_batch256_sustained_p99_vs_bare_p99"):
        assert result[key] > 0, (key, result)
    assert result["sdk_csharp_us_p50"] >= result["ort_csharp_us_p50"] * 0.5  # the SDK runs the model: not less than it
    assert result["sdk_csharp_cnn_us_p50"] >= result["ort_csharp_cnn_us_p50"] * 0.5
    assert result["sdk_csharp_alloc_env_steps_sent"] > 0  # batches were cut while allocations were counted
    assert result["sdk_csharp_allocated_bytes_per_call"] >= 0
    assert result["sdk_csharp_lstm_allocated_bytes_per_call"] >= 0
    # The C++ SDK's figures.
    for key in ("ort_cpp_us_p50", "ort_cpp_batch256_us_p50", "sdk_cpp_us_p50", "sdk_cpp_us_p99",
                "sdk_cpp_batch256_us_p50", "ort_cpp_batch256_paced_us_p50", "sdk_cpp_us_p99_while_sending",
                "ort_cpp_batch256_paced_us_p99", "sdk_cpp_batch256_sustained_p99_vs_bare_p99",
                "sdk_cpp_backend_batch256_us_p50", "ort_cpp_cnn_us_p50", "sdk_cpp_cnn_us_p50", "sdk_cpp_cnn_us_p99",
                "sdk_cpp_cnn_ratio", "sdk_cpp_cnn_floats_ratio", "ort_cpp_lstm_us_p50", "sdk_cpp_lstm_us_p50",
                "ort_cpp_lstm_batch256_us_p50", "sdk_cpp_lstm_batch256_us_p50"):
        assert result[key] > 0, (key, result)
    assert result["sdk_cpp_us_p50"] >= result["ort_cpp_us_p50"] * 0.5  # the SDK runs the model: not less than it
    assert result["sdk_cpp_batch256_us_p50"] >= result["ort_cpp_batch256_us_p50"] * 0.5
    assert result["sdk_cpp_backend_matches_bare"] is True  # the same model, the same outputs
    assert result["sdk_cpp_calls_while_sending"] > 0 and result["sdk_cpp_env_steps_sent_while_sending"] > 0
    assert result["sdk_cpp_cnn_us_p50"] >= result["ort_cpp_cnn_us_p50"] * 0.5
    assert result["sdk_cpp_cnn_backend_matches_bare"] is True


def test_ingest_keys_and_verification() -> None:
    result = run_bench("ingest.py", "--clients", "2", "--seconds", "1", "--warmup", "0.5")
    assert result["env_steps_per_s"] > 0 and result["verified"] is True


@pytest.mark.slow
def test_e2e_cartpole_keys() -> None:
    """The bench's wiring, on a budget too small to reach 450 (the demo's learning to 450 is
    tests/integration/test_cartpole_learning.py): it says so, in its keys and its exit status."""
    out = subprocess.run([sys.executable, str(REPO / "bench" / "e2e_cartpole.py"), "--clients", "2",
                          "--max-env-steps", "6000"], cwd=REPO, capture_output=True, text=True, timeout=240)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 1 and result["reached"] is False, (out.returncode, result)
    assert set(result) >= {"time_to_450_s", "env_steps_to_450", "clients", "updates", "env_steps_total"}
    assert result["clients"] == 2 and result["time_to_450_s"] is None and result["env_steps_total"] >= 6000


def test_ingest_image_case_keys() -> None:
    result = run_bench("ingest.py", "--obs-shape", "16,16,3", "--obs-dtype", "uint8", "--clients", "1",
                       "--seconds", "0.5", "--warmup", "0.2")
    assert result["verified"] is True and result["obs_shape"] == [16, 16, 3]
    for key in ("env_steps_per_s", "b64_env_steps_per_s", "json_env_steps_per_s"):
        assert result[key] > 0, (key, result)
    # Bytes in the attachment: an image's 768 bytes and the step's other fields, far below JSON numbers.
    assert 768 < result["bytes_per_env_step"] < result["b64_bytes_per_env_step"] < result["json_bytes_per_env_step"]


def test_ingest_multi_agent_case_keys() -> None:
    result = run_bench("ingest.py", "--agents", "16", "--clients", "2", "--seconds", "1", "--warmup", "0.5")
    assert result["agent_steps_per_s"] > 0 and result["verified"] is True and result["agents_per_episode"] == 16


# e2e_two_step.py's keys and exit status: tests/multiagent/test_examples_learn.py's
# test_grouped_two_step_game_reaches_the_optimum (the same run: it stops at the target).


def test_export_keys() -> None:
    result = run_bench("export.py", "--exports", "3")
    assert set(result["export_ms_p50"]) == {"mlp", "cnn", "user", "lstm"}
    assert all(ms > 0 for ms in result["export_ms_p50"].values())
    assert result["onnx_bytes"]["cnn"] > 6_000_000  # Nature-CNN's weights, float32


def test_e2e_stateless_cartpole_keys() -> None:
    result = run_bench("e2e_stateless_cartpole.py", "--max-env-steps", "1500")
    for net in ("lstm", "mlp"):
        assert result[f"{net}_env_steps_total"] >= 1500, result
        assert f"{net}_env_steps_to_450" in result and f"{net}_time_to_450_s" in result
        assert result[f"{net}_return_mean_final"] > 0
    assert result["lstm_model"]["recurrent"]["type"] == "lstm"


def test_e2e_cartpole_demos_keys() -> None:
    result = run_bench("e2e_cartpole_demos.py", "--max-env-steps", "800", "--episodes", "1", "--epochs", "2")
    assert result["expert_return_mean"] == 500.0 and result["demo_steps"] == 500
    assert result["bc_only_greedy_return"] > 0 and result["pretrain_s"] > 0
    for key in ("env_steps_to_450_with_demos", "env_steps_to_450_without", "time_to_450_with_demos_s",
                "time_to_450_without_s", "with_demos_env_steps_ratio"):
        assert key in result
    assert result["return_final_with_demos"] is not None and result["return_final_without"] is not None


def test_e2e_connect_four_keys() -> None:
    result = run_bench("e2e_connect_four.py", "--max-env-steps", "2000", "--eval-games", "30")
    assert result["greedy_illegal_moves"] == 0 and result["training_illegal_moves"] == 0
    assert result["eval_games"] == 30 and result["training_games"] > 0 and 0 <= result["random_win_rate"] <= 1


def test_e2e_selfplay_keys() -> None:
    """bench/e2e_selfplay.py's contract on a budget too small to learn (one update, one client)."""
    result = run_bench("e2e_selfplay.py", "--max-env-steps", "4000", "--eval-games", "20", "--clients", "1")
    for key in ("win_rate_vs_random", "loss_rate_vs_random", "win_rate_vs_lookahead", "loss_rate_vs_lookahead",
                "random_win_rate_vs_random", "random_win_rate_vs_lookahead", "rating", "latest_snapshot_rating",
                "first_snapshot_rating", "games_rated", "env_steps", "wall_s", "train_s"):
        assert key in result, key
    assert result["illegal_moves"] == 0 and result["env_steps"] >= 4000 and result["eval_games"] == 20
    assert 0 <= result["win_rate_vs_lookahead"] <= 1 and result["games_rated"] > 0  # (about 130 games here)


def test_e2e_minatar_keys() -> None:
    result = run_bench("e2e_minatar.py", "--max-env-steps", "3000", "--random-episodes", "20", "--clients", "1")
    assert result["env_steps"] >= 3000 and result["random_return_mean"] >= 0
    assert result["published_ppo_return_at_10m"] == 28.0 and result["return_mean_final"] is not None


def test_learner_throughput_keys() -> None:
    result = run_bench("learner_throughput.py", "--updates", "1", "--mlp-steps", "256", "--cnn-steps", "16",
                       "--epochs", "1")
    for network in ("mlp", "cnn"):
        assert result["cpu"][network]["samples_per_s"] > 0 and result["cpu"][network]["update_s_p50"] > 0
    assert "cuda" in result and (result["cuda"] is None) == (result["cuda_device"] is None)
    for network in ("mlp", "cnn"):
        assert result["bf16"]["cpu"][network]["samples_per_s"] > 0 and result["bf16_over_fp32"]["cpu"][network] > 0


@pytest.mark.slow
def test_distributed_keys() -> None:
    """One rank and two (torchrun, gloo) to a low target: the keys, and both ranks' weights alike."""
    result = run_bench("distributed.py", "--target", "30", "--max-env-steps", "60000", "--timeout", "200", timeout=500)
    for setup in ("one_rank", "two_ranks"):
        assert result[setup]["seconds_to_target"] > 0 and result[setup]["env_steps_to_target"] > 0
        assert all(rate > 0 for rate in result[setup]["ingest_steps_per_s"])
    assert len(result["two_ranks"]["ingest_steps_per_s"]) == 2
    assert result["two_ranks"]["update_comm_s_per_update"] >= 0 and result["two_ranks"]["weights_identical"] is True
    assert result["speedup"] > 0
