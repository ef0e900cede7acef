"""Several ranks of one run on PyTorch distributed: the group (rank_group.py), data-parallel updates
(data_parallel.py) and the learner loop that keeps the ranks in lock step (lockstep_loop.py)."""
