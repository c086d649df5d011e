"""A numeric value is fitted (Spark) as the ETL's writer and scoring encode it (Python), for every column type a
Hive table has, NULL and NaN included; and a categorical INT with NULLs or a DOUBLE NaN reaches its fitted slot in
scoring too.

Before, scoring read an INT column with NULLs as pandas float64, so a categorical 5 became "5.0" against the
fitted "5" (the unknown bucket), a DOUBLE NaN was missing at scoring but "nan" at fit, and a NaN in a numeric
column was imputed by scoring where the ETL rejects the row (validation's non_finite rule); a BINARY or ARRAY
column named in numeric_columns failed deep in Spark (a STRING column stays numeric: validation checks each
value)."""
from __future__ import annotations

import decimal

import numpy as np
import pytest

from etl import sources, stats
from hvdtrain.core import config
from hvdtrain.core.errors import DataError
from tests.support import feature_paths
from tests.support.spark_jvm import module_session, parquet_job

pytestmark = pytest.mark.spark

D = decimal.Decimal
_NUMERIC = {  # each column: its type and values, one per row (row 2 is all NULL)
    "b": ("boolean", [True, False, None, True, False]),
    "i": ("int", [5, -3, None, 2**31 - 1, 0]),
    "l": ("bigint", [2**62 + 1, -7, None, 3, 2**53 + 1]),
    "f": ("float", [0.1, 1e10, None, -7.7, 3.4e38]),
    "d": ("double", [0.1, 8.41e21, None, 5e-324, -1e-300]),
    "dec": ("decimal(38,18)", [D("0.000000010000000000"), D("12.5"), None, D("12345678901234567890.123456789012345678"),
                               D("-3")]),
    "dec2": ("decimal(18,2)", [D("1234567890123456.78"), D("0.01"), None, D("100"), D("-9007199254740993.00")]),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("numeric_forms")


@pytest.fixture(scope="module")
def spark(base):
    yield from module_session(parquet_job(base))


def _source(names, **extra):
    return config.SourceConfig(path="/unused", format="parquet", text_column=None, numeric_columns=list(names),
                               **extra)


def _stats(df, numeric=(), categorical=()) -> dict:
    """Fitted statistics, from etl.stats as etl.tabular.fit computes them."""
    summary = stats.numeric_summary(df, list(numeric), [0.5])
    counted = stats.category_counts(df, list(categorical), 1000)
    return {"numeric_columns": list(numeric), "categorical_columns": list(categorical), "impute": "mean",
            "impute_value": 0.0, "scale": True, "hash_buckets": {},
            "numeric": {c: {"mean": s["mean"], "std": s["std"], "median": s["quantiles"][0], "count": s["count"]}
                        for c, s in summary.items()},
            "categories": {c: counted[c].values for c in categorical}}


def test_numeric_types_fit_as_writer_and_scoring_encode(spark) -> None:
    names = list(_NUMERIC)
    rows = [(r, *(_NUMERIC[c][1][r] for c in names)) for r in range(5)]
    df = spark.createDataFrame(rows, "id long, " + ", ".join(f"{c} {t}" for c, (t, _) in _NUMERIC.items()))
    fitted = _stats(df, names)
    for c in names:  # the fit sees the numbers Python's float() makes (booleans 0/1, decimals)
        values = [float(np.float32(v) if c == "f" else v) for v in _NUMERIC[c][1] if v is not None]
        assert fitted["numeric"][c]["count"] == len(values), c
        assert fitted["numeric"][c]["mean"] == pytest.approx(np.mean(values), rel=1e-12), c
    etl = feature_paths.etl_encode(df, _source(names), fitted)["numeric"]
    scored, reasons = feature_paths.score_encode(df, fitted)
    assert reasons == [None] * 5
    np.testing.assert_array_equal(scored["numeric"], etl)  # bit for bit
    fills = [(fitted["numeric"][c]["mean"] - fitted["numeric"][c]["mean"]) for c in names]
    np.testing.assert_array_equal(etl[2], np.array(fills, np.float32))  # the NULL row: the mean, scaled: 0


def test_a_string_numeric_column_is_parsed_by_spark_in_the_etl_and_in_scoring(spark) -> None:
    """Validation, the fit and the writer read a STRING numeric column through Spark's cast ("1d", " 7 ", a hex
    float all parse); scoring must read the same doubles, not Python's float() (which refuses "1d"), and reject
    what Spark cannot parse, as validation does."""
    values = ["2.5", "1d", None, " 7 ", "0x1p3"]
    df = spark.createDataFrame(list(enumerate(values)), "id long, s string")
    fitted = _stats(df, ["s"])
    assert fitted["numeric"]["s"]["count"] == 4
    assert fitted["numeric"]["s"]["mean"] == pytest.approx((2.5 + 1 + 7 + 8) / 4, rel=1e-12)
    etl = feature_paths.etl_encode(df, _source(["s"]), fitted)["numeric"]
    scored, reasons = feature_paths.score_encode(df, fitted)
    assert reasons == [None] * 5
    np.testing.assert_array_equal(scored["numeric"], etl)  # bit for bit
    bad = spark.createDataFrame([(0, "abc"), (1, "NaN"), (2, "3")], "id long, s string")
    assert feature_paths.score_encode(bad, fitted)[1] == ["bad numeric value in s"] * 2 + [None]


def test_nan_is_a_reject_in_scoring_as_in_the_etl_and_null_is_missing(spark) -> None:
    df = spark.createDataFrame([(0, 1.5), (1, float("nan")), (2, None), (3, float("inf"))], "id long, d double")
    fitted = _stats(df.where("id = 0"), ["d"])
    scored, reasons = feature_paths.score_encode(df, fitted)
    assert reasons == [None, "bad numeric value in d", None, "bad numeric value in d"]
    assert scored["numeric"].shape == (2, 1)


def test_categorical_int_with_nulls_and_double_nan_reach_their_fitted_slot(spark) -> None:
    df = spark.createDataFrame([(0, 5, float("nan"), True, 3.4e38), (1, None, None, None, None),
                                (2, 7, 1e10, False, 0.1), (3, 5, 0.1, True, 0.1)],
                               "id long, i int, d double, b boolean, f float")
    names = ["i", "d", "b", "f"]
    fitted = _stats(df, categorical=names)
    assert "5" in fitted["categories"]["i"] and "nan" in fitted["categories"]["d"]
    src = config.SourceConfig(path="/unused", format="parquet", text_column=None, categorical_columns=names)
    etl = feature_paths.etl_encode(df, src, fitted)["categorical"]
    scored, reasons = feature_paths.score_encode(df, fitted)
    np.testing.assert_array_equal(scored["categorical"], etl)
    assert (etl[[0, 2, 3]] > 0).all() and (etl[1] == 0).all()


@pytest.mark.parametrize("kind, value", [("binary", "X'01'"), ("array<int>", "array(1)"),
                                         ("map<string,int>", "map('a', 1)"), ("date", "DATE '2024-01-31'")])
def test_a_column_without_numbers_in_numeric_columns_fails_in_one_line(spark, base, kind, value) -> None:
    path = base / f"bad_{kind.replace('<', '_').replace('>', '')}"
    spark.sql(f"SELECT 'k' AS id, 'a' AS label, CAST({value} AS {kind}) AS x").write.parquet(str(path))
    cfg = config.from_dict({"name": "bad", "workdir": str(base),
                            "source": {"path": str(path), "format": "parquet", "text_column": None,
                                       "numeric_columns": ["x"]}}, base_dir=str(base))
    with pytest.raises(DataError) as err:
        sources.read(spark, cfg)
    message = str(err.value)
    assert "\n" not in message and "'x'" in message and kind.split("<")[0].upper() in message
    assert "CAST(`x` AS DOUBLE)" in message
