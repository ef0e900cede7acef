"""The Python SDK copies recorded image observations into blocks it reuses once nothing refers to them."""

from __future__ import annotations

import numpy as np

from tether.sdk.observation_arena import BLOCK_BYTES, ObservationArena

IMAGE = (84, 84, 4)


def test_copies_are_independent_of_the_engines_buffer_and_of_each_other() -> None:
    arena = ObservationArena()
    buffer = np.zeros(IMAGE, np.uint8)
    copies = []
    for i in range(200):  # more than one block
        buffer[...] = i % 256
        copies.append(arena.copy(buffer))
    assert all((c == i % 256).all() for i, c in enumerate(copies))
    assert copies[0].base is not None and copies[0].base is not copies[-1].base


def test_a_block_is_reused_only_once_no_observation_in_it_is_left() -> None:
    arena = ObservationArena()
    per_block = BLOCK_BYTES // int(np.prod(IMAGE))
    first = [arena.copy(np.full(IMAGE, 1, np.uint8)) for _ in range(per_block)]
    held = first[5]  # an episode still holds one observation of the first block
    first_block = held.base
    del first
    second = [arena.copy(np.full(IMAGE, 2, np.uint8)) for _ in range(3 * per_block)]
    assert all(c.base is not first_block for c in second), "a block with a live observation was reused"
    assert (held == 1).all()
    del held, first_block
    second_blocks = {id(c.base) for c in second}
    del second  # the batch was sent: every block is free now
    third = [arena.copy(np.full(IMAGE, 3, np.uint8)) for _ in range(2 * per_block)]
    assert len({id(c.base) for c in third} & second_blocks) >= 1, "freed blocks were not reused"
    assert all((c == 3).all() for c in third)


def test_small_and_other_shaped_observations_are_plain_copies() -> None:
    arena = ObservationArena()
    small = np.arange(16, dtype=np.uint8)
    copy = arena.copy(small)
    assert copy.base is None and np.array_equal(copy, small)
    image = arena.copy(np.ones(IMAGE, np.uint8))
    other = arena.copy(np.ones((64, 64, 3), np.uint8))  # another camera: another block
    assert image.base is not other.base and other.shape == (64, 64, 3)
