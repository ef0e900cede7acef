"""Self-play: modules that train against snapshots of themselves (or of each other), with ratings.

The run's agents are split into **teams** (glob patterns over agent ids). In every episode one team,
drawn at random, is the **learning team**: its agents act with their modules as the policy mapping
gives them. Each other team plays either the latest policy too (with probability ``latest_share``:
then its steps are trained on as well) or one **snapshot** of its module, drawn from the module's
window of past snapshots by the sampling rule. A snapshot is served as a frozen module of its own,
``<module>@<slot>`` (docs/protocol.md §9.8): the engine's code does not change, its SDK asks the
server for each new agent's module (MAP_AGENTS, the server-side mapping of §9.5) and acts with the
model the server sends for that module. A snapshot's steps are never trained on.

When a game ends, each team's return (its agents' rewards summed over the episode) decides it: the
team with the higher return wins, equal returns are a draw. A game between the learning team and a
snapshot updates both Elo ratings (the formula is in docs/self_play.md). Symmetric games have one
module on every team; asymmetric games (two learning modules, each against the other's snapshots)
have a module per team.

A finished game is first **judged** into a ``GameResult`` (plain values), then **applied** to the
ratings and counts. One server applies each result at once (``episode_part``). Several ranks (docs/
scale-out.md) hold their results (``hold``, ``take_results``) until the group's next update, when
every rank applies every rank's results in rank order (distributed/lockstep_loop.py), so that the
ratings and counts are the group's, the same on every rank.
"""

from __future__ import annotations

import fnmatch
import math
import random
from dataclasses import dataclass, field
from typing import Any, Hashable

#: What separates a module id from its snapshot slot in a snapshot module's id.
SLOT_SEPARATOR = "@"
SAMPLING_RULES = ("uniform", "prioritized")
#: How a game's result is read from the team returns: the higher return wins ("higher_return", for
#: games whose sides' returns compare), or the sign of the learning team's own return ("sign", for
#: asymmetric games whose sides are rewarded on different scales).
OUTCOME_RULES = ("higher_return", "sign")
#: Matches held per owner (a connection or a client_session) for episodes that have not ended; beyond
#: it the owner's oldest is dropped, never rated: a client whose episodes never end (evaluation
#: episodes that ask MAP_AGENTS and send nothing) cannot grow the server's memory or evict others'.
MAX_OPEN_MATCHES_PER_OWNER = 4096
#: The largest window: every slot is a module served to every client and kept in every checkpoint.
MAX_WINDOW = 256


class SelfPlayConfigError(ValueError):
    """A ``self_play`` table the server cannot run; the message names the option."""


@dataclass(frozen=True)
class SelfPlayConfig:
    """The run's ``[self_play]`` table (docs/self_play.md)."""

    #: Glob patterns, one per team: an agent belongs to the first team whose pattern matches its id.
    teams: tuple[str, ...]
    #: Modules that keep snapshots (default: every trainable module an agent of a team maps to).
    modules: tuple[str, ...] = ()
    #: A module takes a snapshot of itself every this many of its updates.
    snapshot_every: int = 10
    #: Snapshots kept per module; the oldest makes room for the next.
    window: int = 10
    #: Share of each opponent team's games played by the latest policy instead of a snapshot.
    latest_share: float = 0.5
    #: How a snapshot is drawn: "uniform" over the window, or "prioritized" by how often it beats the learner.
    sampling: str = "uniform"
    #: Elo: the step size K and the rating a module starts from.
    elo_k: float = 16.0
    initial_rating: float = 1200.0
    #: A team wins when its return exceeds the other's by more than this; otherwise the game is a draw.
    draw_margin: float = 0.0
    #: How a game's result is read (OUTCOME_RULES).
    outcome: str = "higher_return"

    @classmethod
    def from_json(cls, data: Any) -> "SelfPlayConfig":
        if not isinstance(data, dict):
            raise SelfPlayConfigError("self_play must be a table of options")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SelfPlayConfigError(f"self_play: unknown option(s) {unknown}")
        teams = data.get("teams")
        if not isinstance(teams, list) or len(teams) < 2 or not all(isinstance(t, str) and t for t in teams):
            raise SelfPlayConfigError(f"self_play.teams must list at least two agent-id patterns (one per team), "
                                      f"got {teams!r}")
        if len(set(teams)) != len(teams):
            raise SelfPlayConfigError(f"self_play.teams lists a pattern twice: {teams}")
        modules = data.get("modules", [])
        if not isinstance(modules, list) or not all(isinstance(m, str) and m for m in modules):
            raise SelfPlayConfigError(f"self_play.modules must be a list of module ids, got {modules!r}")
        out = cls(teams=tuple(teams), modules=tuple(modules),
                  **{k: data[k] for k in ("snapshot_every", "window", "latest_share", "sampling", "elo_k",
                                          "initial_rating", "draw_margin", "outcome") if k in data})
        for name in ("snapshot_every", "window"):
            value = getattr(out, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SelfPlayConfigError(f"self_play.{name} must be an integer >= 1, got {value!r}")
        if out.window > MAX_WINDOW:
            raise SelfPlayConfigError(f"self_play.window must be at most {MAX_WINDOW} (each slot is a module every "
                                      f"client loads), got {out.window}")
        for name in ("latest_share", "elo_k", "initial_rating", "draw_margin"):
            value = getattr(out, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise SelfPlayConfigError(f"self_play.{name} must be a finite number, got {value!r}")
        if not 0.0 <= out.latest_share < 1.0:
            raise SelfPlayConfigError(f"self_play.latest_share must be in [0, 1) (1 would never play a snapshot), "
                                      f"got {out.latest_share}")
        if out.elo_k <= 0 or out.draw_margin < 0:
            raise SelfPlayConfigError(f"self_play.elo_k must be > 0 and draw_margin >= 0, got {out.elo_k}, "
                                      f"{out.draw_margin}")
        if out.outcome not in OUTCOME_RULES:
            raise SelfPlayConfigError(f"self_play.outcome must be one of {list(OUTCOME_RULES)}, got {out.outcome!r}")
        if out.sampling not in SAMPLING_RULES:
            raise SelfPlayConfigError(f"self_play.sampling must be one of {list(SAMPLING_RULES)}, got {out.sampling!r}")
        return out

    def team_of(self, agent_id: str) -> int | None:
        """The index of the agent's team: the first pattern that matches its whole id."""
        for index, pattern in enumerate(self.teams):
            if fnmatch.fnmatchcase(agent_id, pattern):
                return index
        return None


def snapshot_module_id(module_id: str, slot: int) -> str:
    """The id under which a module's snapshot slot is served: ``player@3``."""
    return f"{module_id}{SLOT_SEPARATOR}{slot}"


def elo_expected(rating: float, opponent: float) -> float:
    """The score Elo expects of ``rating`` against ``opponent``: 1 / (1 + 10^((opponent - rating) / 400))."""
    return 1.0 / (1.0 + 10.0 ** ((opponent - rating) / 400.0))


def elo_update(rating: float, opponent: float, score: float, k: float) -> tuple[float, float]:
    """Both ratings after one game in which ``rating``'s side scored ``score`` (1 win, 0.5 draw, 0 loss)."""
    delta = k * (score - elo_expected(rating, opponent))
    return rating + delta, opponent - delta


@dataclass
class Snapshot:
    """One past policy of a module, in a slot of its window."""

    slot: int
    #: The weights version of the module it was taken from.
    version: int
    rating: float
    games: int = 0
    #: Games this snapshot won against the learning team (and drew: half each).
    score_against_learner: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"slot": self.slot, "version": self.version, "rating": self.rating, "games": self.games,
                "score_against_learner": self.score_against_learner}


@dataclass(frozen=True)
class GameResult:
    """A finished game, judged: what applying it changes, as plain values (a rank hands them to the others)."""

    #: The learning team's modules that are rated (self-play modules), sorted.
    learners: tuple[str, ...]
    #: Per snapshot the learning team met: (its slot's module id, the version the slot held when it was
    #: drawn, the learning team's score against it: 1 win, 0.5 draw, 0 loss).
    against: tuple[tuple[str, int | None, float], ...] = ()
    #: No snapshot played: a game against the latest policy (counted, not rated).
    latest: bool = False


@dataclass
class _Match:
    """Who plays whom in one episode: the learning team, and per other team and module its opponent."""

    learning_team: int
    #: (team, module) -> the module served to that team's agents (a snapshot id, or the module itself).
    opponents: dict[tuple[int, str], str] = field(default_factory=dict)
    #: snapshot module id -> the version it held when drawn: a game is rated only against that snapshot.
    versions: dict[str, int] = field(default_factory=dict)
    #: agent id -> (module, return) of the agents that already left the episode.
    returns: dict[str, tuple[str, float]] = field(default_factory=dict)


class SelfPlay:
    """Snapshots, matches and ratings of a self-play run (kept in checkpoints)."""

    def __init__(self, config: SelfPlayConfig, modules: list[str], seed: int | None = None) -> None:
        self.config = config
        #: module -> its window, one entry per slot (None: not filled yet).
        self.snapshots: dict[str, list[Snapshot | None]] = {m: [None] * config.window for m in modules}
        self.ratings: dict[str, float] = {m: float(config.initial_rating) for m in modules}
        self.updates: dict[str, int] = {m: 0 for m in modules}
        self._next_slot: dict[str, int] = {m: 0 for m in modules}
        #: snapshot module id -> (module, slot)
        self._slot_of = {snapshot_module_id(m, s): (m, s) for m in modules for s in range(config.window)}
        #: owner -> episode id -> its match, from the first MAP_AGENTS question until the episode ends.
        self._matches: dict[Hashable, dict[str, _Match]] = {}
        self._rng = random.Random(seed)
        #: Whether load_state restored a checkpoint's self-play state.
        self.restored = False
        #: Games rated, and the learning teams' score in them, over the run.
        self.games_rated = 0
        self.games_latest = 0
        #: Results judged and held for a later ``apply_results`` (several ranks); never checkpointed.
        self._pending: list[GameResult] = []

    # -- snapshots -------------------------------------------------------------

    def next_slot_id(self, module_id: str) -> str:
        """The snapshot module the next snapshot of ``module_id`` goes to."""
        return snapshot_module_id(module_id, self._next_slot[module_id])

    def take(self, module_id: str, version: int) -> str:
        """Put a snapshot of ``module_id`` (now at ``version``) in its next slot; returns the slot's
        module id, whose weights the caller copies from the module."""
        slot = self._next_slot[module_id]
        self._next_slot[module_id] = (slot + 1) % self.config.window
        self.snapshots[module_id][slot] = Snapshot(slot, version, self.ratings[module_id])
        return snapshot_module_id(module_id, slot)

    def holds(self, module_id: str) -> bool:
        """Whether ``module_id`` is served with a policy: any module but a snapshot slot not filled yet."""
        where = self._slot_of.get(module_id)
        return where is None or self.snapshots[where[0]][where[1]] is not None

    def updated(self, module_id: str) -> bool:
        """Count one update of ``module_id``; whether it is time for a snapshot."""
        if module_id not in self.updates:
            return False
        self.updates[module_id] += 1
        return self.updates[module_id] % self.config.snapshot_every == 0

    # -- matches ---------------------------------------------------------------

    def module_for(self, owner: Hashable, episode_id: str, agent_id: str, module_id: str) -> str:
        """The module an agent acts with in this episode (MAP_AGENTS), given the module the policy
        mapping gives it: the module itself on the learning team (and for agents of no team or of a
        module without snapshots), else the opponent its team was drawn for this episode."""
        team = self.config.team_of(agent_id)
        if team is None or module_id not in self.snapshots:
            return module_id
        match = self._match(owner, episode_id)
        if match is None:
            match = self._new_match(owner, episode_id, self._rng.randrange(len(self.config.teams)))
        if team == match.learning_team:
            return module_id
        opponent = match.opponents.get((team, module_id))
        if opponent is None:
            opponent = match.opponents[(team, module_id)] = self._draw_opponent(module_id)
            if opponent in self._slot_of:
                match.versions[opponent] = self._snapshot_at(opponent).version  # type: ignore[union-attr]
        return opponent

    def could_draw(self, agent_id: str, module_id: str, reported: str) -> bool:
        """Whether ``reported`` is a module self-play can serve an agent that the mapping puts on
        ``module_id``: the module itself, or (for an agent of a team) a filled snapshot slot of it."""
        if reported == module_id:
            return True
        where = self._slot_of.get(reported)
        return (where is not None and where[0] == module_id and self.config.team_of(agent_id) is not None
                and self.snapshots[where[0]][where[1]] is not None)

    def bind(self, owner: Hashable, via: Hashable, episode_id: str | None, modules: dict[str, str]) -> None:
        """Records of an episode were accepted from ``owner`` (its client_session, else its connection)
        on connection ``via``, its agents on ``modules``: the match drawn on the connection moves to the
        owner (so a continuation on another connection finds it), or, when none was drawn (the episode
        began before a reconnect or a restart), one is made from what the records say was played."""
        episode_id = episode_id or ""
        match = self._match(owner, episode_id)
        if match is None and via is not None and via != owner:
            match = self._matches.get(via, {}).pop(episode_id, None)
            if match is not None:
                self._put(owner, episode_id, match)
        teams = {a: self.config.team_of(a) for a in modules}
        if match is None:
            learning = [teams[a] for a, m in modules.items() if teams[a] is not None and m in self.snapshots]
            if not learning:
                return  # no agent of a team on a learning module: nothing to rate
            match = self._new_match(owner, episode_id, learning[0])
        for agent_id, module in modules.items():
            where = self._slot_of.get(module)
            if where is not None and teams[agent_id] is not None:
                match.opponents.setdefault((teams[agent_id], where[0]), module)
                snapshot = self._snapshot_at(module)
                if snapshot is not None:
                    match.versions.setdefault(module, snapshot.version)

    def _match(self, owner: Hashable, episode_id: str) -> _Match | None:
        return self._matches.get(owner, {}).get(episode_id)

    def _new_match(self, owner: Hashable, episode_id: str, learning_team: int) -> _Match:
        match = _Match(learning_team)
        self._put(owner, episode_id, match)
        return match

    def _put(self, owner: Hashable, episode_id: str, match: _Match) -> None:
        held = self._matches.setdefault(owner, {})
        if len(held) >= MAX_OPEN_MATCHES_PER_OWNER:
            del held[next(iter(held))]
        held[episode_id] = match

    def _snapshot_at(self, slot_id: str) -> Snapshot | None:
        module, slot = self._slot_of[slot_id]
        return self.snapshots[module][slot]

    def _draw_opponent(self, module_id: str) -> str:
        filled = [s for s in self.snapshots[module_id] if s is not None]
        if not filled or self._rng.random() < self.config.latest_share:
            return module_id
        if self.config.sampling == "prioritized":
            # How often each snapshot beats the learner (wins plus half the draws, with one drawn game of
            # prior so an unplayed snapshot counts as even), squared: the hard opponents come up most.
            weights = [((s.score_against_learner + 0.5) / (s.games + 1)) ** 2 for s in filled]
            chosen = self._rng.choices(filled, weights=weights)[0]
        else:
            chosen = self._rng.choice(filled)
        return snapshot_module_id(module_id, chosen.slot)

    def episode_part(self, owner: Hashable, episode_id: str | None, returns: dict[str, tuple[str, float]],
                     ended: bool) -> None:
        """Agents left an episode (``returns``: agent id -> (its module, its return)); with ``ended``
        the episode is over, and the learning team's return against each team that played a
        snapshot rates the game at once (one server; several ranks judge with ``judge_part``)."""
        result = self.judge_part(owner, episode_id, returns, ended)
        if result is not None:
            self.apply_results([result])

    def judge_part(self, owner: Hashable, episode_id: str | None, returns: dict[str, tuple[str, float]],
                   ended: bool) -> GameResult | None:
        """As ``episode_part``, without applying: the game's result once the episode ended (None while it
        goes on, for an episode nothing was drawn for, or a game with no finite return to judge)."""
        episode_id = episode_id or ""
        match = self._match(owner, episode_id)
        if match is None:
            return None
        match.returns.update(returns)
        if not ended:
            return None
        del self._matches[owner][episode_id]
        if not self._matches[owner]:
            del self._matches[owner]
        return self._judge(match)

    def _judge(self, match: _Match) -> GameResult | None:
        team_returns: dict[int, float] = {}
        learners: set[str] = set()
        opponents: dict[int, set[str]] = {}
        for agent_id, (module, ret) in match.returns.items():
            team = self.config.team_of(agent_id)
            if team is None:
                continue
            team_returns[team] = team_returns.get(team, 0.0) + ret
            if team == match.learning_team:
                if module in self.ratings:
                    learners.add(module)
            elif module in self._slot_of:
                opponents.setdefault(team, set()).add(module)
        mine = team_returns.get(match.learning_team)
        if mine is None or not math.isfinite(mine):
            return None
        against: list[tuple[str, int | None, float]] = []
        for team, slots in opponents.items():
            theirs = team_returns[team]
            if not math.isfinite(theirs):
                continue
            margin = self.config.draw_margin
            reference = 0.0 if self.config.outcome == "sign" else theirs
            score = 1.0 if mine > reference + margin else 0.0 if mine < reference - margin else 0.5
            against.extend((slot_id, match.versions.get(slot_id), score) for slot_id in sorted(slots))
        return GameResult(tuple(sorted(learners)), tuple(against), latest=not opponents)

    def hold(self, result: GameResult) -> None:
        """Keep a judged result until ``take_results`` (several ranks apply them together)."""
        self._pending.append(result)

    def take_results(self) -> list[GameResult]:
        """The results held since the last call, oldest first; they are no longer held."""
        taken, self._pending = self._pending, []
        return taken

    @property
    def pending(self) -> int:
        """Results held, not applied yet."""
        return len(self._pending)

    def apply_results(self, results: list[GameResult]) -> None:
        """Rate judged games, in order: each snapshot met updates its and the learners' Elo ratings and
        its record, unless its slot now holds another version than the one drawn (a newer snapshot
        was taken since: not the opponent played); a game that rated any counts as rated, one
        against the latest policy as such."""
        for result in results:
            rated = False
            for slot_id, version, score in result.against:
                snapshot = self._snapshot_at(slot_id) if slot_id in self._slot_of else None
                if snapshot is None or version != snapshot.version:
                    continue  # (its slot took a newer snapshot during the game: not the one drawn)
                for learner in result.learners:
                    if learner in self.ratings:
                        self.ratings[learner], snapshot.rating = elo_update(self.ratings[learner], snapshot.rating,
                                                                            score, self.config.elo_k)
                snapshot.games += 1
                snapshot.score_against_learner += 1.0 - score
                rated = True
            if rated:
                self.games_rated += 1
            elif result.latest:
                self.games_latest += 1

    def forget(self, owner: Hashable) -> None:
        """Drop the matches of an owner whose episodes will not end (a closed connection or session)."""
        self._matches.pop(owner, None)

    def open_matches(self) -> int:
        return sum(len(held) for held in self._matches.values())

    # -- reporting and checkpoints ---------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Per module: its rating, its snapshots (slot, source version, rating, games) and counts."""
        return {
            "games_rated": self.games_rated,
            "games_against_latest": self.games_latest,
            "modules": {
                m: {"rating": round(self.ratings[m], 2), "updates": self.updates[m],
                    "snapshots": [s.to_json() for s in slots if s is not None]}
                for m, slots in self.snapshots.items()
            },
        }

    def scalars(self) -> dict[str, float]:
        """Flat metrics (TensorBoard, the console): each module's rating and its best snapshot's."""
        out: dict[str, float] = {}
        for m, slots in self.snapshots.items():
            out[f"self_play/{m}/rating"] = self.ratings[m]
            filled = [s for s in slots if s is not None]
            if filled:
                out[f"self_play/{m}/latest_snapshot_rating"] = max(filled, key=lambda s: s.version).rating
                out[f"self_play/{m}/snapshots"] = float(len(filled))
        out["self_play/games_rated"] = float(self.games_rated)
        return out

    def state(self) -> dict[str, Any]:
        return {"teams": list(self.config.teams), "ratings": dict(self.ratings), "updates": dict(self.updates), "next_slot": dict(self._next_slot),
                "snapshots": {m: [None if s is None else s.to_json() for s in slots]
                              for m, slots in self.snapshots.items()},
                "games_rated": self.games_rated, "games_latest": self.games_latest}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what ``state`` saved; other teams, or a module or slot this run lacks, is an error
        naming it (the snapshots and ratings would belong to another game)."""
        if "teams" in state and list(state["teams"]) != list(self.config.teams):
            raise ValueError(f"self_play: the checkpoint's teams {list(state['teams'])} differ from this "
                             f"configuration's {list(self.config.teams)}")
        for m, slots in state["snapshots"].items():
            if m not in self.snapshots:
                raise ValueError(f"self_play: the checkpoint has snapshots of module {m!r}, which this "
                                 f"configuration does not take snapshots of")
            if len(slots) > self.config.window:
                raise ValueError(f"self_play: the checkpoint has {len(slots)} snapshots of module {m!r}, more than "
                                 f"this configuration's window {self.config.window}")
            for slot, saved in enumerate(slots):
                self.snapshots[m][slot] = None if saved is None else Snapshot(**saved)
        self.ratings.update({m: float(r) for m, r in state["ratings"].items() if m in self.ratings})
        self.updates.update({m: int(n) for m, n in state["updates"].items() if m in self.updates})
        self._next_slot.update({m: int(n) % self.config.window for m, n in state["next_slot"].items()
                                if m in self._next_slot})
        self.games_rated = int(state.get("games_rated", 0))
        self.games_latest = int(state.get("games_latest", 0))
        self.restored = True
