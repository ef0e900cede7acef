"""Runs a Tether server until it is told to stop (signal, target reached, budget spent)."""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import time
from pathlib import Path
from typing import Any

from sdk_python.protocol.spaces import Space, from_gymnasium, space_from_json

from .config import ServerConfig
from .tcp_server import TetherServer
from .trainer import Trainer


def resolve_spaces(config: ServerConfig) -> tuple[Space, Space]:
    """Spaces from the config's JSON, else from the gymnasium env named in ``env``."""
    obs = space_from_json(config.observation_space) if config.observation_space else None
    act = space_from_json(config.action_space) if config.action_space else None
    if obs is None or act is None:
        if not config.env:
            raise ValueError("give observation_space and action_space, or env (a gymnasium env id)")
        import gymnasium as gym

        env = gym.make(config.env)
        obs = obs or from_gymnasium(env.observation_space)
        act = act or from_gymnasium(env.action_space)
        env.close()
    return obs, act


def _tune_garbage_collector() -> None:
    """Keep full collections off the ingest path.

    Importing torch leaves ~200k long-lived objects; decoding one 4000-step
    message creates ~8k lists, so with default thresholds a full collection
    (tens of ms, re-scanning those imports) ran every few messages and cut
    ingest by a factor of ~3.5. Freezing the import-time objects and raising
    the first threshold fixes that; decoded JSON trees hold no cycles.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


async def serve(config: ServerConfig, ready: asyncio.Event | None = None) -> dict[str, Any]:
    """Serve until stopped; returns the run summary (also written to summary_file)."""
    started = time.time()
    observation_space, action_space = resolve_spaces(config)
    trainer = Trainer(config, observation_space, action_space)
    server = TetherServer(trainer)
    await server.start()
    _tune_garbage_collector()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, trainer.stop_requested.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or not supported
            pass
    if not config.quiet:
        print(
            f"[tether] serving on {config.host}:{server.port} | obs {observation_space.to_json()['type']}"
            f"{list(observation_space.shape)} | action {action_space.to_json()} | device {trainer.device} | "
            f"train_batch_size {config.train_batch_size}",
            flush=True,
        )
    if ready is not None:
        ready.set()
    try:
        await trainer.stop_requested.wait()
    finally:
        await server.stop()
        await trainer.close(checkpoint=True)
    m = trainer.metrics
    summary = {
        "started_at": started,
        "reached_target_at": trainer.reached_target_at,
        "env_steps_at_target": trainer.env_steps_at_target,
        "env_steps": m.env_steps_received,
        "updates": m.updates,
        "weights_seq_no": trainer.weights_seq_no,
        "return_mean": m.return_mean,
        "episodes": m.episodes_total,
        "samples_dropped_stale": m.samples_dropped_stale,
        "checkpoint": str(trainer.checkpoint_path),
        "policy": str(trainer.policy_path),
        "wall_s": time.time() - started,
    }
    if config.summary_file:
        Path(config.summary_file).write_text(json.dumps(summary, indent=2))
    return summary


def run(config: ServerConfig) -> dict[str, Any]:
    """Blocking entry point."""
    return asyncio.run(serve(config))
