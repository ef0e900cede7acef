"""Which checkpoint a group resumes from: the same update on every rank.

Every rank writes its checkpoint at the same agreed update, but a rank killed while writing keeps the
one before while the others wrote the new one. Resumed as they are, the others' weights would already
hold the updates that trained on the dead rank's journaled steps, which that rank then replays and
trains again. So with several ranks each keeps its previous checkpoint beside the current one
(``checkpoint.prev.pt``) and the journal since that previous one, and at a resume the ranks agree on the
newest update every rank has a checkpoint of; a rank that holds a newer one goes back to its previous
one and replays its journal from there, as the dead rank does.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..checkpoint import load_checkpoint
from ..pool_journal import journal_files

if TYPE_CHECKING:
    from .rank_group import RankGroup


def previous_path(path: str | Path) -> Path:
    """Where a rank keeps the checkpoint before its current one."""
    p = Path(path)
    return p.with_name(f"{p.stem}.prev{p.suffix}")


def keep_as_previous(path: str | Path) -> None:
    """The current checkpoint becomes the previous one, while ``path`` still holds it until the new one
    replaces it (a hard link, else a copy, renamed into place): a reader never finds no checkpoint."""
    path, previous = Path(path), previous_path(path)
    staged = previous.with_name(previous.name + ".tmp")
    staged.unlink(missing_ok=True)
    try:
        os.link(path, staged)
    except OSError:  # (a file system without hard links)
        shutil.copy2(path, staged)
    os.replace(staged, previous)


def restart_checkpoint(own: str, origin: str | None) -> str:
    """Where a rank restarted by torchrun resumes: ``own`` (its folder's checkpoint path), which holds the
    run's checkpoints and journal, unless the run was forked from ``origin`` (another folder's, the command
    line's --resume) and its first attempt died before writing one here: then from ``origin`` again, as
    that attempt did. (The first attempt of a new or forked run removed the checkpoints another run left
    in the folder, ``clear_for_a_new_run``, so any found here are this run's.) Each rank decides alone and
    the group still resumes together: a rank without its own checkpoint never served, so nothing of the
    run is lost, and the ones written hold the update the fork started from, which ``origin`` holds."""
    if origin is None or Path(origin).resolve() == Path(own).resolve():
        return own
    return own if Path(own).exists() or previous_path(own).exists() else origin


def clear_for_a_new_run(own: str | Path, resume: str | None) -> list[Path]:
    """A group's first attempt of a run that does not resume this folder (a new run, or one forked from
    another folder's checkpoint): the checkpoints another run left at ``own`` are moved aside (renamed
    ``<name>.replaced``, replacing an older such copy) before the group starts, so that torchrun's restart,
    which goes on from this folder, never takes them for this run's, even when the attempt dies before
    writing its first (which would have replaced them). A ``resume`` in this folder (its current or its
    previous checkpoint, however the path is written) leaves it as it is; one in another folder that does
    not exist is refused (ValueError): forking from nothing is a mistyped path. Returns the files moved."""
    own = Path(own)
    if resume is not None:
        source = Path(resume)
        if _same_folder(source.parent, own.parent):
            return []
        if not source.exists():
            raise ValueError(f"--resume {resume}: no such checkpoint (a run that resumes another folder's "
                             "checkpoint needs it on every rank)")
    moved = []
    for path in (own, previous_path(own)):
        if path.exists():
            aside = path.with_name(path.name + ".replaced")
            os.replace(path, aside)
            moved.append(aside)
    return moved


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)  # (symlinks, a case-insensitive file system, '..')
    except OSError:  # (one does not exist yet)
        return a.resolve() == b.resolve()


def checkpoints_held(path: str | Path) -> dict[int, str]:
    """This rank's checkpoints at ``path`` and beside it, by the update they were taken at (a file that
    cannot be read counts as none, and so does a previous one of another run than the current one's)."""
    held: dict[int, str] = {}
    runs: list[object] = []
    for candidate in (Path(path), previous_path(path)):
        if not candidate.exists():
            continue
        try:
            state = load_checkpoint(candidate)
            updates = int(state["counters"]["updates"])
        except Exception:  # (a torn or foreign file: not one to resume from)
            continue
        if runs and state.get("run_id") != runs[0]:
            continue  # (left by an older run in this folder)
        runs.append(state.get("run_id"))
        held.setdefault(updates, str(candidate))
    return held


def common_update(held_by_rank: list[list[int]], journaled_by_rank: list[bool] | None = None) -> int | None:
    """The update every rank resumes from: the newest one every rank holds a checkpoint of. A rank that
    holds none and has no journal is new to the group (it starts from rank 0's weights) and does not
    count. None: a rank holds no checkpoint but has a journal (killed while writing its first one), so
    every rank starts from its journal alone, which is only possible while no rank has trimmed its
    journal (holds a previous checkpoint). ValueError when the ranks cannot resume together."""
    journaled = journaled_by_rank or [True] * len(held_by_rank)
    counted = [held for held, journal in zip(held_by_rank, journaled) if held or journal]
    if not counted:
        return None
    if any(not held for held in counted):
        if any(len(held) > 1 for held in counted):
            raise ValueError(f"a rank holds no checkpoint but has a journal, while another has already trimmed its "
                             f"journal ({held_by_rank}): the group cannot resume together; start a new run")
        return None
    common = set(counted[0]).intersection(*map(set, counted[1:]))
    if not common:
        raise ValueError(f"the ranks hold checkpoints of no common update ({held_by_rank}): resume them from "
                         "checkpoints of one run, or start a new run")
    return max(common)


def make_current(chosen: str, path: str | Path) -> None:
    """After resuming from the previous checkpoint: it becomes the current one again (the newer one
    belonged to updates the group no longer has)."""
    if Path(chosen) != Path(path):
        os.replace(chosen, path)


def groups_checkpoint(group: "RankGroup", path: str) -> str | None:
    """The checkpoint this rank resumes from (``path``: the one the command line names), of the update
    every rank holds one of; None when some rank holds none (every rank replays its journal alone), or
    when this rank is new to the group (rank 0's weights are given to it). A collective of the group."""
    held = checkpoints_held(path)
    journaled = bool(journal_files(Path(path).parent / "journal"))
    group.meet("choosing a checkpoint")
    theirs = group.gather_objects((sorted(held), journaled))
    target = common_update([h for h, _ in theirs], [j for _, j in theirs])
    if target is None:
        if held:
            print(f"[tether] rank {group.rank}: another rank has no checkpoint yet; every rank starts "
                  "from its journal alone", flush=True)
        return None
    if target not in held:
        return None
    if held[target] != str(path):
        print(f"[tether] rank {group.rank}: resuming from {held[target]} (update {target}), the newest update "
              "every rank has a checkpoint of", flush=True)
    return held[target]
