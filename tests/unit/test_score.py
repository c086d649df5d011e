"""Pure parts of batch scoring: model references, partitions, reject rules, the per-batch scorer, drift math."""
import datetime as dt

import numpy as np
import pandas as pd
import pytest

from hvdtrain import score
from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError, DataError
from hvdtrain.data import drift, features
from hvdtrain.observe import tracking

TEXT_OPTS = features.TextOptions(max_length=8)
VOCAB = features.SPECIAL_TOKENS + list("abcdefgh") + ["##" + c for c in "abcdefgh"] + ["bad", "good", "film"]


def _spec(**kw) -> score.ScoreSpec:
    tok = features.from_vocab(VOCAB, TEXT_OPTS).to_str()
    base = dict(key_column="id", text_column="text", numeric_columns=("age",), categorical_columns=(),
                extra_columns=("region",), labels=("neg", "pos"), tokenizer_json=tok,
                tabular={"numeric_columns": ["age"], "categorical_columns": [], "impute": "mean", "impute_value": 0.0,
                         "scale": False, "numeric": {"age": {"mean": 30.0, "std": 1.0, "median": 30.0, "count": 9}},
                         "categories": {}},
                model_uri="runs:/r/model", model_version="3", manifest_digest="abc", model_digest="m1",
                scored_at=dt.datetime(2026, 11, 23, tzinfo=dt.timezone.utc), predict_batch=2,
                input_names=("input_ids", "attention_mask", "numeric"))
    base.update(kw)
    return score.ScoreSpec(**base)


def test_model_references_parse() -> None:
    assert tracking.parse_model_ref("runs:/abc/model") == ("run", "abc", "model")
    assert tracking.parse_model_ref("runs:/abc") == ("run", "abc", "model")
    assert tracking.parse_model_ref("models:/reviews/3") == ("version", "reviews", "3")
    assert tracking.parse_model_ref("models:/reviews@champion") == ("alias", "reviews", "champion")
    assert tracking.parse_model_ref("models:/reviews/latest") == ("latest", "reviews", "")
    assert tracking.parse_model_ref("reviews") == ("latest", "reviews", "")
    with pytest.raises(ValueError, match="version or an alias"):
        tracking.parse_model_ref("models:/reviews")


def test_partition_specs_and_score_block_validate() -> None:
    assert config.parse_partition("ds=2026-11-23, region=eu") == {"ds": "2026-11-23", "region": "eu"}
    for bad in ("ds", "=x", "ds=x,ds=y", "ds='x'"):
        with pytest.raises(ValueError):
            config.parse_partition(bad)
    with pytest.raises(ConfigError, match="score.predict_batch must be >= 1"):
        config.from_dict({"score": {"predict_batch": 0}})
    with pytest.raises(ConfigError, match="score.output_table must be a Hive table name"):
        config.from_dict({"score": {"output_table": "not a table"}})
    with pytest.raises(ConfigError, match="score.fail_on_drift is not a known key|score.fail_on_drif"):
        config.from_dict({"score": {"fail_on_drif": True}})


def test_target_plan_defaults_and_flags() -> None:
    from etl.score_job import plan_target

    cfg = config.from_dict({"score": {"output_table": "db.p", "partition": "ds=2026-01-01"}})
    t = plan_target(cfg.score, None, None, False, dt.date(2026, 11, 23))
    assert (t.table, t.rejects_table, t.partition, t.overwrite) == ("db.p", "db.p_rejects", {"ds": "2026-01-01"}, False)
    t = plan_target(config.from_dict({}).score, "db.q", None, True, dt.date(2026, 11, 23))
    assert t.partition == {"ds": "2026-11-23"} and t.overwrite and t.where() == "`ds` = '2026-11-23'"
    with pytest.raises(DataError, match="no output table"):
        plan_target(config.from_dict({}).score, None, None, False, dt.date(2026, 11, 23))
    with pytest.raises(DataError, match="--partition 'ds' must be column=value"):
        plan_target(cfg.score, "db.q", "ds", False, dt.date(2026, 11, 23))


def test_rows_that_cannot_be_scored_are_rejected_with_a_reason_and_the_rest_predicted() -> None:
    spec = _spec()
    frame = pd.DataFrame({"id": ["1", "2", None, "4", "5", "6", "7"],
                          "text": ["good film", None, "bad", "  ", "bad", "ab", "caf\ufffd"],  # \ufffd: Latin-1 read as UTF-8
                          "age": ["31", "30", "1", "2", "old", None, "3"], "region": ["n", "s", "e", "w", "n", "s", "e"]})
    seen = []

    def predict(x):  # a stand-in model: logit of "pos" = number of "good" tokens
        seen.append({k: v.copy() for k, v in x.items()})
        good = (x["input_ids"] == VOCAB.index("good")).sum(axis=1)
        return np.stack([np.zeros(len(good)), good.astype(float)], axis=1)

    out = score.score_frame(frame, spec, features.FeatureEncoder(spec.tokenizer_json, spec.tabular), predict)
    assert list(out["id"]) == ["1", "6", "2", None, "4", "5", "7"]  # scored first, then rejects
    assert list(out["reject_reason"]) == [None, None, "null text (text)", "null key (id)", "blank text (text)",
                                          "bad numeric value in age", "undecodable text (text): set source.encoding"]
    assert list(out["predicted_label"][:2]) == ["pos", "neg"] and out["predicted_label"][2:].isna().all()
    probs = np.stack([out[c] for c in score.prob_columns(2)], axis=1)  # one column per class, in label order
    np.testing.assert_allclose(probs[0], [1 / (1 + np.e), np.e / (1 + np.e)], rtol=1e-6)
    assert out["predicted_score"][1] == pytest.approx(0.5)
    assert np.isnan(probs[2:]).all() and np.isnan(out["predicted_score"][2:]).all()  # rejects: null after finish
    assert list(out["region"]) == ["n", "s", "s", "e", "w", "n", "e"]
    cols = [c.split(" ")[0].strip("`") for c in score.batch_ddl("id", 2, [("region", "string")]).split(", ")]
    assert list(out.columns) == cols
    assert out["reject_input"][5] == '{"text": "bad", "age": "old"}'
    # predicted in batches of predict_batch=2; the missing age is imputed exactly as the ETL does
    assert [len(b["input_ids"]) for b in seen] == [2]
    np.testing.assert_array_equal(seen[0]["numeric"][:, 0], [31.0, 30.0])


def test_features_come_from_the_etl_encoder() -> None:
    """The scoring encoder is the ETL's: same ids as features.encode with the same tokenizer."""
    spec = _spec(numeric_columns=(), tabular=None, input_names=("input_ids", "attention_mask"))
    enc = features.FeatureEncoder(spec.tokenizer_json, None)
    frame = pd.DataFrame({"id": ["1"], "text": ["GOOD film zz"]})
    got = score.encode_rows(frame, spec, enc)
    ids, mask = features.encode(features.from_vocab(VOCAB, TEXT_OPTS), ["GOOD film zz"])
    np.testing.assert_array_equal(got["input_ids"], ids)
    np.testing.assert_array_equal(got["attention_mask"], mask)
    assert enc.unknown_tokens(ids, mask) == (1, 3)  # "zz" cannot be spelled: one [UNK] among 3 real tokens


def test_psi_flags_a_shifted_distribution_and_not_an_unshifted_one() -> None:
    ref = [0.1] * 10 + [0.0]
    assert drift.psi(ref, ref) == pytest.approx(0.0)
    assert drift.psi(ref, [0.11, 0.09] * 5 + [0.0]) == pytest.approx(0.01003, abs=1e-4)
    shifted = [0.0] * 5 + [0.2] * 5 + [0.0]
    assert drift.psi(ref, shifted) > 1.0
    edges = [1.0, 2.0, 3.0]
    assert [drift.numeric_bin(v, edges) for v in (0.5, 1.0, 2.5, 9.0, None, float("nan"))] == [0, 1, 2, 3, 4, 4]
    reference = {"numeric": {"age": {"edges": edges, "shares": [0.25] * 4 + [0.0]}},
                 "categorical": {"city": {"bins": ["a", "b", drift.OTHER, drift.MISSING],
                                          "shares": [0.5, 0.5, 0.0, 0.0]}},
                 "text": {"column": "text", "unknown_token_rate": 0.0}}
    calm = drift.report(reference, {"numeric": {"age": [25, 25, 25, 25, 0]},
                                    "categorical": {"city": [50, 50, 0, 0]},
                                    "text": {"unknown": 1, "tokens": 1000}}, 0.2, 0.05)
    assert not calm["drifted"] and calm["alerts"] == []
    moved = drift.report(reference, {"numeric": {"age": [0, 0, 10, 90, 0]},
                                     "categorical": {"city": [10, 10, 80, 0]},
                                     "text": {"unknown": 300, "tokens": 1000}}, 0.2, 0.05)
    assert moved["drifted"] and len(moved["alerts"]) == 3
    assert moved["columns"]["age"]["psi"] > 0.2 and moved["text"]["unknown_token_rate"] == 0.3


def test_output_schema_ddl() -> None:
    ddl = score.output_ddl("id", [("region", "string")])
    assert ddl.startswith("`id` string, `predicted_label` string, `predicted_score` float, "
                          "`probabilities` array<float>, `region` string, `model_uri` string")
    assert ddl.endswith("`reject_reason` string, `reject_input` string")


def test_finish_expressions_give_the_output_columns_in_order_with_the_run_constants() -> None:
    spec = _spec(model_uri="models:/it's\\here/1")
    exprs = score.finish_exprs(spec)
    names = [c.split(" ")[0].strip("`") for c in score.output_ddl("id", [("region", "string")]).split(", ")]
    assert [e.rsplit(" AS ", 1)[-1].strip("`") for e in exprs] == names
    assert "'models:/it\\'s\\\\here/1' AS `model_uri`" in exprs  # quote and backslash escaped for Spark SQL
    assert "TIMESTAMP '2026-11-23 00:00:00.000000+00:00' AS `scored_at`" in exprs
    assert "array(`__class_probability_0`, `__class_probability_1`)" in exprs[3]


def test_a_folder_without_a_model_is_refused_with_what_to_pass(tmp_path) -> None:
    with pytest.raises(DataError, match="has no model.keras"):
        score.bundle_from_folder(str(tmp_path))
    with pytest.raises(DataError, match="no labels.json there"):
        score.load_bundle(str(tmp_path / "nowhere/at/all"))


@pytest.mark.skipif(__import__("sys").version_info >= (3, 12), reason="zipimport invalidation is lazy from 3.12")
def test_zip_finders_are_released_so_the_per_task_cache_invalidation_stays_cheap(tmp_path, monkeypatch) -> None:
    """PySpark calls importlib.invalidate_caches() before each task; cached zip finders each re-read their archive."""
    import importlib
    import sys
    import zipfile
    import zipimport

    archive = tmp_path / "pkgs.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("zpkg/__init__.py", "")
        zf.writestr("zpkg/sub/__init__.py", "")
        zf.writestr("zpkg/sub/a.py", "VALUE = 1\n")
        zf.writestr("zpkg/sub/b.py", "VALUE = 2\n")
    monkeypatch.syspath_prepend(str(archive))
    for name in [m for m in sys.modules if m.startswith("zpkg")]:
        monkeypatch.delitem(sys.modules, name)
    importlib.import_module("zpkg.sub.a")

    def zip_finders() -> list[str]:
        return [p for p, f in sys.path_importer_cache.items() if isinstance(f, zipimport.zipimporter)
                and p.startswith(str(archive))]

    reads = []
    real = zipimport._read_directory
    monkeypatch.setattr(zipimport, "_read_directory", lambda path: reads.append(path) or real(path))
    importlib.invalidate_caches()
    assert len(zip_finders()) >= 2 and reads.count(str(archive)) == len(zip_finders())  # one full read per finder
    score.release_zip_finders()
    assert zip_finders() == []
    reads.clear()
    importlib.invalidate_caches()
    assert reads == []  # what each later task pays
    assert importlib.import_module("zpkg.sub.b").VALUE == 2  # imports from the archive still work
    monkeypatch.undo()
    for cache in (sys.path_importer_cache, sys.modules):
        for name in [k for k in cache if k.startswith((str(archive), "zpkg"))]:
            cache.pop(name, None)
