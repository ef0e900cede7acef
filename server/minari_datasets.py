"""**[1.6]** Demonstrations as Minari datasets (the Farama standard for offline RL data).

A Minari dataset is a folder (``<dataset>/data/main_data.hdf5`` and ``metadata.json``); local
folders only, nothing is fetched. One dataset holds one module's episodes (a Minari dataset has
one observation and one action space). Logged steps (§10.1) travel as the per-step info
``logged``; a Dict or Tuple observation space as Minari's nested observations (dicts and tuples of
leaf arrays). ``load_demonstrations`` opens either form: a ``.jsonl`` demonstration file (§18) or a
Minari dataset folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tether.protocol.demonstrations import (DemonstrationError, Demonstrations, episode_from_line,
                                            read_demonstrations)
from tether.protocol.episodes import EpisodeChunk
from tether.protocol.multi_agent import ModuleSpec
from tether.protocol.spaces import Box, Dict, Space, from_gymnasium, is_composite, leaf_arrays, to_gymnasium

#: The Minari namespace datasets are written under (a Minari dataset id is ``namespace/name-vN``).
NAMESPACE = "tether"


def load_demonstrations(path: str | Path, module: str) -> Demonstrations:
    """The demonstrations at ``path``: a demonstration file (§18), or a Minari dataset folder whose
    episodes are taken as ``module``'s. Raises DemonstrationError naming what is wrong."""
    path = Path(path)
    if path.is_dir():
        return read_minari(path, module)
    if not path.exists():
        raise DemonstrationError(0, f"no demonstrations at {str(path)!r} (a .jsonl demonstration file or a Minari "
                                    f"dataset folder)")
    return read_demonstrations(path)


def _data_dir(path: Path) -> Path:
    for candidate in (path / "data", path):
        if (candidate / "metadata.json").is_file():
            return candidate
    raise DemonstrationError(0, f"{str(path)!r} is not a Minari dataset folder (no data/metadata.json)")


def read_minari(path: str | Path, module: str) -> Demonstrations:
    """A Minari dataset folder's episodes as ``module``'s demonstrations, each checked as a
    demonstration file's line would be (§18: the spaces, the actions, finite values)."""
    import minari

    data = _data_dir(Path(path))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dataset = minari.MinariDataset(str(data))
            spec = ModuleSpec(module, from_gymnasium(dataset.observation_space),
                              from_gymnasium(dataset.action_space))  # type: ignore[arg-type]
    except DemonstrationError:
        raise
    except Exception as exc:  # (h5py and minari raise many kinds for a corrupt or truncated file)
        raise DemonstrationError(0, f"cannot read the Minari dataset {str(path)!r}: {exc}") from None
    out = Demonstrations({module: spec})
    try:
        episodes = list(dataset.iterate_episodes())
    except Exception as exc:
        raise DemonstrationError(0, f"cannot read the episodes of {str(path)!r}: {exc}") from None
    for episode in episodes:
        steps = len(episode.actions)
        logged = np.asarray((episode.infos or {}).get("logged", np.zeros(steps + 1, bool)), bool)[:steps]
        line: dict[str, Any] = {
            "module": module, "agent_id": "default_agent", "episode_id": str(episode.id),
            "obs": _wire_observations(spec.observation_space, episode.observations),
            "actions": np.asarray(episode.actions).tolist(),
            "rewards": np.asarray(episode.rewards, np.float64).tolist(),
            "is_terminated": bool(np.asarray(episode.terminations)[-1]) if steps else False,
            "is_truncated": bool(np.asarray(episode.truncations)[-1]) if steps else False,
        }
        if logged.any():
            line["logged_runs"] = [[int(t), 1] for t in np.flatnonzero(logged)]
        try:
            out.episodes.append(episode_from_line(line, 0, out.modules))  # (one checker for both forms)
        except DemonstrationError as exc:
            raise DemonstrationError(0, f"episode {episode.id} of {str(path)!r}: {str(exc).removeprefix('line 0: ')}"
                                     ) from None
    return out


def write_minari(demos: Demonstrations, module: str, out_dir: str | Path, name: str = "demonstrations") -> Path:
    """``module``'s episodes of ``demos`` as a Minari dataset in the folder ``out_dir`` (which must not
    exist); returns it. The dataset id is ``tether/<name>-v0``."""
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    out = Path(out_dir)
    if out.exists():
        raise FileExistsError(f"{str(out)!r} exists: choose a new folder for the Minari dataset")
    spec = demos.modules[module]
    obs_space = to_gymnasium(spec.observation_space)
    act_space = to_gymnasium(spec.action_space)
    buffers = []
    for i, episode in enumerate(demos.of_module(module)):
        chunk: EpisodeChunk = episode.chunk
        steps = chunk.env_steps
        logged = np.zeros(steps + 1, bool)
        if chunk.logged is not None:
            logged[:steps] = chunk.logged
        if is_composite(spec.observation_space):
            obs = _nested_observations(spec.observation_space, leaf_arrays(spec.observation_space, chunk.obs))
        else:
            obs = chunk.obs.astype(obs_space.dtype, copy=False) if isinstance(obs_space, gym.spaces.Box) else chunk.obs
        actions = chunk.actions.astype(np.float32) if isinstance(spec.action_space, Box) else chunk.actions
        buffers.append(EpisodeBuffer(id=i, observations=obs, actions=actions, rewards=chunk.rewards.astype(np.float64),
                                     terminations=np.eye(1, steps, steps - 1, dtype=bool)[0] & chunk.is_terminated,
                                     truncations=np.eye(1, steps, steps - 1, dtype=bool)[0] & (not chunk.is_terminated),
                                     infos={"logged": logged}))
    with tempfile.TemporaryDirectory(dir=out.parent if out.parent.exists() else None) as root:
        previous = os.environ.get("MINARI_DATASETS_PATH")
        os.environ["MINARI_DATASETS_PATH"] = root
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                minari.create_dataset_from_buffers(
                    f"{NAMESPACE}/{name}-v0", buffers, observation_space=obs_space, action_space=act_space,
                    data_format="hdf5", algorithm_name="tether demonstrations", author="tether",
                    author_email="none", code_permalink="none",
                    description=f"module {module!r}: episodes recorded through a Tether SDK")
        finally:
            if previous is None:
                os.environ.pop("MINARI_DATASETS_PATH", None)
            else:
                os.environ["MINARI_DATASETS_PATH"] = previous
        shutil.move(str(Path(root) / NAMESPACE / f"{name}-v0"), str(out))
    return out


def _wire_observations(space: Space, observations: Any) -> Any:
    """A Minari episode's observations in an episode line's form: for a Dict or Tuple space, one member
    per leaf path (§8.6), read from Minari's nested dicts and tuples; else one array."""
    if not is_composite(space):
        return np.asarray(observations).tolist()
    members = {}
    for leaf in space.leaves:
        value = observations
        for part in leaf.path.split("."):  # (a Dict key has no '.'; a Tuple's index is a number)
            try:
                value = value[part] if isinstance(value, Mapping) else value[int(part)]
            except (KeyError, IndexError, ValueError, TypeError):
                raise DemonstrationError(0, f"the dataset's observations have no leaf {leaf.path!r}") from None
        members[leaf.path] = np.asarray(value).tolist()
    return members


def _nested_observations(space: Space, leaves: dict[str, np.ndarray], prefix: str = "") -> Any:
    """Leaf arrays by path as Minari's nested dicts (a Dict) and tuples (a Tuple), each leaf in its
    gymnasium space's element type."""
    if not is_composite(space):
        path, values = prefix.rstrip("."), leaves[prefix.rstrip(".")]
        dtype = to_gymnasium(space).dtype
        if np.issubdtype(dtype, np.integer) and not np.array_equal(values, np.rint(values)):
            raise DemonstrationError(0, f"leaf {path!r} holds a value that is not an integer, which its "
                                        f"{type(space).__name__} space in a Minari dataset cannot hold")
        return np.rint(values).astype(dtype) if np.issubdtype(dtype, np.integer) else values.astype(dtype, copy=False)
    if isinstance(space, Dict):
        return {key: _nested_observations(child, leaves, f"{prefix}{key}.") for key, child in space.spaces}
    return tuple(_nested_observations(child, leaves, f"{prefix}{i}.") for i, child in enumerate(space.spaces))
