"""How the ranks of a group start as one: every rank takes rank 0's learners, versions, run id,
curriculum and self-play state, and the group's exactly-once marks, whether it started fresh or
resumed its own checkpoint (a rank that died mid-checkpoint cannot make the group diverge)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from ..ingest.batch_dedup import BatchDedup, merged_marks
from .data_parallel import DataParallel

if TYPE_CHECKING:
    from ..curriculum import Curriculum
    from ..metrics import Metrics
    from ..module_runtime import ModuleRuntime
    from ..self_play import SelfPlay
    from .rank_group import RankGroup


def take_the_groups_weights(group: "RankGroup", modules: Mapping[str, "ModuleRuntime"], metrics: "Metrics",
                            dedup: BatchDedup, curriculum: "Curriculum | None", self_play: "SelfPlay | None",
                            run_id: str) -> str:
    """Every rank starts from rank 0's learners (weights, optimizer, live settings), versions and run id
    (returned: this rank's own on rank 0); with self-play, its snapshots (their slots are modules: rank
    0's weights and models) and their record and ratings; with a curriculum, rank 0's, which this rank
    then follows. The marks are merged (merge_the_groups_marks). A collective of the group: every rank
    calls it at the same point of its start."""
    group.meet("the group's weights")  # (a rank may replay a long journal first)
    for module in modules.values():
        module.learner.data_parallel = DataParallel(group)
    # Each rank skipped the versions its own versions.json says were served after its checkpoint: the
    # group serves its weights under the highest such number, so no number served by any rank before
    # the restart names other weights now.
    served = group.agree([float(rt.weights_seq_no) for rt in modules.values()], how="max")
    for runtime, version in zip(modules.values(), served):
        runtime.weights_seq_no = int(version)
    theirs = group.broadcast_object(
        {"run_id": run_id, "updates": metrics.updates,
         "curriculum": curriculum.snapshot() if curriculum is not None else None,
         "self_play": self_play.state() if self_play is not None else None,
         "modules": {m: (rt.learner.state_dict(), rt.weights_seq_no, rt.onnx_field) for m, rt in modules.items()}}
        if group.is_first else None)
    merge_the_groups_marks(group, dedup)
    if group.is_first:
        return run_id
    if curriculum is not None:  # (rank 0's curriculum decides for the group; this rank follows it)
        curriculum.follower = True
        curriculum.adopt(theirs["curriculum"], replace=True)
    metrics.updates = int(theirs["updates"])  # (checkpoints are taken every checkpoint_every updates)
    if self_play is not None and theirs["self_play"] is not None:
        self_play.load_state(theirs["self_play"])
    for module_id, (state, version, onnx_field) in theirs["modules"].items():
        runtime = modules[module_id]
        runtime.learner.load_state_dict(state)
        runtime.weights_seq_no = int(version)
        runtime.onnx_field = onnx_field  # (rank 0's model bytes: one model per version across the group)
    return str(theirs["run_id"])


def merge_the_groups_marks(group: "RankGroup", dedup: BatchDedup) -> None:
    """Every rank takes the highest exactly-once mark of each client_session over the group (§6.7), so a
    batch that any rank stored before the group stopped is a duplicate on every rank after it restarts,
    whichever rank its client reaches then. A collective of the group."""
    dedup.load_state(merged_marks(group.gather_objects(dedup.state())))
