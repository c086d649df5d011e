"""DATE and TIMESTAMP columns as features (source.datetime_columns, etl.datetime_parts): fitted by the ETL, then
encoded by its shard writer and by scoring to the same numbers, bit for bit, whatever the Spark session's or the
Python process's time zone; calendar parts are those of the instant in UTC."""
from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest

from etl import tabular
from hvdtrain.core import config
from hvdtrain.data import features
from tests.support import feature_paths
from tests.support.spark_jvm import module_session

pytestmark = pytest.mark.spark

PARTS = ["year", "month", "day_of_week", "hour"]
# 23:30 UTC on New Year's Eve is already 2025 east of Greenwich and still the 31st at 15:30 in Los Angeles
_ROWS = """SELECT * FROM VALUES
  (0, DATE '2024-12-31', TIMESTAMP '2024-12-31 23:30:00Z', 1.0),
  (1, DATE '1969-07-20', TIMESTAMP '1969-07-20 20:17:40.5Z', 2.0),
  (2, NULL, NULL, NULL),
  (3, DATE '2024-02-29', TIMESTAMP '2024-02-29 00:00:00.000001Z', 4.0)
  AS t(id, d, ts, x)"""


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("datetime_features")


@pytest.fixture(scope="module")
def cfg(base):
    return config.from_dict({"name": "dates", "workdir": str(base),
                             "source": {"path": str(base / "in"), "format": "parquet", "text_column": None,
                                        "numeric_columns": ["x"], "datetime_columns": ["d", "ts"]},
                             "etl": {"datetime_parts": PARTS}}, base_dir=str(base))


@pytest.fixture(scope="module")
def spark(cfg):
    yield from module_session(cfg)


def test_writer_and_scoring_encode_datetimes_bit_for_bit_in_any_time_zone(spark, cfg) -> None:
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"  # hvdtrain's session fixes it
    df = spark.sql(_ROWS)
    fitted = tabular.fit(df, cfg.source, cfg.etl)
    names = features.numeric_names(fitted)
    assert names[:4] == ["x", "d:epoch", "d:year", "d:month_sin"] and len(names) == 1 + 2 * 8
    assert fitted["numeric_features"] == names and fitted["datetime"]["kinds"] == {"d": "date", "ts": "timestamp"}
    etl = feature_paths.etl_encode(df, cfg.source, fitted)["numeric"]
    scored, reasons = feature_paths.score_encode(df, fitted)
    np.testing.assert_array_equal(scored["numeric"], etl)
    np.testing.assert_array_equal(etl[2], np.zeros(len(names), np.float32))  # NULL: imputed with the mean: 0

    saved = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Tokyo"  # this process (the writer's encode here) and the session both elsewhere
    time.tzset()
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        np.testing.assert_array_equal(feature_paths.etl_encode(df, cfg.source, fitted)["numeric"], etl)
        np.testing.assert_array_equal(feature_paths.score_encode(df, fitted)[0]["numeric"], etl)
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        os.environ.pop("TZ") if saved is None else os.environ.__setitem__("TZ", saved)
        time.tzset()


def test_calendar_parts_are_those_of_the_utc_instant() -> None:
    micros = 1735687800 * 1_000_000  # 2024-12-31 23:30:00 UTC, a Tuesday
    row = features.datetime_values([micros, None], "timestamp", PARTS)
    year, month, dow, hour = 2024, 11, 1, 23  # 0-based month and weekday (Monday 0)
    want = [micros / 1e6, year, math.sin(2 * math.pi * month / 12), math.cos(2 * math.pi * month / 12),
            math.sin(2 * math.pi * dow / 7), math.cos(2 * math.pi * dow / 7),
            math.sin(2 * math.pi * hour / 24), math.cos(2 * math.pi * hour / 24)]
    np.testing.assert_allclose(row[0], want, rtol=1e-12, atol=1e-12)
    assert np.isnan(row[1]).all()
    day = features.datetime_values([-165], "date", ["year", "month", "day_of_week"])[0]  # 1969-07-20, a Sunday
    np.testing.assert_allclose(day, [-165, 1969, math.sin(2 * math.pi * 6 / 12), math.cos(2 * math.pi * 6 / 12),
                                     math.sin(2 * math.pi * 6 / 7), math.cos(2 * math.pi * 6 / 7)], atol=1e-12)


def test_a_string_column_in_datetime_columns_fails_in_one_line(spark, base) -> None:
    from etl import sources
    from hvdtrain.core.errors import DataError

    path = base / "strings"
    spark.sql("SELECT 'k' AS id, 'a' AS label, '2024-01-01' AS day").write.parquet(str(path))
    bad = config.from_dict({"name": "bad", "workdir": str(base),
                            "source": {"path": str(path), "format": "parquet", "text_column": None,
                                       "datetime_columns": ["day"]}}, base_dir=str(base))
    with pytest.raises(DataError, match=r"datetime_columns names 'day', a STRING column .*CAST") as err:
        sources.read(spark, bad)
    assert "\n" not in str(err.value)
