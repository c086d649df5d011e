"""A categorical value lands in the same vocabulary slot at fit (Spark counts its string) and at encode (Python
makes the string from the value a Spark row or an Arrow batch holds), for every column type a Hive table has.

Before, a BOOLEAN was counted as "true" and encoded as "True", a DOUBLE counted as "1.0E10" and encoded as
"10000000000.0", a DECIMAL(38,18) as "0.000000010000000000" and "1.0000000000E-8", a FLOAT as "0.1" and
"0.10000000149011612", a TIMESTAMP as "... 12:34:56.5" and "... 12:34:56.500000": every such row fell in the
unknown bucket."""
from __future__ import annotations

import datetime
import decimal

import numpy as np
import pytest

from etl import stats
from hvdtrain.data import features
from tests.support.spark_jvm import module_session, parquet_job

pytestmark = pytest.mark.spark

_RNG = np.random.default_rng(17)
# doubles of every magnitude, where Java's layout changes (1e-3, 1e7), digits Java 17 prints long (8.41e21)
_DOUBLES = [0.1, 1e10, 1e-5, 123.25, 8.41e21, 1e7, 9999999.999, 1e-3, 0.00099, -2.5, 0.0, -0.0, 1e300, 5e-324,
            float("nan"), float("inf"),
            *(_RNG.choice([-1, 1], 60) * 10.0 ** _RNG.uniform(-12, 25, 60)).tolist()]
_COLUMNS = {
    "b": ("boolean", [True, False]),
    "i": ("int", [5, -3, 0, 2**31 - 1]),
    "l": ("bigint", [2**62, -7]),
    "f": ("float", [0.1, 1e10, 1e-5, 3.25, -7.7]),
    "d": ("double", _DOUBLES),  # a NaN is a value, not a NULL
    "dec": ("decimal(38,18)", [decimal.Decimal("0.00000001"), decimal.Decimal("12.5"), decimal.Decimal(-3)]),
    "dec2": ("decimal(10,2)", [decimal.Decimal("1.50"), decimal.Decimal("0.01"), decimal.Decimal("100")]),
    "dt": ("date", [datetime.date(2024, 1, 31), datetime.date(999, 12, 1)]),
    "ts": ("timestamp", [datetime.datetime(2024, 1, 31, 12, 34, 56, 500000), datetime.datetime(2024, 2, 1),
                         datetime.datetime(2023, 7, 1, 0, 0, 0, 123)]),
    "s": ("string", ["a", "True"]),
}


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    yield from module_session(parquet_job(tmp_path_factory.mktemp("category_forms")))


@pytest.fixture(scope="module")
def table(spark):
    """One column per type, each row holding the next value of every column (cycled); plus a row of NULLs."""
    names = list(_COLUMNS)
    width = max(len(values) for _, values in _COLUMNS.values())
    rows = [tuple(_COLUMNS[c][1][r % len(_COLUMNS[c][1])] for c in names) for r in range(width)]
    ddl = ", ".join(f"{c} {t}" for c, (t, _) in _COLUMNS.items())
    df = spark.createDataFrame([*rows, tuple(None for _ in names)], ddl)
    return df.withColumn("ntz", df["ts"].cast("timestamp_ntz"))


def _fitted(df) -> dict:
    names = df.columns
    counted = stats.category_counts(df, names, 1000)
    return {"categorical_columns": names, "categories": {c: counted[c].values for c in names}}


def test_every_type_encodes_to_the_slot_it_was_fitted_in(table) -> None:
    fitted = _fitted(table)
    names = table.columns
    expected = table.select(*[stats.category_value(table, c).alias(c) for c in names]).collect()
    rows = table.collect()  # what the ETL's shard writer encodes (Spark rows)
    ids = features.category_ids(fitted, [[r[c] for c in names] for r in rows], len(rows))
    for i, (row, want) in enumerate(zip(rows, expected)):
        for j, c in enumerate(names):
            if want[c] is None:
                assert ids[i, j] == 0, f"{c}: a NULL is the unknown bucket"
                continue
            assert ids[i, j] > 0, (f"{c} ({table.schema[c].dataType.simpleString()}): {row[c]!r}, fitted as "
                                   f"{want[c]!r}, encodes to the unknown bucket")
            assert fitted["categories"][c][ids[i, j] - 1] == want[c]


def test_scoring_batches_encode_to_the_fitted_slot(table) -> None:
    """Scoring reads Arrow batches as pandas (mapInPandas): numpy booleans, pandas timestamps, decimals."""
    fitted = _fitted(table)
    names = table.columns
    frame = table.dropna().toPandas()  # a column with NULLs would turn an int into float in pandas
    ids = features.category_ids(fitted, [list(r) for r in frame[names].itertuples(index=False)], len(frame))
    want = features.category_ids(fitted, [[r[c] for c in names] for r in table.dropna().collect()], len(frame))
    assert (ids > 0).all()
    np.testing.assert_array_equal(ids, want)
