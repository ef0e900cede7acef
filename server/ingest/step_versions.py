"""Which weights version each stored step was computed with: what a message claims (per
module, or per step in ``weights_seq_no_runs``), and the mark of steps whose claim could
not be checked, which no staleness bound admits."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from tether.protocol.episodes import EpisodeChunk

#: The version given to data whose claimed weights version could not be checked:
#: never a kept version, so such data counts as stale and is not trained on.
UNVERIFIED_VERSION = -1
#: The version such steps are judged by: no staleness bound admits it.
NEVER_FRESH = -(2**62)


def claimed_versions(message: dict[str, Any], last_sent: dict[str, int], default_module: str | None,
                     modules: Iterable[str]) -> dict[str, int]:
    """The weights version per module the message's data was computed with: as it claims (per
    module, 1.2; one number for the default module, 1.1), else the last one sent to its connection."""
    versions = dict(last_sent)
    per_module = message.get("weights_seq_nos")
    single = message.get("weights_seq_no")
    if isinstance(per_module, dict):
        versions.update({m: v for m, v in per_module.items() if isinstance(v, int) and not isinstance(v, bool)})
    elif isinstance(single, int) and not isinstance(single, bool) and default_module is not None:
        versions[default_module] = single
    for module_id in modules:
        versions.setdefault(module_id, 0)
    return versions


def mark_unverified(records: list, kept: dict[str, set[int]]) -> None:
    """Steps whose own version (weights_seq_no_runs) is not kept now could not be checked: they are
    given UNVERIFIED_VERSION, so they are never trained, even if that version is published while the
    message waits for room."""
    for record in records:
        for agent in record.agents:
            versions = agent.chunk.step_versions
            if versions is not None and agent.module_id in kept:
                versions[~np.isin(versions, list(kept[agent.module_id]))] = UNVERIFIED_VERSION


def step_versions(chunk: EpisodeChunk, claim: int) -> np.ndarray:
    """The weights version of each step: from the chunk's weights_seq_no_runs, else the message's
    ``claim`` for its module. Steps the behaviour-logp check could not check were marked
    UNVERIFIED_VERSION on arrival (see the ingest pipeline): they get a version no staleness allows."""
    if chunk.step_versions is None:
        versions = np.full(chunk.env_steps, claim, np.int64)
    else:
        versions = chunk.step_versions.astype(np.int64, copy=False)
    return np.where(versions == UNVERIFIED_VERSION, NEVER_FRESH, versions)
