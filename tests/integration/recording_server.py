"""``tether serve`` that also records, for every module update it runs, the ids of
the steps trained on (observation 0 of each step) and the weights version the
update publishes, one JSON line per update (per rank, with several), appended to $TETHER_TRAINED_LOG.
Run as a script with the arguments of ``tether serve`` (by torchrun too); the server is unchanged."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from tether.server import learner_loop
from tether.server.cli import main
from tether.server.distributed import lockstep_loop

_LOG = os.environ["TETHER_TRAINED_LOG"]


def _recording(train):
    def recording(self: learner_loop.LearnerLoop, by_module: dict) -> dict:
        return _log(self, by_module, train(self, by_module))
    return recording


def _log(self: learner_loop.LearnerLoop, by_module: dict, results: dict) -> dict:
    with open(_LOG, "a") as log:
        for module_id, (outcome, stats, *_) in results.items():
            if stats is not None:  # published; the sources left out of it were not trained on
                kept = [p.chunk.obs[:-1, 0] for p in by_module[module_id] if p.source in outcome.kept]
                ids = np.concatenate(kept) if kept else np.zeros(0)  # (a rank with none of the group's steps)
                log.write(json.dumps({"pid": os.getpid(), "version": self.modules[module_id].weights_seq_no + 1,
                                      "ids": ids.astype(np.int64).tolist()}) + "\n")
        log.flush()
    return results


learner_loop.LearnerLoop.train = _recording(learner_loop.LearnerLoop.train)
# (several ranks: each rank's line holds its own share of the group's update)
lockstep_loop.LockstepLearnerLoop.train = _recording(lockstep_loop.LockstepLearnerLoop.train)
if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
