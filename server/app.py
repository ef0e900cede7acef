"""Runs a Tether server until it is told to stop (signal, target reached, budget spent)."""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import time
from pathlib import Path
from typing import Any

from .config import ConfigError, ServerConfig, host_in_url
from .distributed.rank_config import config_for_rank, prepare_rank_folder
from .distributed.rank_group import RankGroup, RankGroupError, RankPlace
from .module_runtime import resolve_device
from .module_setup import MappingFn, build_layout
from .transport.tcp import TetherServer
from .trainer import Trainer


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


async def _start_console(config: ServerConfig, trainer: Trainer, server: TetherServer,
                         group_console: bool = False) -> Any:
    """The live console on --console-port (None when it is off). Several ranks with a console
    (``group_console``): every rank keeps the console's view of its clients, for rank 0's page."""
    from .console.state import SAVED_RUN, ConsoleState

    reports = trainer.rank_reports
    if config.console_port is None:
        if group_console and reports is not None:  # (rank r > 0: its clients, reported to rank 0's console)
            reports.collector = server.service.observer = ConsoleState(trainer, clients_only=True)
        return None
    from .console.server import ConsoleServer

    state = ConsoleState(trainer)
    server.service.observer = state
    if reports is not None:
        reports.collector = state
    console = ConsoleServer(state, config.console_host, config.console_port, config.auth_token,
                            save_to=Path(config.logdir) / SAVED_RUN)
    await console.start()
    if config.auth_token:  # the operator's secret is not written into logs; they know it
        print(f"[tether] console: {console.url} (add ?token= and the server's --auth-token)", flush=True)
    else:  # always printed (also with --quiet): the address carries the control token made at start
        print(f"[tether] console: {console.url}", flush=True)
    return console


async def serve(
    config: ServerConfig, ready: asyncio.Event | None = None, mapping_fn: MappingFn | None = None
) -> dict[str, Any]:
    """Serve until stopped; returns the run summary (also written to summary_file).

    ``mapping_fn(agent_id, episode_id) -> module`` replaces the declarative
    policy_mapping rules; clients then ask the server with MAP_AGENTS.
    """
    started = time.time()
    group = None
    place = RankPlace.from_environment()
    group_console = config.console_port is not None
    if place is not None:  # started by torchrun on several ranks (docs/scale-out.md)
        config = config_for_rank(config, place)
    try:
        layout = build_layout(config, mapping_fn)
        if place is not None:  # (a configuration that cannot run fails first, with nothing moved)
            prepare_rank_folder(config, place)
            group = RankGroup(place, resolve_device(config.device), config.group_timeout_s,
                              config.group_start_timeout_s)
        trainer = Trainer(config, layout, group)
    except (ValueError, RankGroupError) as exc:  # (CheckpointError included; a group that did not start)
        if group is not None:
            group.close()
        if isinstance(exc, RankGroupError):
            raise
        raise ConfigError(str(exc)) from None
    if group is not None:
        try:  # (every rank done with its start, the first checkpoint included, before any listens)
            group.meet("serving")
        except RankGroupError:
            trainer.close_at_start()
            group.close()
            raise
    server = TetherServer(trainer)
    await server.start()
    port = server.port  # (the summary's: the listening socket is gone by then)
    if group is not None:
        try:
            trainer.join_the_directory(port)
        except RankGroupError:  # (nothing was served yet: no checkpoint to write, the first one is on disk)
            await server.stop()
            await trainer.close(checkpoint=False)
            group.close()
            raise
    trainer.start()
    console = await _start_console(config, trainer, server, group_console)
    websocket = None
    if config.ws_port is not None:
        from .transport.websocket import PATH, WebSocketRLlink

        websocket = WebSocketRLlink(server, config.host, config.ws_port)
        await websocket.start()
        print(f"[tether] RLlink over websockets: ws://{host_in_url(config.host)}:{websocket.port}{PATH}", flush=True)
    _tune_garbage_collector()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, trainer.request_stop, "signal")
        except (NotImplementedError, RuntimeError):  # not the main thread, or not supported
            pass
    if not config.quiet:
        modules = ", ".join(
            f"{m} (obs {list(rt.spec.observation_space.shape)}, action {rt.spec.action_space.to_json()}"
            f"{'' if rt.spec.trainable else ', frozen'})"
            for m, rt in trainer.modules.items()
        )
        print(
            f"[tether] serving on {host_in_url(config.host)}:{server.port} | modules: {modules} | device {trainer.device} | "
            f"train_batch_size {config.train_batch_size} agent steps"
            + (f" | rank {group.rank} of {group.world_size}" if group is not None else ""),
            flush=True,
        )
    if ready is not None:
        ready.set()
    try:
        await trainer.stop_requested.wait()
        if trainer.stop_reason in ("stop_at_return", "max_env_steps"):
            # The run is done, not interrupted: clients are told so, and do not reconnect (§6.6).
            await server.say_goodbye(trainer.training_summary())
    finally:
        if websocket is not None:
            await websocket.stop()
        if console is not None:
            await console.stop()
        await server.stop()
        # A rank whose group failed keeps its last periodic checkpoint, taken at the same update as every
        # other rank's (updates are agreed): one now could be ahead of a dead rank's, or hold a torn update.
        await trainer.close(checkpoint=trainer.stop_reason != "rank_failed")
        if group is not None:
            group.close()
    m = trainer.metrics
    summary = {
        "started_at": started,
        "reached_target_at": trainer.stop_rule.reached_target_at,
        "env_steps_at_target": trainer.stop_rule.env_steps_at_target,
        # Env steps: one per environment step; agent steps: one per decision of an agent or group.
        "env_steps": m.env_steps_received,
        "agent_steps": m.agent_steps_received,
        "agent_steps_trained": m.agent_steps_trained,
        "target_confirmed_at": trainer.stop_rule.target_confirmed_at,
        # The windowed mean return that confirmed stop_at_return (a group's: the same on every rank).
        "return_mean_at_target": trainer.stop_rule.return_mean_at_target,
        "updates_discarded": m.updates_discarded,
        # Data of a client whose steps made an update non-finite, left out of it (and the updates that did so).
        "agent_steps_isolated": m.agent_steps_isolated,
        "updates_isolated": m.updates_isolated,
        "clients_refused": m.clients_refused,
        "episodes_excluded": m.episodes_excluded,
        # Agent steps still waiting in the pool (in the final checkpoint; trained after --resume).
        "pool_steps": trainer.pool_steps,
        # Batches answered although the journal could not write them (disk full or failing).
        "journal_failures": trainer.journal.failures if trainer.journal is not None else 0,
        "pool_steps_max": m.pool_steps_max,
        "batches_duplicate": trainer.dedup.duplicates,
        "updates": m.updates,
        "weights_seq_no": trainer.weights_seq_no,
        "return_mean": m.return_mean,
        "episodes": m.episodes_total,
        "samples_dropped_stale": m.samples_dropped_stale,
        "samples_refused_stale": m.samples_refused_stale,
        "record_share": m.record_share,
        "checkpoint": str(trainer.checkpoint_path),
        "policy": str(trainer.policy_path()),
        "policies": {mid: str(trainer.policy_path(mid)) for mid in trainer.policy_modules()},
        "agent_return_mean": m.agent_return_mean,
        "module_return_mean": {k: sum(v) / len(v) for k, v in m.module_returns.items()},
        "modules_weights_seq_no": {mid: rt.weights_seq_no for mid, rt in trainer.modules.items()},
        "wall_s": time.time() - started,
    }
    summary["run_id"] = trainer.run_id
    if group is not None:
        loop = trainer.learner_loop
        summary["group"] = {"rank": group.rank, "world_size": group.world_size, "port": port,
                            "env_steps": getattr(loop, "group_env_steps", None),
                            "agreements": getattr(loop, "agreements", None), "failure": getattr(loop, "failure", None),
                            "update_comm_s": getattr(loop, "update_comm_s", None),
                            "run_id": trainer.run_id}
        directory = trainer.directory
        if directory is not None:  # (every rank's client address; the clients this rank redirected, per rank)
            summary["group"].update(addresses=directory.addresses, redirected=directory.redirected)
        reports = trainer.rank_reports
        if reports is not None and reports.latest:  # (rank 0: every rank's last report, as its console showed it)
            summary["group"]["ranks"] = reports.rows()
    if trainer.self_play is not None:
        summary["self_play"] = trainer.self_play.summary()
    if trainer.curriculum is not None:
        summary["curriculum"] = trainer.curriculum.summary()
    if config.summary_file:
        Path(config.summary_file).write_text(json.dumps(summary, indent=2))
    return summary


def run(config: ServerConfig) -> dict[str, Any]:
    """Blocking entry point."""
    return asyncio.run(serve(config))
