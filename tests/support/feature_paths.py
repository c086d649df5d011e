"""The two ways a row becomes features, for tests that compare them: the ETL's shard writer (Spark rows made by
``etl.job.encoder_inputs``, encoded by :class:`hvdtrain.data.features.FeatureEncoder`) and scoring (the rows selected by
``hvdtrain.score.input_exprs``, read as pandas batches in ``mapInPandas``, checked and encoded by
``hvdtrain.score.reject_reasons`` / ``encode_rows``)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from hvdtrain import score
from hvdtrain.data import features


def etl_encode(df: Any, src: Any, stats: dict) -> dict[str, np.ndarray]:
    """Features of ``df``'s rows (ordered by ``id``) as the ETL's writer makes them."""
    from etl import job, writer
    from etl.fitted import Fitted

    rows, columns = job.encoder_inputs(df, src, stats)
    table = rows.orderBy("id").toArrow()
    encoder = writer.RecordEncoder(Fitted(labels=[], tabular_stats=stats), columns)
    return encoder.features_of(table.combine_chunks().to_batches()[0]) if table.num_rows else {}


def score_encode(df: Any, stats: dict) -> tuple[dict[str, np.ndarray], list]:
    """(features of the rows scoring keeps, reject reason of every row), rows ordered by ``id``, as scoring's
    tasks make them from Arrow batches."""
    import pandas as pd

    bundle = score.ModelBundle(b"", {"labels": ["a", "b"], "preprocessing": {"tabular": stats}}, None, "test")
    spec = score.make_spec(bundle, score.ScoreOptions(key_column="id"))
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    cols = ["id", *bundle.feature_columns()]
    exprs, double_text = score.input_exprs(types, spec, cols)
    spec = replace(spec, double_text_columns=double_text)
    width = {"numeric": len(features.numeric_names(stats)), "categorical": len(stats["categorical_columns"])}

    def run(batches):
        encoder = features.FeatureEncoder(None, stats)
        for frame in batches:
            reasons, numeric = score.reject_reasons(frame, spec)
            ok = np.array([r is None for r in reasons], dtype=bool)
            good = frame[ok].reset_index(drop=True)
            feats = score.encode_rows(good, spec, encoder, {c: v[ok] for c, v in numeric.items()})
            out = pd.DataFrame({"id": frame["id"].astype("int64"), "reason": reasons})
            for name, n in width.items():
                for j in range(n):
                    full = np.full(len(frame), np.nan)
                    if name in feats:
                        full[ok] = feats[name][:, j]
                    out[f"{name}{j}"] = full
            yield out

    schema = "id long, reason string, " + ", ".join(f"{name}{j} double" for name, n in width.items()
                                                     for j in range(n))
    result = df.selectExpr(*exprs).mapInPandas(run, schema.rstrip(", ")).orderBy("id").toPandas()
    ok = result["reason"].isna().to_numpy()
    out = {name: result[[f"{name}{j}" for j in range(n)]].to_numpy()[ok] for name, n in width.items() if n}
    encoded = {name: out[name].astype(np.float32 if name == "numeric" else np.int64) for name in out}
    return encoded, [r if isinstance(r, str) else None for r in result["reason"]]
