"""An update that leaves out the data that makes it non-finite.

A batch pools the data of many clients; one client's data (rewards of 3e38,
say, with honest log-probabilities) makes the whole update non-finite. Instead
of discarding everyone's data, ``update_isolating`` finds the sources whose
data is to blame and trains once on the data of the others:

1. a screen without any trial: a source with a step the learner cannot train
   on whatever else the batch holds (``PPOLearner.untrainable_steps``: a value
   target that is not finite or overflows the value loss) is left out;
2. the update on the rest; if it is non-finite, trial updates (each rolled
   back) bisect the sources: with a set of sources known to train finitely
   together (``clean``), the suspects are halved until one source is left
   whose data turns a finite update non-finite (when the halving ends on a
   source with no clean one yet, the others are tried without it). It is left
   out and the update is retried on the others. A source is only blamed next to
   a clean one: a learner that cannot train on anything (its own divergence)
   blames no one.

A source that tips a clean set over is blamed only if its data alone trains
non-finitely as well (one more trial, on its data only): whether a mix
overflows can hang on which steps share a minibatch, so without that check
an honest source could be blamed for a neighbour's near-overflowing steps.
Else it is left out of this update without blame.

At most ``3 * ceil(log2(sources)) + 2`` updates are run (the first included),
so an update costs a bounded multiple of a plain one. When the trials run
out first, the update is the one on the clean sources (if any), and the
sources not cleared are left out unblamed; when no source trains finitely,
nothing is trained (as for any non-finite update).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Sequence

from tether.protocol.episodes import EpisodeChunk

from .ppo import NonFiniteUpdate, PPOLearner


@dataclass
class IsolatedUpdate:
    """What ``update_isolating`` did.

    ``stats`` is None when nothing was trained (then the learner is as before).
    ``kept`` are the sources trained on; ``guilty`` maps each source whose data
    was found to make the update non-finite to why. Sources in neither were
    left out without blame (the trials ran out before they were cleared).
    ``error`` is the last NonFiniteUpdate seen (None if the first try was
    finite), or the exception that failed the update; ``trials`` counts the
    updates run, the kept one included.
    """

    stats: dict[str, float] | None
    kept: list[Hashable]
    guilty: dict[Hashable, str] = field(default_factory=dict)
    error: Exception | None = None
    trials: int = 0


def trial_budget(sources: int) -> int:
    """The most updates ``update_isolating`` runs for a batch of ``sources`` sources."""
    return 3 * math.ceil(math.log2(max(1, sources))) + 2


def screen_sources(learner: PPOLearner, items: Sequence[tuple[Hashable, EpisodeChunk]]) -> dict[Hashable, str]:
    """The sources with a step the learner cannot train on whatever else the batch holds
    (``PPOLearner.untrainable_steps``), each with why: one forward pass, no update."""
    guilty: dict[Hashable, str] = {}
    if items:
        bad = learner.untrainable_steps(learner.batch_of([chunk for _, chunk in items]))
        if bad.any():
            pos = 0
            for source, chunk in items:
                if bad[pos:pos + chunk.env_steps].any():
                    guilty.setdefault(source, "value targets not finite or beyond float32's range, or (a model "
                                              "with memory) behaviour log-probabilities no recent policy gives")
                pos += chunk.env_steps
    return guilty


def update_isolating(learner: PPOLearner, items: Sequence[tuple[Hashable, EpisodeChunk]]) -> IsolatedUpdate:
    """Train ``learner`` on ``items`` ((source, chunk) pairs, in pool order), leaving out
    the sources whose data makes the update non-finite (see the module docstring)."""
    order: list[Hashable] = []
    for source, _ in items:
        if source not in order:
            order.append(source)
    # 1. The screen: one forward pass of the critic, no trial.
    guilty = screen_sources(learner, items)
    remaining = [s for s in order if s not in guilty]
    if not remaining:
        return IsolatedUpdate(None, [], guilty)
    # 2. Trials, each starting from the learner's state now.
    base = learner.save_state()
    budget = trial_budget(len(remaining))
    trials = 0
    last_error: NonFiniteUpdate | None = None
    #: The last finite trial that was rolled back: (sources, state after it, stats), reused if asked again.
    memo: tuple[frozenset, tuple, dict] | None = None
    #: Sources whose data alone trained non-finitely; and those left out without blame.
    failed_alone: set[Hashable] = set()
    excused: set[Hashable] = set()

    def trial(sources: list[Hashable], keep: bool) -> dict[str, float] | None:
        nonlocal trials, last_error, memo
        wanted = set(sources)
        if memo is not None and memo[0] == wanted:
            if keep:
                learner.load_state(memo[1])
            return memo[2]
        trials += 1
        try:
            stats = learner.update(learner.batch_of([chunk for source, chunk in items if source in wanted]))
        except NonFiniteUpdate as exc:
            last_error = exc
            learner.load_state(base)
            if len(wanted) == 1:
                failed_alone.update(wanted)
            return None
        if not keep:
            memo = (frozenset(wanted), learner.save_state(), stats)
            learner.load_state(base)
        return stats

    stats = trial(remaining, keep=True)
    if stats is not None:
        return IsolatedUpdate(stats, remaining, guilty, None, trials)
    clean: list[Hashable] = []
    suspects = list(remaining)  # invariant: clean + suspects trains non-finitely, clean alone finitely
    while trials < budget:
        while len(suspects) > 1 and trials < budget:
            half, rest = suspects[:len(suspects) // 2], suspects[len(suspects) // 2:]
            if trial(clean + half, keep=False) is not None:
                clean, suspects = clean + half, rest
            else:
                suspects = half
        if len(suspects) == 1 and not clean and trials < budget:
            # The first sources' halves held the suspect: it trains non-finitely on its own. The
            # others, without it, decide whether it is to blame or the learner trains on nothing.
            others = [s for s in remaining if s != suspects[0]]
            if others and trial(others, keep=False) is not None:
                clean = others
        if len(suspects) != 1 or not clean:
            break  # out of trials, or nothing trains finitely: no source can be blamed
        suspect = suspects[0]
        if suspect not in failed_alone:
            # Whether a mix overflows can hang on which steps share a minibatch (the shuffle differs
            # with the batch), so a source that tips a clean set over is blamed only if its own data
            # trains non-finitely too; else it is left out of this update, unblamed. Data of the
            # magnitudes environments produce trains finitely alone: its client is never blamed.
            if trials >= budget:
                break
            if trial([suspect], keep=False) is not None:
                excused.add(suspect)
        if suspect not in excused:
            guilty[suspect] = f"made the update non-finite ({last_error})"
        remaining = [s for s in remaining if s not in guilty and s not in excused]
        if not remaining:
            break
        if trials >= budget:
            break
        stats = trial(remaining, keep=True)
        if stats is not None:
            return IsolatedUpdate(stats, remaining, guilty, last_error, trials)
        suspects = [s for s in remaining if s not in clean]
    # Out of trials: the sources known to train finitely together, if that costs no more than allowed.
    if clean and (trials < budget or (memo is not None and memo[0] == set(clean))):
        stats = trial(clean, keep=True)
        if stats is not None:
            return IsolatedUpdate(stats, clean, guilty, last_error, trials)
    learner.load_state(base)
    return IsolatedUpdate(None, [], guilty, last_error, trials)
