"""Following a directory of arriving files (``data.follow: true``): which files are complete, their order, and how the
workers agree on the next one. readers.FileBatches reads the files this module hands it.

**Complete files.** A file is taken once it is under its final name. Its writer writes it elsewhere, or under a hidden
name, and renames it into place (atomic on a local or POSIX file system and on HDFS): a name whose any part below
the followed root starts with ``.`` or ``_`` is never read. Those are the names Hadoop's FileInputFormat skips and
that the writers the field uses give unfinished output: Spark's FileOutputCommitter writes under ``_temporary/`` and
renames each task's files into place when it commits (then writes ``_SUCCESS``), Flink's FileSink writes
``.part-<id>.inprogress.<uuid>`` files and renames them to ``part-<id>`` on a checkpoint. With ``marker`` (say
``_SUCCESS``), a file counts only once its directory holds a file of that name: for stores without an atomic rename
(S3) and for partitions written by several tasks, each partition directory becomes complete at once.

**Order.** Files are taken in the order of their names below the root (the followed directory, or the directory part
of a glob), so the writer names them in arrival order: ``dt=2024-05-01/hour=07/part-00003.parquet`` (zero-padded).
The stream goes on with the first complete file whose name sorts after the one it read last; a file that becomes
complete with a name sorting before that one arrived late and is never read (logged as a warning and counted in
``Follower.late``).

**Agreement.** Every worker reads every record (readers.py), so all must take the same file at the same point of the
stream, also when their listings differ for a moment (a file system's caches). Rank 0 decides: at each poll it lists
the files, broadcasts the name hash of its next file (or "none yet", or "the stream ends" once it has waited
``idle_timeout_seconds``), and the workers take that file once every one of them sees it (one sum over the workers of
those that do not); otherwise all poll again after ``poll_seconds``. The idle time counts from the first poll all
workers took part in, so a peer still starting does not use it up. Each decision is one or two small collectives
of the comm, named ``FusedRec/follow/<n>`` by their count in this follower (the same on every worker).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import logging
import os
import time
from typing import Optional

_NONE, _END = 0, -1  # rank 0's decisions besides a file's name hash
_LOG = logging.getLogger("tf_fusedrec.data")


@dataclasses.dataclass(frozen=True)
class FollowSettings:
    """``data.follow``'s settings: poll every ``poll_seconds`` while no new file is complete; end the stream (a
    finite one) after ``idle_timeout_seconds`` without a new file (None: wait for ever); ``marker``: the file whose
    presence makes a directory's files complete (None: every file under its final name is)."""

    poll_seconds: float = 5.0
    idle_timeout_seconds: Optional[float] = None
    marker: Optional[str] = None

    def __post_init__(self):
        poll, idle = self.poll_seconds, self.idle_timeout_seconds
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not 0 < poll <= 3600:
            raise ValueError(f"data.poll_seconds: must be a number in (0, 3600], got {poll!r}")
        if idle is not None and (isinstance(idle, bool) or not isinstance(idle, (int, float)) or idle < 0):
            raise ValueError(f"data.idle_timeout_seconds: must be a number >= 0 or null, got {idle!r}")
        marker = self.marker
        if marker is not None and (not isinstance(marker, str) or not marker or os.sep in marker):
            raise ValueError(f"data.follow_marker: must be a file name (no directory), got {marker!r}")


def name_hash(name):
    """A file's name (below the followed root, '/'-separated) as an int64 in [1, 2**62): what a FilePosition keeps."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2 ** 62 - 1) + 1


def _hidden(name):
    return any(part.startswith((".", "_")) for part in name.split("/"))


class Listing:
    """The complete files under a directory or a glob, as sorted (name below the root, path) pairs.

    Raises:
      ValueError: `path` is not one directory or one glob pattern (following needs one root).
    """

    def __init__(self, path, marker=None):
        if not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"data.path: following (data.follow) takes one directory or one glob pattern, got "
                             f"{path!r}")
        path = os.fspath(path)
        self.path, self.marker = path, marker
        if glob.has_magic(path):
            parts = path.split(os.sep)
            fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
            self.root = os.sep.join(parts[:fixed]) or (os.sep if path.startswith(os.sep) else ".")
            self.pattern = path
        else:
            self.root, self.pattern = path, None

    def _candidates(self):
        if self.pattern is not None:
            return [m for m in glob.glob(self.pattern, recursive=True) if os.path.isfile(m)]
        found = []
        for directory, subdirs, files in os.walk(self.root):
            subdirs[:] = [d for d in subdirs if not d.startswith((".", "_"))]
            found.extend(os.path.join(directory, f) for f in files)
        return found

    def complete(self):
        """[(name, path)] of the complete files, sorted by name (see the module docstring)."""
        out = []
        for path in self._candidates():
            name = os.path.relpath(path, self.root).replace(os.sep, "/")
            if _hidden(name) or name.startswith("../"):
                continue
            if self.marker is not None and not os.path.isfile(os.path.join(os.path.dirname(path), self.marker)):
                continue
            out.append((name, path))
        return sorted(out)


class Follower:
    """The files of a followed stream, one after the other, the same on every worker.

    Args:
      listing: a Listing.
      settings: FollowSettings.
      comm: a distributed.comm Comm whose workers follow together; None: this process alone.
      on_wait: called with the seconds waited so far at each poll that found no file to take (the train app shows
        it and keeps its step watchdog from firing); None: nothing.
    """

    def __init__(self, listing, settings, comm=None, on_wait=None):
        self.listing, self.settings, self.comm, self.on_wait = listing, settings, comm, on_wait
        self.rank = 0 if comm is None else comm.rank
        self.late = []  # names that became complete after a later name was taken: never read
        self._known = None
        self._collectives = 0

    def _collective(self, op, value):
        """op "broadcast" (rank 0's value) or "sum" of one int64 over the workers; the value itself alone."""
        if self.comm is None or self.comm.size == 1:
            return value
        import tensorflow as tf  # noqa: PLC0415

        name = f"FusedRec/follow/{self._collectives}"
        self._collectives += 1
        tensor = tf.constant([value], tf.int64)
        if op == "broadcast":
            out, = self.comm.broadcast([tensor], name=name, root_rank=0)
        else:
            out, = self.comm.allreduce([tensor], name=name, op="sum")
        return int(out.numpy()[0])

    def _list(self, after):
        files = self.listing.complete()
        names = {name for name, _ in files}
        if self._known is not None and after is not None:
            for name in sorted(names - self._known):
                if name <= after:
                    self.late.append(name)
                    _LOG.warning("data.follow: %s under %s became complete after %s was read: it arrived late "
                                 "(files are taken in name order) and is not read", name, self.listing.root, after)
        self._known = names if self._known is None else self._known | names
        return files

    def find(self, wanted, attempts=3):
        """(name, path) of the complete file whose name_hash is `wanted` (a checkpoint's position), agreed.

        Raises:
          ValueError on every worker when one of them does not see it after `attempts` polls.
        """
        for attempt in range(attempts):
            found = [(n, p) for n, p in self._list(None) if name_hash(n) == wanted]
            if self._collective("sum", 0 if found else 1) == 0:
                return found[0]
            if attempt + 1 < attempts:
                time.sleep(self.settings.poll_seconds)
        raise ValueError(f"data.path: the checkpoint's stream stands in a file (name hash {wanted}) that is not among "
                         f"the complete files under {self.listing.path!r} on every worker: was it deleted, renamed or "
                         f"moved? A followed stream resumes in the file it was reading")

    def next_after(self, after):
        """(name, path) of the first complete file whose name sorts after `after` (None: the first file), waiting for
        one; None once the stream ends (no new file for idle_timeout_seconds)."""
        idle = self.settings.idle_timeout_seconds
        began = None  # the wait's start: once every worker polls (a peer may still be starting)
        while True:
            files = self._list(after)
            later = [(n, p) for n, p in files if after is None or n > after]
            if self.rank == 0:
                waited = 0.0 if began is None else time.monotonic() - began
                decision = name_hash(later[0][0]) if later else \
                    _END if idle is not None and waited >= idle else _NONE
            else:
                decision = _NONE
            decision = self._collective("broadcast", decision)
            if began is None:
                began = time.monotonic()
            if decision == _END:
                return None
            if decision != _NONE:
                mine = [(n, p) for n, p in later if name_hash(n) == decision]
                if self._collective("sum", 0 if mine else 1) == 0:
                    return mine[0]
            if self.on_wait is not None:
                self.on_wait(time.monotonic() - began)
            poll = self.settings.poll_seconds
            time.sleep(poll if idle is None else min(poll, max(0.0, idle - (time.monotonic() - began))))
