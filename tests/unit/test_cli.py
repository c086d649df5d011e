"""The command line: options and overrides in any order, errors that name what is wrong, exit codes."""
from __future__ import annotations

import pytest

from hvdtrain import cli
from hvdtrain.core import errors


@pytest.mark.parametrize("argv", [
    ["train", "job.yaml", "--np", "3", "train.epochs=3"],
    ["train", "--np", "3", "job.yaml", "train.epochs=3"],
    ["train", "job.yaml", "train.epochs=3", "--np", "3"],
    ["train", "job.yaml", "--np=3", "train.epochs=3", "--json"],
])
def test_train_takes_options_and_overrides_in_any_order(argv: list[str]) -> None:
    args = cli.parse_args(argv)
    assert (args.config, args.overrides, args.np) == ("job.yaml", ["train.epochs=3"], 3)


def test_overrides_keep_their_order_around_options() -> None:
    args = cli.parse_args(["train", "job.yaml", "a.b=1", "--np", "1", "a.b=2", "--json", "c.d=3"])
    assert args.overrides == ["a.b=1", "a.b=2", "c.d=3"] and args.np == 1 and args.json  # later ones win


@pytest.mark.parametrize("argv,expected", [
    (["etl", "job.yaml", "--overwrite", "etl.max_length=32", "--master", "local[1]", "x.y=1"],
     {"overwrite": True, "master": "local[1]", "overrides": ["etl.max_length=32", "x.y=1"]}),
    (["demo", "job.yaml", "train.epochs=1", "--np", "1", "--verbose"],
     {"np": 1, "verbose": True, "overrides": ["train.epochs=1"]}),
    (["config", "job.yaml", "train.epochs=1"], {"overrides": ["train.epochs=1"]}),
])
def test_every_config_subcommand_takes_overrides_after_options(argv: list[str], expected: dict) -> None:
    args = cli.parse_args(argv)
    assert {k: getattr(args, k) for k in expected} == expected


@pytest.mark.parametrize("argv,named", [
    (["train", "job.yaml", "--npp", "2", "train.epochs=3"], "unrecognized arguments: --npp"),
    (["train", "job.yaml", "train.epochs=3", "--jsn"], "unrecognized arguments: --jsn"),
    (["etl", "--overwirte", "job.yaml"], "unrecognized arguments: --overwirte"),
    (["checkpoints", "list", "dir", "train.epochs=3"], "unrecognized arguments: train.epochs=3"),
    (["train", "job.yaml", "--np", "0"], "--np must be >= 1 (got 0)"),
])
def test_a_mistyped_option_is_an_error_naming_it(argv: list[str], named: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(argv)
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"hvdtrain {argv[0]}: error: {named}"


def test_yarn_passes_everything_through() -> None:
    args = cli.parse_args(["yarn", "submit", "job.yaml", "--num-workers", "2", "a.b=1", "--dry-run"])
    assert args.rest == ["submit", "job.yaml", "--num-workers", "2", "a.b=1", "--dry-run"]


def test_the_help_lists_the_exit_codes(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    out = capsys.readouterr().out
    for code, meaning in errors.EXIT_CODES.items():
        assert f"{code:>3}  {meaning}" in out


@pytest.mark.parametrize("exc,code", [
    (errors.ConfigError("train.epochs", 0, "must be > 0"), 2),
    (errors.UsageError("usage: ..."), 2),
    (errors.DataError("no manifest"), 3),
    (errors.EnvironmentProblem("no java"), 4),
    (errors.StepFailed("rank 1 died"), 5),
    (errors.StepFailed("a rank stalled", errors.EXIT_STALLED), 75),
    (KeyboardInterrupt(), 130),
    (ValueError("a bug"), 1),
])
def test_exit_code_says_which_kind_of_error(exc: BaseException, code: int) -> None:
    assert errors.exit_code(exc) == code and code in errors.EXIT_CODES


def test_a_user_error_is_the_last_line_and_sets_the_exit_code(tmp_path, capsys) -> None:
    (tmp_path / "job.yaml").write_text("name: t\ntrain: {epochs: 0}\n")
    assert cli.main(["config", str(tmp_path / "job.yaml"), "train.batch_size=4"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "hvdtrain: error: train.epochs must be > 0, or auto (by the train split's size) (got 0)"
    assert cli.main(["checkpoints", "list", str(tmp_path / "none")]) == 3
    assert capsys.readouterr().err.splitlines()[-1].startswith("hvdtrain: error: no checkpoints (ckpt-*) under ")


def test_train_summary_names_accuracy_f1_outputs_and_mlflow() -> None:
    result = {"test_accuracy": 0.88123, "test_macro_f1": 0.87456, "validation_accuracy": 0.9, "epochs_run": 3,
              "world_size": 2, "ranks_agree": True, "run_id": "abc123", "tracking_uri": "sqlite:///m.db",
              "report": "/out/eval_report.json", "exports": {"keras": "/out/model.keras"}}
    text = cli.train_summary(result)
    for expected in ("test accuracy        0.8812", "test macro F1        0.8746", "/out/eval_report.json",
                     "/out/model.keras", "run abc123 at sqlite:///m.db", "--json"):
        assert expected in text, expected
    assert "elastic" not in text
    elastic = cli.train_summary({**result, "run_id": None, "sizes": [2, 1, 2]})
    assert "weights identical on every rank: True; elastic, world sizes 2, 1, 2" in elastic
    assert "MLflow               not logged (tracking.enabled is false" in elastic
