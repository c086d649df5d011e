"""checkpoint_save / checkpoint_restore: hvdtrain's checkpoint vs a raw write/read of the same bytes.

Save = snapshot, checksum, stage, publish (data, checksums, COMMIT) and wait
for the background publish; the baseline writes the same bytes to one file.
Restore = find the newest committed checkpoint, verify its checksums and load
the arrays; the baseline reads the same file. Neither side calls fsync: the
same fsync policy on both.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from benchmarks.common import Entry, median_time


def run(quick: bool, extra: dict) -> list[Entry]:
    from hvdtrain.training import checkpoint as ck

    mb = 32 if quick else 256
    rng = np.random.default_rng(0)
    arrays = {f"v{i}": rng.standard_normal(mb * (1 << 20) // 4 // 8, dtype=np.float32) for i in range(8)}
    nbytes = len(ck.pack(arrays))
    root = tempfile.mkdtemp(prefix="bench-ckpt-")
    try:
        blob = ck.pack(arrays)
        raw = os.path.join(root, "raw.bin")

        def raw_write() -> None:
            with open(raw, "wb") as fh:
                fh.write(blob)

        def raw_read() -> None:
            with open(raw, "rb") as fh:
                fh.read()

        steps = iter(range(1, 10_000))
        writer = ck.CheckpointWriter(os.path.join(root, "ckpts"), keep_last=1, keep_best=0)

        def save() -> None:
            writer.save(next(steps), arrays, {"epoch": 1})
            writer.wait()

        def restore() -> None:
            assert ck.restore_latest(os.path.join(root, "ckpts")) is not None

        raw_w, ours_w = median_time(raw_write), median_time(save)
        raw_r, ours_r = median_time(raw_read), median_time(restore)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    notes = {"bytes": nbytes, "fsync": False, "filesystem": "local"}
    return [
        Entry("checkpoint_save", nbytes / ours_w / 1e6, "MB/s", "raw write of the same bytes", nbytes / raw_w / 1e6,
              0.5, notes=notes),
        Entry("checkpoint_restore", nbytes / ours_r / 1e6, "MB/s", "raw read of the same bytes", nbytes / raw_r / 1e6,
              0.5, notes=notes),
    ]
