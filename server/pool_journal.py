"""The sample pool's write-ahead journal: a batch is on disk before it is answered.

Every batch the server stores (its pooled chunks, its exactly-once id and its
step counts) is appended to ``<logdir>/journal/pool-<generation>.bin`` and
made durable (``fdatasync``) before the client gets its answer. A checkpoint
holds the weights, the pool as it was when it was taken, and the generation
from which the journal must be read again; it starts that generation and,
once written, deletes the older ones. ``--resume`` loads the checkpoint and
then replays the journal of that generation and later ones: steps that were
answered after the checkpoint, trained or not before the server died, are
pooled again and trained on the restored weights. So an answered step is
trained exactly once whatever stops the server (SIGTERM or kill -9).

A record is ``magic, crc32, header length, blob length, JSON header, blob``;
the blob holds the arrays back to back, the header their dtype and shape. A
record cut short by a crash, or whose checksum fails, ends the replay of its
file (nothing after it was answered). Records are plain numbers and strings:
reading a journal never runs code.

Writes run on one thread of their own, several batches per ``fdatasync``
(group commit), so the event loop never waits for the disk.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import struct
import sys
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tether.protocol.episodes import EpisodeChunk

from .ingest.batch_dedup import BatchId
from .sample_pool import Pooled
from .say import say

_MAGIC = b"TPJ1"
_RECORD = struct.Struct("<4sIIQ")  # magic, crc32 of header + blob, header length, blob length
_FILE = re.compile(r"pool-(\d+)\.bin$")
_ARRAYS = ("obs", "actions", "rewards", "action_logp", "action_dist_inputs", "value_obs", "state_in", "state_prefix",
           "logged")


@dataclass
class JournalEntry:
    """One stored batch: its pooled chunks, its exactly-once id, and the steps it counted as received."""

    batch: BatchId | None
    items: list[Pooled]
    env_steps: int = 0
    agent_steps: int = 0


def encode_entry_parts(entry: JournalEntry) -> list[Any]:
    """One journal record as the buffers it is made of, back to back (the arrays' own memory, not
    copies: an image batch is megabytes, and the journal thread holds the GIL while it copies)."""
    parts: list[Any] = []
    offset = 0
    items = []
    for pooled in entry.items:
        chunk = pooled.chunk
        arrays = {}
        for name in _ARRAYS:
            value = getattr(chunk, name)
            if value is None:
                continue
            value = np.ascontiguousarray(value)
            arrays[name] = [value.dtype.str, list(value.shape), offset, value.nbytes]
            parts.append(memoryview(value).cast("B") if value.nbytes else b"")
            offset += value.nbytes
        items.append({"module": pooled.module_id, "version": pooled.weights_seq_no, "source": pooled.source,
                      "session": pooled.client_session,
                      "terminated": chunk.is_terminated, "truncated": chunk.is_truncated,
                      "episode_id": chunk.episode_id, "arrays": arrays})
    header = json.dumps({
        "batch": list(entry.batch) if entry.batch is not None else None,
        "env_steps": entry.env_steps, "agent_steps": entry.agent_steps, "items": items,
    }, ensure_ascii=True).encode("ascii")  # ASCII escapes: a stored id is written whatever it holds
    crc = zlib.crc32(header)
    for part in parts:
        crc = zlib.crc32(part, crc)
    return [_RECORD.pack(_MAGIC, crc, len(header), offset), header, *parts]


def encode_entry(entry: JournalEntry) -> bytes:
    """One journal record."""
    return b"".join(encode_entry_parts(entry))


def _decode_item(item: dict[str, Any], blob: memoryview, batch_session: str | None) -> Pooled:
    arrays = {}
    for name, (dtype, shape, offset, nbytes) in item["arrays"].items():
        if name not in _ARRAYS:
            raise ValueError(f"unknown array {name!r}")
        arrays[name] = np.frombuffer(blob[offset:offset + nbytes], dtype=np.dtype(dtype)).reshape(shape).copy()
    chunk = EpisodeChunk(arrays["obs"], arrays["actions"], arrays["rewards"], arrays.get("action_logp"),
                         arrays.get("action_dist_inputs"), bool(item["terminated"]), bool(item["truncated"]),
                         item["episode_id"], arrays.get("value_obs"), state_in=arrays.get("state_in"),
                         state_prefix=arrays.get("state_prefix"), logged=arrays.get("logged"))
    # (absent from a journal written before items kept it: their record's batch names it, if any)
    session = item.get("session", batch_session)
    return Pooled(str(item["module"]), chunk, int(item["version"]), str(item["source"]),
                  client_session=session if isinstance(session, str) else None)


def decode_entries(data: bytes) -> tuple[list[JournalEntry], int]:
    """The whole records at the start of ``data`` and how many bytes they take; a torn
    or corrupt record ends the list."""
    entries: list[JournalEntry] = []
    view = memoryview(data)
    at = 0
    while at + _RECORD.size <= len(data):
        magic, crc, header_len, blob_len = _RECORD.unpack_from(data, at)
        end = at + _RECORD.size + header_len + blob_len
        if magic != _MAGIC or end > len(data):
            break
        header = view[at + _RECORD.size: at + _RECORD.size + header_len]
        blob = view[at + _RECORD.size + header_len: end]
        if zlib.crc32(blob, zlib.crc32(header)) != crc:
            break
        try:
            head = json.loads(bytes(header))
            batch = head["batch"]
            batch_id = BatchId(str(batch[0]), int(batch[1])) if batch is not None else None
            entries.append(JournalEntry(
                batch_id, [_decode_item(item, blob, batch_id.client_session if batch_id else None)
                           for item in head["items"]],
                int(head["env_steps"]), int(head["agent_steps"])))
        except (ValueError, KeyError, TypeError, IndexError):
            break
        at = end
    return entries, at


def journal_files(directory: Path) -> list[tuple[int, Path]]:
    """The journal's files in ``directory``, by generation."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _FILE.search(p.name))]
    return sorted(found)


def read_journal(directory: Path, from_generation: int) -> list[JournalEntry]:
    """Every whole record of generation ``from_generation`` and later, in the order written."""
    entries: list[JournalEntry] = []
    for generation, path in journal_files(directory):
        if generation >= from_generation:
            data = path.read_bytes()
            found, used = decode_entries(data)
            if used < len(data):
                print(f"[tether] journal {path}: {len(data) - used} bytes after its last whole record ignored "
                      f"(a write cut short: never answered)", file=sys.stderr, flush=True)
            entries.extend(found)
    return entries


class PoolJournal:
    """Appends records durably on a thread of its own; ``append`` returns a future
    that is done once the record is on disk."""

    _ROTATE = object()
    _STOP = object()

    def __init__(self, directory: str | Path, generation: int, fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.generation = generation
        self.fsync = fsync
        #: Records whose write failed (logged; the batch stays pooled in memory).
        self.failures = 0
        self.bytes_written = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._file = self._open(generation)
        self._thread = threading.Thread(target=self._run, name="tether-journal", daemon=True)
        self._thread.start()

    def _path(self, generation: int) -> Path:
        return self.directory / f"pool-{generation:08d}.bin"

    def append(self, entry: JournalEntry) -> asyncio.Future:
        """Queue ``entry``; the future is done when it is durable (or its write failed, logged)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        # Encoded on the journal's thread: the chunks are never changed once pooled (a split makes views).
        self._queue.put((entry, loop, future))
        return future

    def append_now(self, entries: list[JournalEntry]) -> None:
        """Queue ``entries`` with nobody waiting (replayed data copied into this journal)."""
        for entry in entries:
            self._queue.put((entry, None, None))

    def rotate(self) -> int:
        """Start the next generation (after every record appended so far); returns its number."""
        self.generation += 1
        self._queue.put((self._ROTATE, self.generation, None))
        return self.generation

    def remove_before(self, generation: int) -> None:
        """Delete the files of generations older than ``generation`` (a checkpoint holds their data)."""
        for number, path in journal_files(self.directory):
            if number < generation:
                try:
                    path.unlink()
                except OSError:
                    pass

    def close(self) -> None:
        """Write what is queued and stop the thread."""
        self._queue.put((self._STOP, None, None))
        self._thread.join()

    def _run(self) -> None:
        while True:
            ops = [self._queue.get()]
            while True:
                try:
                    ops.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
            failed = 0  # entries not written
            entries = 0
            stop = False
            # Each op on its own: a failed write must not skip a later rotation (the records after it
            # would land in a generation the next checkpoint deletes) nor the stop (close would hang).
            for data, loop_or_generation, future in ops:
                try:
                    if data is self._STOP:
                        stop = True
                    elif data is self._ROTATE:
                        try:
                            self._sync()
                        finally:
                            self._file.close()
                            self._file = self._open(loop_or_generation)
                    else:
                        entries += 1
                        if future is not None:
                            done.append((loop_or_generation, future))
                        self._write(encode_entry_parts(data))
                except Exception as exc:  # (also a record that cannot be encoded: the thread must go on)
                    failed += data is not self._STOP and data is not self._ROTATE
                    say(f"[tether] journal write failed: {exc!r:.300}")
            try:
                self._sync()
            except Exception as exc:
                failed = entries  # none of them is known to be on disk
                say(f"[tether] journal flush failed: {exc!r:.300}")
            if failed:
                # Counted per entry whichever write it shared with others, so the count does not
                # depend on how the thread happened to group them.
                self.failures += failed
                say(f"[tether] {failed} batch(es) of this write stay in memory only (not in the journal)")
            for loop, future in done:
                try:
                    loop.call_soon_threadsafe(_resolve, future)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    pass
            if stop:
                try:
                    self._file.close()
                except OSError:
                    pass
                return

    def _open(self, generation: int) -> Any:
        # Unbuffered: a record is in the OS's hands when write returns (kill -9 cannot lose it),
        # and a failed one can be cut off exactly.
        return open(self._path(generation), "ab", buffering=0)

    def _write(self, parts: list[Any]) -> None:
        """Append one record (its buffers, back to back) whole, or not at all: a record left torn by a
        failed write (disk full) would end the replay of its file, and the records written after it
        would be lost."""
        start = self._file.tell()
        written = 0
        try:
            for part in parts:
                view = memoryview(part)
                while view:
                    n = self._file.write(view)
                    written += n
                    view = view[n:]
        except BaseException:
            self._file.truncate(start)
            self._file.seek(start)
            raise
        self.bytes_written += written

    def _sync(self) -> None:
        self._file.flush()
        if self.fsync:
            os.fdatasync(self._file.fileno())


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
