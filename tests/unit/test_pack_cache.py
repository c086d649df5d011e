"""$HVDTRAIN_PACK_CACHE: a packed env archive is kept locally by hash, so a fresh cluster costs an upload, not a
repack (the hadoop tier's minicluster starts with an empty HDFS every session)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_yarn_command import fake_pack, job
from yarn import packaging


def test_a_fresh_env_cache_uploads_the_locally_kept_archive_without_repacking(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(packaging.PACK_CACHE_ENV, str(tmp_path / "packs"))
    identity = ["a==1", "python==3.11.7"]
    calls: list[str] = []
    logs: list[str] = []
    first = packaging.ensure_env_archive(job(env_cache=str(tmp_path / "cluster1")).yarn, identity, prefix="/venv",
                                         pack=fake_pack(calls), log=logs.append)
    assert first.uploaded and calls == ["/venv"]
    assert (tmp_path / "packs" / f"{first.digest}.tar.gz").is_file()
    second = packaging.ensure_env_archive(job(env_cache=str(tmp_path / "cluster2")).yarn, identity, prefix="/venv",
                                          pack=fake_pack(calls), log=logs.append)
    assert second.uploaded and calls == ["/venv"]  # uploaded to the new cache, not packed again
    assert Path(second.uri).read_bytes() == Path(first.uri).read_bytes()
    assert any("packed earlier" in line for line in logs)
