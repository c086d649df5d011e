"""Kerberos renewal fails at start with one line instead of silently never renewing (#28 item 14)."""
from __future__ import annotations

import pytest

from hvdtrain.core import config
from hvdtrain.core.errors import EnvironmentProblem
from hvdtrain.hadoop import kerberos
from hvdtrain.runtime import distributed


def test_a_keytab_missing_on_this_host_or_no_kinit_is_one_line_at_start(tmp_path, monkeypatch):
    from hvdtrain.training import runtime

    monkeypatch.delenv("CONTAINER_ID", raising=False)
    rank = distributed.RankInfo(0, 2, 0, 2, "worker-7", "local")
    cfg = config.from_dict({"name": "k", "workdir": str(tmp_path), "source": {"table": "db.t"},
                            "yarn": {"principal": "ml@EX.COM", "keytab": str(tmp_path / "ml.keytab")}},
                           base_dir=str(tmp_path))
    with pytest.raises(EnvironmentProblem, match=r"yarn.keytab .*ml.keytab is not a file on worker-7"):
        runtime.kerberos_renewer(cfg.yarn, rank)
    (tmp_path / "ml.keytab").write_bytes(b"k")
    assert "kinit is not on PATH on h1" in kerberos.renewal_problem(str(tmp_path / "ml.keytab"), "h1",
                                                                    which=lambda name: None)
    assert kerberos.renewal_problem(str(tmp_path / "ml.keytab"), "h1", which=lambda name: "/usr/bin/kinit") is None
