"""glibc's malloc top pad that hvdtrain gives the processes it starts (hvdtrain.runtime.launch.malloc_env)."""
from __future__ import annotations

import pytest

from hvdtrain.runtime import launch


def test_child_processes_keep_64_mb_at_the_top_of_each_arena(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_TOP_PAD_", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert launch.child_env()["MALLOC_TOP_PAD_"] == str(64 * 1024 * 1024)


@pytest.mark.parametrize("users", [{"MALLOC_TOP_PAD_": "0"},
                                   {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1:glibc.malloc.top_pad=4096"}])
def test_a_users_own_top_pad_wins(monkeypatch: pytest.MonkeyPatch, users: dict[str, str]) -> None:
    monkeypatch.delenv("MALLOC_TOP_PAD_", raising=False)
    for key, value in users.items():
        monkeypatch.setenv(key, value)
    assert launch.malloc_env(users) == {}
    env = launch.child_env()
    assert {key: env.get(key) for key in ("MALLOC_TOP_PAD_", "GLIBC_TUNABLES")} == {
        "MALLOC_TOP_PAD_": users.get("MALLOC_TOP_PAD_"), "GLIBC_TUNABLES": users.get("GLIBC_TUNABLES")}


def test_other_glibc_tunables_keep_the_default() -> None:
    assert launch.malloc_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == {"MALLOC_TOP_PAD_": str(64 << 20)}
