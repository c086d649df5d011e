"""What hvdtrain owns in a folder it writes into: a ledger written before the data, and the only licence to delete.

``<folder>/_hvdtrain_ledger.json`` names, relative to the folder, what hvdtrain wrote or is about to write there
(``fnmatch`` patterns: :func:`exact` for a file, :func:`tree` for a folder hvdtrain created and everything in
it). A clean-up deletes the files a ledger names, then the folders it left empty: never a file or a folder
because of its name or where it lies, the way Git never removes an untracked file. A folder holding files no
ledger names is refused (:func:`foreign`) before anything in it is touched.

The planning here is pure (:class:`Ledger`, :func:`foreign`); :func:`read`, :func:`write` and
:func:`delete_owned` are the thin acting side, over :mod:`hvdtrain.hadoop.fs`.
"""
from __future__ import annotations

import fnmatch
import glob
import json
import logging
import posixpath
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from hvdtrain.core.errors import DataError
from hvdtrain.hadoop import fs

log = logging.getLogger(__name__)

NAME = "_hvdtrain_ledger.json"
FORMAT = 1


def exact(path: str) -> str:
    """The ledger entry for one file (its name taken literally, even with ``*`` or ``[`` in it)."""
    return glob.escape(path.strip("/"))


def tree(path: str) -> str:
    """The ledger entry for a folder hvdtrain created, and everything that is ever put in it."""
    return glob.escape(path.strip("/")) + "/*"


@dataclass(frozen=True)
class Ledger:
    """Who writes the folder (``hvdtrain etl``, ``hvdtrain train``) and the entries it owns there."""

    writer: str
    entries: tuple[str, ...] = ()

    def owns(self, rel: str) -> bool:
        """Whether the file at ``rel`` (relative to the folder) is one this ledger names; the ledger owns itself,
        and its own atomic write's temporary file (another rank may be writing it while this one looks)."""
        return (rel == NAME or rel.startswith(NAME + ".tmp-")
                or any(fnmatch.fnmatchcase(rel, e) for e in self.entries))

    def adding(self, *entries: str) -> "Ledger":
        """This ledger with more entries (each once, in order)."""
        return Ledger(self.writer, tuple(dict.fromkeys((*self.entries, *entries))))

    def to_json(self) -> bytes:
        return (json.dumps({"format": FORMAT, "writer": self.writer, "entries": list(self.entries)},
                           indent=2) + "\n").encode()


def foreign(files: list[str], owns: Callable[[str], bool]) -> list[str]:
    """The files (relative paths) that nothing owns, sorted (pure): their folder is not hvdtrain's to clear."""
    return sorted(f for f in files if not owns(f))


def sample(names: list[str], limit: int = 5) -> str:
    """``a, b, c, ...``: a few names for a one-line message."""
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def read(folder: str) -> Optional[Ledger]:
    """The folder's ledger; None when it has none. One that does not parse raises DataError naming it."""
    uri = fs.join(folder, NAME)
    if not fs.exists(uri):
        return None
    try:
        doc = json.loads(fs.read_bytes(uri))
        return Ledger(str(doc["writer"]), tuple(str(e) for e in doc["entries"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{uri} is not an hvdtrain ledger ({type(exc).__name__}: {exc}); hvdtrain cannot tell "
                        f"what in {folder} it wrote, so it deletes nothing there: move your files out of {folder} "
                        "and delete it, or choose another folder") from None


def read_own(folder: str, writer: str, what: str) -> Optional[Ledger]:
    """The folder's ledger when ``writer`` wrote it (None when it has none). A ledger of another hvdtrain command
    (a dataset's in a run output, a run's in a dataset) raises DataError in one line: ``what`` (the setting, e.g.
    ``train.output``) points at another command's output, which this one never replaces or deletes."""
    found = read(folder)
    if found is not None and found.writer != writer:
        raise DataError(f"{what} {folder} holds the output of {found.writer!r} (its ledger {NAME}), not of "
                        f"{writer!r}: {writer} never replaces or deletes another command's output; choose another "
                        f"folder for {what}")
    return found


def write(folder: str, ledger: Ledger) -> None:
    """Record the ledger (atomically) before the data it names is written."""
    fs.write_bytes_atomic(fs.join(folder, NAME), ledger.to_json())


def delete_owned(folder: str, owns: Callable[[str], bool], skip: Sequence[str] = ()) -> list[str]:
    """Delete the files under ``folder`` that ``owns`` names (on an HDFS with a trash, moved there:
    :func:`hvdtrain.hadoop.fs.remove_published`), then the folders that left empty; returns the files left (those nothing
    owns). Names in ``skip`` right under ``folder`` are neither listed nor touched."""
    files = fs.walk(folder, skip)
    left = foreign(files, owns)
    gone = [f for f in files if owns(f)]
    for rel in gone:  # to the HDFS trash when the cluster has one (fs.remove_published)
        fs.remove_published(fs.join(folder, rel))
    parents = sorted({p for rel in gone for p in _parents(rel)}, key=lambda p: (-p.count("/"), p))
    for rel in parents:
        uri = fs.join(folder, rel)
        if fs.exists(uri) and not fs.listdir(uri):
            fs.delete(uri)
    if left:
        log.info("%s: kept %d file(s) hvdtrain did not write (%s)", folder, len(left), sample(left))
    return left


def _parents(rel: str) -> list[str]:
    """``a/b/c.txt`` -> ``["a/b", "a"]``."""
    out = []
    parent = posixpath.dirname(rel)
    while parent:
        out.append(parent)
        parent = posixpath.dirname(parent)
    return out


def retire(previous: str, owns: Callable[[str], bool]) -> list[str]:
    """A folder moved aside by a replace: delete what ``owns`` names, then the folder itself if that emptied
    it; returns the files left there (hvdtrain did not write them: they are kept, for their owner to take)."""
    left = delete_owned(previous, owns)
    if not left and fs.exists(previous) and not fs.listdir(previous):
        fs.delete(previous)
    return left
