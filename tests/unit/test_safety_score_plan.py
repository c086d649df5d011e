"""Scoring's pure safety checks (#28 items 2, 3, 11): what may be deleted, what may be published, what is searched."""
from __future__ import annotations

import pytest

from etl import score_job
from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError, DataError
from hvdtrain.observe import tracking

ROOT = "hdfs://nn/warehouse/db.db/preds"


@pytest.mark.parametrize("old, expected", [
    (f"{ROOT}/ds=2026-11-23/run-20261123T0101-ab12cd/outcome=scored", f"{ROOT}/ds=2026-11-23/run-20261123T0101-ab12cd"),
    (f"{ROOT}/ds=2026-11-23/run-1", f"{ROOT}/ds=2026-11-23/run-1"),
    (f"{ROOT}/ds=2026-11-23", None),  # a partition Spark wrote itself: not hvdtrain's run folder
    ("hdfs://nn/data/gold/ds=2026-11-23", None),  # pointed elsewhere by hand
    (f"{ROOT}/ds=2026-11-24/run-1/outcome=scored", None),  # another partition's folder
    (f"{ROOT}/ds=2026-11-23/run-1/../../../gold", None),
    (f"{ROOT}/ds=2026-11-23/run-1/outcome=scored/deeper", None),
    (None, None),
])
def test_only_run_folders_hvdtrain_created_under_the_table_are_deleted(old, expected):
    assert score_job.replaced_run_folder(old, ROOT, "ds=2026-11-23") == expected


def test_replaced_folder_outside_the_table_is_kept(tmp_path):
    outside = tmp_path / "gold" / "ds=2026-11-23"
    outside.mkdir(parents=True)
    (outside / "part-0.parquet").write_bytes(b"rows")
    score_job.drop_replaced(f"file:{outside}", f"file:{tmp_path}/t/ds=2026-11-23/run-2", f"file:{tmp_path}/t",
                            "ds=2026-11-23")
    assert (outside / "part-0.parquet").exists()
    mine = tmp_path / "t" / "ds=2026-11-23" / "run-1" / "outcome=scored"
    mine.mkdir(parents=True)
    score_job.drop_replaced(f"file:{mine}", f"file:{tmp_path}/t/ds=2026-11-23/run-2", f"file:{tmp_path}/t",
                            "ds=2026-11-23")
    assert not mine.parent.exists()


def test_volume_limits():
    target = score_job.Target("db.p", "db.p_rejects", {"ds": "2026-11-23"}, True)
    score_job.check_volume({"rows_in": 10, "scored": 5, "rejected": 5}, 1, 0.5, target)
    with pytest.raises(DataError, match=r"only 0 rows scored .* score.min_rows=1: nothing was published"):
        score_job.check_volume({"rows_in": 0, "scored": 0, "rejected": 0}, 1, 0.5, target)
    with pytest.raises(DataError, match=r"6 of 10 rows rejected \(60.0%\), more than score.max_reject_fraction=0.5"):
        score_job.check_volume({"rows_in": 10, "scored": 4, "rejected": 6}, 1, 0.5, target)
    with pytest.raises(ConfigError, match="score.max_reject_fraction must be in"):
        config.from_dict({"score": {"max_reject_fraction": 1.5}})


@pytest.mark.parametrize("spec", ["ds=2026-11-23' OR '1'='1", "ds=${hivevar:x}", "ds=a b", "ds=a;DROP", "ds=é"])
def test_partition_values_outside_the_safe_set_are_refused(spec):
    with pytest.raises(ConfigError, match="may hold only letters, digits"):
        config.from_dict({"score": {"partition": spec}})


@pytest.mark.parametrize("predicate", ["lang = 'en'; DROP TABLE x", "ds = '${hivevar:d}'", "a = 1 -- x", "a /* x */"])
def test_filters_with_statement_separators_substitution_or_comments_are_refused(predicate):
    with pytest.raises(ConfigError, match="source.filter must be one Spark SQL predicate"):
        config.from_dict({"source": {"table": "db.t", "filter": predicate}})
    with pytest.raises(ConfigError, match="score.filter must be one Spark SQL predicate"):
        config.from_dict({"score": {"filter": predicate}})


def test_mlflow_search_filters_check_values_instead_of_splicing_them():
    assert tracking.search_filter(name="reviews_model") == "name = 'reviews_model'"
    with pytest.raises(DataError, match="cannot be searched for in MLflow"):
        tracking.search_filter(name="x' or name != '")


def test_spark_variable_substitution_stays_off_whatever_the_config_says():
    from etl import session

    cfg = config.from_dict({"spark": {"conf": {"spark.sql.variable.substitute": "true"}}})
    assert session.spark_conf(cfg, "local[1]", None, False)["spark.sql.variable.substitute"] == "false"
