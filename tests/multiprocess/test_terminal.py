"""What a user sees at a terminal: `hvdtrain train --np 2` and `hvdtrain etl` run as typed, read off the screen.

The terminal is a tmux pane (a private tmux server per test); ``capture-pane``
gives the screen as a terminal shows it after every carriage return and
escape sequence, so an in-place progress bar counts once and a bar redrawn on
new lines would count many times. The same commands with pipes stand for CI
and YARN logs, where lines must stay as they were.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdtrain.core import config, tasks
from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset
from hvdtrain.observe import console

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = {"embed_dim": 16, "num_heads": 2, "ff_dim": 32, "num_layers": 1, "dropout": 0.1}
BAR = re.compile(r"^epoch 2/2 step (\d+)/\1 \| loss \d+\.\d{4} \| [\d,]+ samples/s \| 100%\|.*\| ETA 00:00$")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "OMPI_", "PMI_")) and k not in ("MLFLOW_TRACKING_URI", console.CONSOLE_ENV)}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), MLFLOW_DISABLE_TELEMETRY="true",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    return env


def on_screen(cmd: list[str], tmp_path: Path, timeout: float = 300) -> tuple[int, list[str]]:
    """Run ``cmd`` in a 120x40 terminal; returns its exit code and every line the terminal shows, history included."""
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux not installed: the terminal tests read the screen through a tmux pane (apt-get install tmux)")
    server = ["tmux", "-L", f"hvdtrain-test-{os.getpid()}-{time.monotonic_ns()}"]
    script = tmp_path / "typed.sh"
    script.write_text(f"cd {shlex.quote(str(REPO))}\n{shlex.join(cmd)}\necho EXIT=$?\nsleep 600\n")
    subprocess.run([*server, "new-session", "-d", "-x", "120", "-y", "40", "bash", str(script)], env=_env(),
                   check=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            screen = subprocess.run([*server, "capture-pane", "-p", "-J", "-S", "-"], capture_output=True, text=True,
                                    check=True).stdout
            done = re.search(r"^EXIT=(\d+)$", screen, re.M)
            if done:
                lines = [line.rstrip() for line in screen[:done.start()].splitlines()]
                return int(done.group(1)), [line for line in lines if line]
            if time.monotonic() > deadline:
                pytest.fail(f"{shlex.join(cmd)} did not finish in {timeout}s; the screen:\n{screen[-4000:]}")
            time.sleep(0.2)
    finally:
        subprocess.run([*server, "kill-server"], capture_output=True)


def _job(tmp_path: Path, data_dir: Path) -> Path:
    cfg = config.from_dict({
        "name": "screen", "workdir": str(tmp_path), "source": {"table": "demo.reviews"},
        "etl": {"output": str(data_dir)}, "model": TINY_MODEL,
        "train": {"epochs": 3, "batch_size": 16, "learning_rate": 0.003, "shuffle_buffer": 64,
                  "progress_every_steps": 10},
        "tracking": {"enabled": True}, "checkpoint": {"resume": "never"},
    }, base_dir=str(tmp_path))
    path = tmp_path / "screen.yaml"
    path.write_text(cfg.to_yaml())
    return path


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("terminal")
    make_text_dataset(str(tmp / "data"), TextSpec(layout=Layout(n_per_split={"train": 480, "validation": 61,
                                                                               "test": 67}, shards_per_split=2),
                                                 class_rate=0.35, seed=11))
    return _job(tmp, tmp / "data")


@pytest.mark.multiprocess
def test_training_on_a_terminal_shows_a_bar_clean_lines_and_a_summary(job: Path, tmp_path: Path) -> None:
    # The options after the config and an override after the options, as the issue typed it.
    # Each run its own checkpoint folder: with checkpoint.resume=never a folder holding checkpoints is refused.
    code, screen = on_screen([sys.executable, "-m", "hvdtrain.cli", "train", str(job), "--np", "2", "train.epochs=2",
                              f"checkpoint.dir={tmp_path / 'ckpt'}"], tmp_path)
    text = "\n".join(screen)
    assert code == 0, text[-4000:]
    assert "<stderr>:" not in text and "<stdout>:" not in text and console.EVENT_MARK.strip() not in text
    assert "absl::InitializeLog" not in text  # TensorFlow's start-up notices stay off a terminal
    bars = [line for line in screen if line.startswith("epoch ") and "%|" in line]
    assert len(bars) == 1 and BAR.match(bars[0]), bars  # drawn in place, not once per update
    assert "[rank 0] INFO epoch 2/2: loss" in text and "[rank 0] INFO epoch 1/2 step" not in text  # bar, not lines
    assert screen.index(bars[0]) < screen.index("training finished (the full result: --json):")
    table = screen[screen.index("training finished (the full result: --json):") + 1:]
    headline = ["test"] * len(tasks.HEADLINE["multiclass"])
    assert [row.split()[0] for row in table] == [*headline, "validation", "epochs", "ranks", "eval", "exported",
                                                 "MLflow"]
    assert re.match(r"^  test accuracy +\d\.\d{4}$", table[0]) and re.match(r"^  test macro F1 +\d\.\d{4}$", table[1])
    assert re.match(r"^  MLflow +run [0-9a-f]{32} at sqlite:///", table[-1])


@pytest.mark.multiprocess
def test_a_failing_rank_ends_the_screen_with_its_one_line_error(job: Path, tmp_path: Path) -> None:
    empty = tmp_path / "nodata"
    empty.mkdir()
    code, screen = on_screen([sys.executable, "-m", "hvdtrain.cli", "train", "--np", "2", str(job),
                              f"etl.output={empty}"], tmp_path)
    assert code == 3, "\n".join(screen[-30:])  # a data error
    assert screen[-1] == (f"hvdtrain: error: no dataset at {empty}: {empty}/manifest.json does not exist. Run the ETL "
                          "first (hvdtrain etl CONFIG), or point etl.output at a published dataset")
    assert not any("Traceback" in line or "RuntimeError" in line for line in screen), "\n".join(screen)


@pytest.mark.multiprocess
def test_off_a_terminal_lines_stay_and_json_is_behind_a_flag(job: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "train", str(job), "--json", "--np", "2",
                           "train.epochs=2", f"checkpoint.dir={tmp_path / 'ckpt'}"],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout[proc.stdout.index("\n{") + 1:])  # after the "$ horovodrun ..." line
    assert result["world_size"] == 2 and result["ranks_agree"] and result["epochs_run"] == 2
    periodic = [line for line in proc.stderr.splitlines() if re.match(r"^\[0\]<stderr>:.*epoch \d/2 step \d+/15:", line)]
    assert len(periodic) >= 2, proc.stderr[-3000:]  # the plain lines YARN and CI logs always had
    assert console.EVENT_MARK.strip() not in proc.stdout + proc.stderr and "%|" not in proc.stderr


@pytest.mark.spark
def test_a_failed_etl_ends_with_its_error_and_sends_spark_to_a_log_file(tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "etl", "configs/demo.yaml", "--master", "local[1]",
                           f"workdir={work}", "source.table=nope.missing"], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)
    log = work / "logs" / "spark-etl.log"
    err = proc.stderr.splitlines()
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert err[-1].startswith("hvdtrain: error: source.table nope.missing does not exist in the Hive metastore")
    assert err[-2] == f"Spark's own log: {log}"
    assert "SparkContext: Running Spark version" in log.read_text()
    spark_said = [line for line in err if re.search(r"^\d\d/\d\d/\d\d [\d:]{8} [A-Z]+ |incubator|log4j", line)]
    assert not spark_said, spark_said  # Spark's own lines went to the file
