"""RLlib's own RLlink v1 server, for interoperability tests.

Runs RLlib PPO with ``TcpClientInferenceEnvRunner`` (ray[rllib]==2.48.0) on
CartPole's spaces, as RLlib's example
``ray/rllib/examples/envs/env_connecting_to_rllib_w_tcp_client.py`` does, and
waits for one external RLlink client to connect to ``--port``. Trains for at
most ``--iters`` iterations and ``--time-limit`` seconds, prints one progress
line per iteration, writes a JSON summary and exits by itself.

Run it with the Python of a virtual environment that has RLlib (see
``scripts/install_ray_peer.sh``), not with Tether's::

    .venv-ray/bin/python tests/interop/rllib_server.py --port 5555 --iters 5

Notes:
- With ``num_env_runners=0`` the TCP env runner is the local one: it lives in
  this (driver) process and listens on ``--port`` exactly (RLlib listens on
  port + worker_index, and the local runner's index is 0).
- RLlib exports the model with ``torch.onnx.export(...)`` and no ``dynamo``
  argument; torch 2.13 defaults to the dynamo exporter, which fails on RLlib's
  call (``KeyError: -1``). This launcher makes ``dynamo=False`` the default
  in-process; RLlib's files are not changed.
- RLlib's exported model has a fixed batch dimension of 1.
- The summary's ``probe_obs`` / ``probe_logits`` are the final RLModule's
  action logits for fixed observations, so a client can check that the ONNX
  model it received computes the same numbers.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

# Must be set before Ray is imported.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
warnings.filterwarnings("ignore", category=DeprecationWarning)

PROBE_OBS = [
    [0.0, 0.0, 0.0, 0.0],
    [0.02, 0.1, -0.03, -0.2],
    [-0.05, -0.4, 0.05, 0.6],
    [0.1, 0.5, 0.1, 0.9],
]


def log(text: str) -> None:
    print(f"[rllib-server] {text}", flush=True)


def patch_onnx_export() -> None:
    """torch>=2.9 exports with dynamo by default; RLlib 2.48 needs the TorchScript exporter."""
    import torch

    original = torch.onnx.export
    if getattr(original, "_rllink_interop_patched", False):
        return
    patched = functools.partial(original, dynamo=False)
    patched._rllink_interop_patched = True  # type: ignore[attr-defined]
    torch.onnx.export = patched


def _shutdown_ray() -> None:
    try:
        import ray

        ray.shutdown()
    except Exception as exc:  # best effort on the way out
        log(f"ray.shutdown() failed: {exc!r}")


def build_algo(args: argparse.Namespace):
    import gymnasium as gym
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.tcp_client_inference_env_runner import TcpClientInferenceEnvRunner

    cartpole = gym.make("CartPole-v1")
    config = (
        PPOConfig()
        .environment(
            observation_space=cartpole.observation_space,
            action_space=cartpole.action_space,
            env_config={"port": args.port},
        )
        .env_runners(env_runner_cls=TcpClientInferenceEnvRunner, num_env_runners=0)
        .learners(num_learners=0)
        .training(
            train_batch_size_per_learner=args.train_batch_size,
            minibatch_size=args.minibatch_size,
            num_epochs=args.num_epochs,
            lr=args.lr,
            vf_loss_coeff=0.01,
        )
        .rl_module(model_config=DefaultModelConfig(vf_share_layers=True))
        .debugging(seed=args.seed)
    )
    cartpole.close()
    from ray.tune.logger import NoopLogger

    # No result files under ~/ray_results: RLlib gets a logger that writes nothing.
    return config.build_algo(logger_creator=lambda cfg: NoopLogger(cfg, args.logdir))


def probe_logits(algo) -> list[list[float]]:
    """The local env runner's RLModule (what it exports to clients) on PROBE_OBS."""
    import torch
    from ray.rllib.core import Columns

    module = algo.env_runner.module
    with torch.no_grad():
        out = module.forward_inference({Columns.OBS: torch.tensor(PROBE_OBS, dtype=torch.float32)})
    return out[Columns.ACTION_DIST_INPUTS].cpu().numpy().astype(float).tolist()


def find(result: dict, key: str):
    """A metric from RLlib's (nested) result dict, wherever this version puts it."""
    if key in result:
        return result[key]
    for value in result.values():
        if isinstance(value, dict):
            found = find(value, key)
            if found is not None:
                return found
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=5555, help="port the TCP env runner listens on")
    parser.add_argument("--iters", type=int, default=5, help="training iterations before exiting")
    parser.add_argument("--time-limit", type=float, default=150.0,
                        help="hard limit in seconds: exit (code 3) even when an iteration is still waiting for the client")
    parser.add_argument("--train-batch-size", type=int, default=1000,
                        help="env steps per iteration; also the env_steps_per_sample clients are told in SET_CONFIG")
    parser.add_argument("--minibatch-size", type=int, default=250)
    parser.add_argument("--num-epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--summary-file", default=None, help="write a JSON summary here (after every iteration)")
    parser.add_argument("--object-store-mb", type=int, default=100, help="Ray object store size in MiB")
    parser.add_argument("--logdir", default=None, help="folder for RLlib's logger (default: a temporary folder)")
    args = parser.parse_args()
    own_logdir = args.logdir is None
    if own_logdir:
        args.logdir = tempfile.mkdtemp(prefix="rllib-server-")

    started = time.monotonic()
    summary: dict = {"port": args.port, "iterations": 0, "history": [], "finished": False}

    def write_summary() -> None:
        summary["wall_s"] = round(time.monotonic() - started, 2)
        if args.summary_file:
            tmp = Path(args.summary_file + ".tmp")
            tmp.write_text(json.dumps(summary, indent=2))
            tmp.replace(args.summary_file)

    def watchdog() -> None:
        time.sleep(args.time_limit)
        log(f"time limit of {args.time_limit:.0f} s reached after {summary['iterations']} iteration(s); exiting")
        summary["timed_out"] = True
        write_summary()
        # train() may be blocked for good on a client that went away: stop Ray's
        # helper processes from here (bounded), then leave without unwinding.
        stopper = threading.Thread(target=_shutdown_ray, daemon=True)
        stopper.start()
        stopper.join(timeout=20)
        sys.stdout.flush()
        os._exit(3)

    threading.Thread(target=watchdog, daemon=True, name="rllib-server-watchdog").start()
    # SIGTERM (e.g. from a test's cleanup) ends the run through the finally below.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    patch_onnx_export()
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=args.object_store_mb * 1024 * 1024,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        algo = build_algo(args)
        log(f"PPO built in {time.monotonic() - started:.1f} s; env runner listens on port {args.port} "
            f"(train_batch_size {args.train_batch_size})")
        for i in range(1, args.iters + 1):
            result = algo.train()
            ret = find(result, "episode_return_mean")
            steps = find(result, "num_env_steps_sampled_lifetime")
            seq = getattr(algo.env_runner, "_weights_seq_no", None)
            summary["iterations"] = i
            summary["env_steps_sampled"] = steps
            summary["episode_return_mean"] = ret
            summary["weights_seq_no"] = seq
            summary["history"].append({"iteration": i, "env_steps": steps, "episode_return_mean": ret,
                                       "weights_seq_no": seq, "t": round(time.monotonic() - started, 2)})
            summary["probe_obs"] = PROBE_OBS
            summary["probe_logits"] = probe_logits(algo)
            write_summary()
            ret_text = "n/a" if ret is None else f"{float(ret):.1f}"
            log(f"iteration {i}/{args.iters} | env steps {steps} | episode_return_mean {ret_text} | "
                f"weights_seq_no {seq} | {time.monotonic() - started:.1f} s")
        summary["finished"] = True
        write_summary()
        log("done")
        algo.stop()
    finally:
        _shutdown_ray()
        if own_logdir:
            shutil.rmtree(args.logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
