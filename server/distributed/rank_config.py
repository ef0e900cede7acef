"""One rank's server configuration, from the group's command line (every rank runs the same one).

* port: ``--port P`` is the node's first port; local rank ``i`` listens on ``P + i`` (``0``: each
  rank picks a free port and prints it). A fleet spreads its clients over the node's ports.
* logdir: each rank writes ``<logdir>/rank-<r>/`` (its checkpoint, journal, policies, TensorBoard).
* resume: ``--resume <logdir>/checkpoint.pt`` (the group's path) resumes each rank from
  ``<logdir>/rank-<r>/checkpoint.pt``, so the same command line serves a fresh start and torchrun's
  restarts (a rank with no checkpoint yet starts fresh, as a lone server does); a restart by
  torchrun of a command line without ``--resume`` resumes from ``<logdir>/checkpoint.pt`` alike, and so
  does one of a run forked from another folder's checkpoint, once it wrote its own there.
* summary_file: rank 0 writes it; rank ``r > 0`` writes ``<name>.rank-<r><suffix>`` beside it.
* device: ``auto`` is ``cuda:<local rank>`` where there are GPUs, one per local rank.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ..config import ServerConfig
from .group_checkpoints import clear_for_a_new_run, restart_checkpoint
from .rank_group import RankPlace


def rank_path(path: str, rank: int) -> str:
    """``dir/name`` of the group -> ``dir/rank-<rank>/name`` of one rank."""
    p = Path(path)
    return str(p.parent / f"rank-{rank}" / p.name)


def prepare_rank_folder(config: ServerConfig, place: RankPlace) -> None:
    """Before a rank starts (``config`` its own, config_for_rank's): at the group's first attempt of a new or
    forked run, the checkpoints another run left in the rank's folder are moved aside (clear_for_a_new_run)."""
    if place.attempt == 0:
        for aside in clear_for_a_new_run(Path(config.logdir) / "checkpoint.pt", config.resume):
            print(f"[tether] rank {place.rank}: a checkpoint of another run in {config.logdir} was moved aside to "
                  f"{aside} (this run starts anew there)", flush=True)


def config_for_rank(config: ServerConfig, place: RankPlace) -> ServerConfig:
    """The configuration rank ``place.rank`` runs (see the module docstring). Every option runs on
    several ranks (self-play too: its ratings are the group's, its snapshots rank 0's exports)."""
    logdir = str(Path(config.logdir) / f"rank-{place.rank}")
    resume = rank_path(config.resume, place.rank) if config.resume else None
    if place.attempt > 0:
        # torchrun restarted the group (--max-restarts): this is the same run, which goes on from each
        # rank's checkpoint in its own logdir (a new run would drop their journals), also when the
        # command line resumed another folder's (a run forked from it: its first attempt checkpointed
        # here at once, and its journal is here), unless that attempt died before it could.
        resume = restart_checkpoint(str(Path(logdir) / "checkpoint.pt"), resume)
    summary = config.summary_file
    if summary and place.rank > 0:
        p = Path(summary)
        summary = str(p.with_name(f"{p.stem}.rank-{place.rank}{p.suffix}"))
    device = config.device
    if device == "auto" and torch.cuda.is_available():
        device = f"cuda:{place.local_rank % torch.cuda.device_count()}"
    return dataclasses.replace(
        config,
        port=config.port + place.local_rank if config.port else 0,
        logdir=logdir,
        resume=resume,
        summary_file=summary,
        device=device,
        # One console for the group: rank 0's, which shows every rank (rank_reports.py).
        console_port=config.console_port if place.rank == 0 else None,
        ws_port=config.ws_port + place.local_rank if config.ws_port else config.ws_port,
    )

