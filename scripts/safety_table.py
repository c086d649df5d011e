"""Bad inputs, tried for real: each case runs hvdtrain's own code on a bad input in a scratch folder and
records the exit code the CLI would end with and what was kept (docs/safety.md's table).

    python scripts/safety_table.py            # prints the Markdown table
    python scripts/safety_table.py --check    # fails unless every case ends in a named error (exit 2, 3 or 4)

No Spark and no TensorFlow: the cases call the checks the jobs run before any work (tests/unit/test_safety_table.py
runs them too).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from etl import job as etl_job  # noqa: E402
from etl import score_job  # noqa: E402
from hvdtrain.core import config, errors
from hvdtrain.core.errors import ANY_ERROR  # noqa: E402
from hvdtrain.data import manifest
from hvdtrain.hadoop import fs
from hvdtrain.observe import tracking
from hvdtrain.runtime import distributed
from hvdtrain.training import checkpoint, resume


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[Path], object]  # raises the error under test
    kept: Callable[[Path], str] = lambda tmp: "nothing was written"


def _load(data: dict) -> Callable[[Path], object]:
    return lambda tmp: config.from_dict({"name": "bad", "workdir": str(tmp), **data}, base_dir=str(tmp))


def _manifest(shard: str = "train/part-0", tokenizer: str = "tokenizer.json", raw: str = "",
              version: int = 1) -> Callable[[Path], object]:
    def run(tmp: Path) -> object:
        doc = {"format_version": version, "features": {"label": {"dtype": "int64", "shape": []}},
               "label_feature": "label", "labels": ["a"], "vocab": {"path": "vocab.txt", "tokenizer": tokenizer},
               "splits": {"train": {"shards": [{"path": shard, "records": 1, "bytes": 1, "sha256": "0" * 64}]}}}
        (tmp / "manifest.json").write_text(raw or json.dumps(doc))
        return manifest.read(str(tmp))
    return run


# What an hvdtrain ETL's ledger says (hvdtrain/hadoop/ledger.py): without it, its files would be refused as foreign.
LEDGER = {"_hvdtrain_ledger.json": '{"format": 1, "writer": "hvdtrain etl", "entries": ["*", "*/*"]}'}


def _etl_output(names: dict[str, str], overwrite: bool) -> Callable[[Path], object]:
    def run(tmp: Path) -> object:
        out = tmp / "out"
        for name, text in names.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)
        cfg = config.from_dict({"name": "bad", "workdir": str(tmp), "source": {"table": "db.t"},
                                "etl": {"output": str(out), "overwrite": overwrite}}, base_dir=str(tmp))
        return etl_job.check_output(cfg.etl)
    return run


def _files_kept(tmp: Path) -> str:
    out = tmp / "out"
    return f"all {sum(1 for p in out.rglob('*') if p.is_file())} files in etl.output kept"


def _vocab(tmp: Path) -> object:
    (tmp / "vocab.txt").write_bytes("[PAD]\n[UNK]\ncaf\xe9\n".encode("latin-1"))
    return etl_job.read_vocab(str(tmp / "vocab.txt"))


def _train_output(tmp: Path) -> object:
    from hvdtrain.training import publish as train

    (tmp / "home").mkdir()
    (tmp / "home" / "notes.txt").write_text("mine")
    return train.check_replaceable(str(tmp / "home"))


def _resume_never(tmp: Path) -> object:
    import numpy as np

    cfg = config.from_dict({"name": "bad", "workdir": str(tmp), "source": {"table": "db.t"},
                            "checkpoint": {"resume": "never"}}, base_dir=str(tmp))
    writer = checkpoint.CheckpointWriter(cfg.checkpoint.dir, 3, 0, None, "max")
    writer.save(10, {"model/0000/w": np.ones(2, np.float32)}, {"step": 10})
    writer.wait()
    return resume.find(cfg.checkpoint, distributed.RankInfo(0, 1, 0, 1, "localhost", "local"), {})


TARGET = score_job.Target("db.p", "db.p_rejects", {"ds": "2026-11-23"}, True)


def _missing_path(tmp: Path) -> object:
    from etl import sources

    cfg = config.from_dict({"name": "bad", "workdir": str(tmp), "source": {"path": str(tmp / "nope"),
                                                                           "format": "csv"}}, base_dir=str(tmp))
    return sources._read_files(None, cfg.source)  # checks the path before Spark reads anything


CASES = [
    Case("source.filter with a second statement (`; DROP TABLE`)", _load({"source": {"table": "db.t", "filter": "a = 1; DROP TABLE x"}})),
    Case("source.filter with Spark variable substitution (`${x}`)", _load({"source": {"table": "db.t", "filter": "ds = '${d}'"}})),
    Case("score.filter with an SQL comment (`--`)", _load({"score": {"filter": "a = 1 -- b"}})),
    Case("score.partition value with a quote", _load({"score": {"partition": "ds=2026' OR '1'='1"}})),
    Case("score.partition value with `${hivevar:x}`", _load({"score": {"partition": "ds=${hivevar:x}"}})),
    Case("score.partition without a value", _load({"score": {"partition": "ds"}})),
    Case("score.output_table not a table name", _load({"score": {"output_table": "db.preds; drop"}})),
    Case("score.max_reject_fraction 1.5", _load({"score": {"max_reject_fraction": 1.5}})),
    Case("score.min_rows -1", _load({"score": {"min_rows": -1}})),
    Case("monitoring.addr not an IP (`all`)", _load({"monitoring": {"addr": "all"}})),
    Case("monitoring.port 70000", _load({"monitoring": {"port": 70000}})),
    Case("train.batch_size 0", _load({"train": {"batch_size": 0}})),
    Case("misspelt key train.epocs", _load({"train": {"epocs": 3}})),
    Case("source.table and source.path both set", _load({"source": {"table": "db.t", "path": "/d", "format": "csv"}})),
    Case("source.path without source.format", _load({"source": {"path": "/d"}})),
    Case("source.encoding cp1252 (Spark reads csv/json in its own charsets only)",
         _load({"source": {"path": "/d", "format": "csv", "encoding": "cp1252"}})),
    Case("source.encoding on a Parquet source", _load({"source": {"path": "/d", "format": "parquet",
                                                                  "encoding": "iso-8859-1"}})),
    Case("validation.text_max_chars below text_min_chars", _load({"validation": {"text_min_chars": 10, "text_max_chars": 5}})),
    Case("manifest shard path /etc/krb5.keytab", _manifest(shard="/etc/krb5.keytab")),
    Case("manifest shard path ../../secrets/keytab", _manifest(shard="../../secrets/keytab")),
    Case("manifest shard path hdfs://nn/other/x", _manifest(shard="hdfs://nn/other/x")),
    Case("manifest tokenizer /home/alice/.ssh/id_rsa", _manifest(tokenizer="/home/alice/.ssh/id_rsa")),
    Case("manifest.json not JSON", _manifest(raw="{not json")),
    Case("manifest format_version 99", _manifest(version=99)),
    Case("etl.output=/user/alice (foreign files) with --overwrite", _etl_output({"thesis.tex": "x", "train/a": "y"}, True), _files_kept),
    Case("etl.output holds a dataset, no --overwrite", _etl_output({"manifest.json": "{}", "train/p": "x", **LEDGER}, False), _files_kept),
    Case("etl.output holds an unfinished ETL, no --overwrite", _etl_output({"vocab.txt": "x", **LEDGER}, False), _files_kept),
    Case("etl.vocab_file in Latin-1, not UTF-8", _vocab, lambda tmp: "the vocabulary file, unchanged"),
    Case("source.path that does not exist", _missing_path),
    Case("train.output is a folder of someone else's files", _train_output, lambda tmp: "notes.txt kept; no training ran"),
    Case("checkpoint.resume=never over committed checkpoints", _resume_never, lambda tmp: "ckpt-10 kept"),
    Case("scoring an empty input with --overwrite", lambda tmp: score_job.check_volume(
        {"rows_in": 0, "scored": 0, "rejected": 0}, 1, 0.5, TARGET), lambda tmp: "the old partition (still published)"),
    Case("scoring input 75% rejected with --overwrite", lambda tmp: score_job.check_volume(
        {"rows_in": 40, "scored": 10, "rejected": 30}, 1, 0.5, TARGET), lambda tmp: "the old partition (still published)"),
    Case("MLflow model name with a quote (`x' or name != '`)", lambda tmp: tracking.search_filter(name="x' or name != '")),
    Case("unsupported filesystem s3://bucket/x", lambda tmp: fs.resolve("s3://bucket/x")),
]


def run_case(case: Case) -> tuple[int, str, str]:
    """(exit code, the message's first 110 characters, what was kept) of one case, in a scratch folder."""
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bad-") as folder:
        tmp = Path(folder)
        try:
            case.run(tmp)
        except ANY_ERROR as exc:  # any exception is the result; a non-hvdtrain one is a defect
            message = str(exc).replace(folder, "<tmp>").splitlines()[0] if str(exc) else type(exc).__name__
            name = type(exc).__name__
            return errors.exit_code(exc), f"{name}: {message[:110]}", case.kept(tmp)
        return 0, "accepted (no error)", case.kept(tmp)


def table() -> tuple[str, list[int]]:
    rows = ["| # | bad input | exit | message (start) | kept |", "|---|---|---|---|---|"]
    codes = []
    for i, case in enumerate(CASES, start=1):
        code, message, kept = run_case(case)
        codes.append(code)
        rows.append(f"| {i} | {case.name} | {code} | {message.replace('|', '/')} | {kept} |")
    return "\n".join(rows), codes


def main() -> int:
    text, codes = table()
    print(text)
    if "--check" in sys.argv and any(c not in (2, 3, 4) for c in codes):
        print(f"cases without a named error: {[i + 1 for i, c in enumerate(codes) if c not in (2, 3, 4)]}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
