"""A cached env archive is shipped only when its bytes match the SHA-256 recorded at upload (#28 item 10)."""
from __future__ import annotations

from hvdtrain.core import config
from yarn import packaging


def test_a_tampered_cached_archive_is_packed_again_not_shipped(tmp_path):
    yarn = config.YarnConfig(env_cache=str(tmp_path / "cache"))
    packed = []

    def pack(prefix, local):  # the real venv-pack takes minutes; the bytes are what matters here
        packed.append(prefix)
        with open(local, "wb") as fh:
            fh.write(b"environment archive " * 100)

    first = packaging.ensure_env_archive(yarn, ["python 3.11"], prefix="/venv", pack=pack, log=lambda m: None)
    assert first.uploaded and packaging.cached_archive_problem(first.uri) is None
    heard = []
    again = packaging.ensure_env_archive(yarn, ["python 3.11"], prefix="/venv", pack=pack, log=heard.append)
    assert not again.uploaded and len(packed) == 1 and "content verified" in heard[0]
    with open(first.uri, "r+b") as fh:  # same name, other bytes (a truncated upload, or a swapped file)
        fh.write(b"#!/bin/sh evil ")
    heard.clear()
    third = packaging.ensure_env_archive(yarn, ["python 3.11"], prefix="/venv", pack=pack, log=heard.append)
    assert third.uploaded and len(packed) == 2 and "is not the recorded" in heard[0]
    assert packaging.cached_archive_problem(third.uri) is None
