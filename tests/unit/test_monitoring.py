"""Prometheus metrics, the step-time breakdown and timeline summaries: the pure and single-process parts.

The ``-np 2`` run that scrapes the endpoint and parses every rank's file is
in tests/multiprocess/test_monitoring_mp.py.
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import parser  # a required dependency (setup.py)

from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError, DataError, EnvironmentProblem
from hvdtrain.observe import breakdown, monitoring, timeline
from hvdtrain.observe.events import LoopState, StepInfo

REPO = Path(__file__).resolve().parents[2]
LABELS = {"job": "j", "run_id": "r1", "rank": "1", "host": "h"}


def _samples(text: str) -> dict[str, list]:
    """Sample name -> samples, parsed with prometheus_client's own parser."""
    out: dict[str, list] = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _value(samples: dict[str, list], name: str) -> float:
    (sample,) = samples[name]
    return sample.value


# -- names and labels ----------------------------------------------------------------------------

def test_names_follow_prometheus_conventions() -> None:
    for spec in monitoring.SPECS:
        assert re.fullmatch(r"hvdtrain_[a-z_]+", spec.name), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert not re.search(r"_(ms|milliseconds|mb|kb|minutes)(_|$)", spec.name), spec.name  # base units
    names = {s.name for s in monitoring.SPECS}
    for required in ("hvdtrain_step_duration_seconds", "hvdtrain_samples_total", "hvdtrain_data_wait_seconds_total",
                     "hvdtrain_allreduce_seconds_total", "hvdtrain_checkpoint_save_duration_seconds",
                     "hvdtrain_checkpoint_save_bytes", "hvdtrain_checkpoint_restore_duration_seconds",
                     "hvdtrain_checkpoint_restore_bytes", "hvdtrain_restarts_total", "hvdtrain_skipped_steps_total",
                     "hvdtrain_epoch", "hvdtrain_step", "hvdtrain_learning_rate", "hvdtrain_loss",
                     "hvdtrain_last_progress_timestamp_seconds"):
        assert required in names


def test_every_exposed_sample_carries_the_four_labels() -> None:
    text = monitoring.Metrics("j", "r1", 1, "h").text()
    samples = _samples(text)
    exposed = {n for n in samples}
    for spec in monitoring.SPECS:
        assert spec.name in exposed or f"{spec.name}_count" in exposed, spec.name
    for name, found in samples.items():
        for sample in found:
            assert {k: sample.labels[k] for k in LABELS} == LABELS, name


def test_textfile_path_is_per_rank_and_collectable() -> None:
    assert monitoring.textfile_path("/m", "my job/1", 3) == "/m/hvdtrain_my_job_1_rank3.prom"


# -- the hook -------------------------------------------------------------------------------------------

class Save:
    def __init__(self, step: int, seconds: float, nbytes: int):
        self.step, self.seconds, self.bytes = step, seconds, nbytes


def _state(step: int, epoch_end: bool = False) -> LoopState:
    return LoopState(step, 1, epoch_end, lambda: None, 0.0, [])


def test_the_hook_counts_steps_saves_and_skipped_steps() -> None:
    metrics = monitoring.Metrics("j", "r1", 1, "h")
    counter = {"n": 100}
    saves: dict[str, Save] = {}
    hook = monitoring.MetricsHook(metrics, lambda: 0.25, lambda: saves.get("last"), lambda: counter["n"])
    hook.start_epoch(2)
    for step in (1, 2, 3):
        hook.on_step(StepInfo(2, step, 10 + step, 0.1, 12.0, 8, step_seconds=1.0))
        counter["n"] += 1 if step != 2 else 0  # step 2 was skipped (float16 overflow)
        if step == 2:
            saves["last"] = Save(12, 0.5, 4096)
        hook.after_step(_state(10 + step))
    hook.refresh()
    s = _samples(metrics.text())
    assert _value(s, "hvdtrain_samples_total") == 24
    assert _value(s, "hvdtrain_step_duration_seconds_count") == 3
    assert _value(s, "hvdtrain_step_duration_seconds_sum") == pytest.approx(3 * 1.1)
    assert _value(s, "hvdtrain_data_wait_seconds_total") == pytest.approx(0.3)
    assert _value(s, "hvdtrain_allreduce_seconds_total") == pytest.approx(0.75)
    assert _value(s, "hvdtrain_compute_seconds_total") == pytest.approx(2.25)
    assert _value(s, "hvdtrain_checkpoint_save_duration_seconds_count") == 1  # not counted again at step 13
    assert _value(s, "hvdtrain_checkpoint_save_bytes") == 4096
    assert _value(s, "hvdtrain_skipped_steps_total") == 1
    assert (_value(s, "hvdtrain_epoch"), _value(s, "hvdtrain_step")) == (2, 13)
    assert _value(s, "hvdtrain_loss") == pytest.approx(12.0 / 8)
    assert time.time() - _value(s, "hvdtrain_last_progress_timestamp_seconds") < 60


def test_a_failing_collect_function_gives_nan_not_an_error() -> None:
    metrics = monitoring.Metrics("j", "r1", 0, "h")
    metrics.read_at_collect("hvdtrain_learning_rate", lambda: 1 / 0)
    assert _value(_samples(metrics.text()), "hvdtrain_learning_rate") != _value(
        _samples(metrics.text()), "hvdtrain_learning_rate")  # NaN


# -- the writer and the endpoint --------------------------------------------------------------------------

def test_the_exporter_writes_atomically_and_periodically(tmp_path: Path) -> None:
    metrics = monitoring.Metrics("j", "r1", 1, "h")
    path = str(tmp_path / "m" / "hvdtrain_j_rank1.prom")
    with monitoring.Exporter(metrics, path, interval=0.05) as exporter:
        metrics["hvdtrain_samples_total"].inc(5)
        deadline = time.time() + 10
        while exporter.writes < 3 and time.time() < deadline:
            time.sleep(0.02)
        assert exporter.writes >= 3
        assert _value(_samples(Path(path).read_text()), "hvdtrain_training_active") == 1
    s = _samples(Path(path).read_text())
    assert _value(s, "hvdtrain_samples_total") == 5 and _value(s, "hvdtrain_training_active") == 0
    assert os.listdir(tmp_path / "m") == ["hvdtrain_j_rank1.prom"]  # no temp file left behind


def test_the_metrics_files_are_readable_by_node_exporter_under_the_ranks_private_umask(tmp_path: Path) -> None:
    """#54: ranks create files with umask 077 (their outputs are the user's only); node_exporter's textfile
    collector runs as another user, and a 0600 .prom file made the metrics vanish without a word."""
    old = os.umask(0o077)
    try:
        path = tmp_path / "textfiles" / "hvdtrain_j_rank0.prom"
        monitoring.Exporter(monitoring.Metrics("j", "r", 0, "h"), str(path), 60).start().stop()
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644 and path.parent.stat().st_mode & 0o777 == 0o755


def test_a_write_failure_warns_once_and_training_goes_on(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    exporter = monitoring.Exporter(monitoring.Metrics("j", "r", 0, "h"), str(blocker / "x.prom"), 60)
    exporter.write()
    exporter.write()
    assert exporter.writes == 0 and caplog.text.count("writing metrics to") == 1


def test_a_busy_port_is_one_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        problem = monitoring.check_port_free(port)
        assert problem and f"monitoring.port={port} is not free" in problem and "choose a free port" in problem
        with pytest.raises(EnvironmentProblem, match=f"monitoring.port={port}"):
            monitoring.Exporter(monitoring.Metrics("j", "r", 0, "h"), "/tmp/unused.prom", 60, port=port).start()
    assert monitoring.check_port_free(port) is None


# -- alert rules --------------------------------------------------------------------------------------------

def test_alert_rules_use_only_exposed_metrics() -> None:
    rules = yaml.safe_load((REPO / "configs" / "prometheus" / "hvdtrain-alerts.yml").read_text())
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert set(alerts) == {"HvdtrainInputBound", "HvdtrainNoProgress", "HvdtrainThroughputBelowRunMedian"}
    exposed = set(_samples(monitoring.Metrics("j", "r", 0, "h").text()))
    for name, expr in alerts.items():
        used = set(re.findall(r"hvdtrain_[a-z_]+", expr))
        assert used and used <= exposed, (name, used - exposed)
    assert "0.10" in alerts["HvdtrainInputBound"] and "0.8 *" in alerts["HvdtrainThroughputBelowRunMedian"]


# -- config ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ("monitoring.interval_seconds=0", "monitoring.interval_seconds must be > 0"),
    ("monitoring.port=70000", "monitoring.port must be a TCP port"),
    ("monitoring.textfile_dir=hdfs://nn/m", "monitoring.textfile_dir must be a local folder"),
    ("train.timeline={start_step: 0}", "train.timeline.start_step must be >= 1"),
    ("train.timeline={steps: 0}", "train.timeline.steps must be >= 1"),
])
def test_bad_monitoring_values_name_the_field(tmp_path: Path, override: str, message: str) -> None:
    (tmp_path / "j.yaml").write_text("name: j\nsource: {table: db.t}\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        config.load(tmp_path / "j.yaml", [override])


def test_monitoring_defaults_resolve(tmp_path: Path) -> None:
    (tmp_path / "j.yaml").write_text("name: j\nsource: {table: db.t}\ntrain: {timeline: {start_step: 5}}\n")
    cfg = config.load(tmp_path / "j.yaml")
    assert cfg.monitoring.textfile_dir == str(tmp_path / "work" / "j" / "metrics")
    assert cfg.monitoring.job == "j" and cfg.monitoring.enabled and cfg.monitoring.port is None
    assert (cfg.train.timeline.start_step, cfg.train.timeline.steps) == (5, 10)


# -- step-time breakdown -------------------------------------------------------------------------------

def _times(rank: int, wall: float, data: float, compute: float, allreduce, ckpt: float) -> breakdown.RankTimes:
    return breakdown.RankTimes(rank, f"host{rank}", wall, data, compute, allreduce, ckpt)


def test_fractions_are_shares_of_wall_time_summed_over_ranks() -> None:
    times = [_times(0, 10, 1, 5, 3, 0.5), _times(1, 10, 1, 7, 1, 0.5)]
    f = breakdown.fractions(times)
    assert f == pytest.approx({"data_wait": 0.1, "compute": 0.6, "allreduce": 0.2, "checkpoint": 0.05,
                               "other": 0.05})
    unmeasured = breakdown.fractions([_times(0, 10, 1, 8, None, 0)])
    assert unmeasured["allreduce"] is None and unmeasured["compute"] == pytest.approx(0.8)


def test_the_straggler_is_the_rank_that_waited_least_in_the_allreduce() -> None:
    # rank 2 is slow: the others wait for it inside the all-reduce, so their busy time is shorter.
    times = [_times(0, 10, 1, 5, 4, 0), _times(1, 10, 1, 5, 4, 0), _times(2, 10, 1, 8.5, 0.5, 0)]
    slow = breakdown.straggler(times)
    assert (slow.rank, slow.host) == (2, "host2")
    assert slow.lag == pytest.approx(9.5 - 6) and slow.lag_fraction == pytest.approx(3.5 / 6)
    line = breakdown.describe(3, times)
    assert "epoch 3" in line and "slowest rank 2 (host2)" in line and "3.50s (58%) behind the median" in line
    m = breakdown.metrics(times)
    assert m["slowest_rank"] == 2 and m["time_allreduce_fraction"] == pytest.approx(8.5 / 30)


class Rank:
    rank, hostname, is_chief = 0, "h", True


def test_the_breakdown_hook_measures_an_epoch_and_reports_it() -> None:
    clock = iter([100.0, 110.0]).__next__
    ckpt = {"s": 2.0}
    logged = []
    hook = breakdown.StepTimeBreakdown(Rank(), lambda: 0.5, lambda: ckpt["s"], lambda m, step: logged.append((m, step)),
                                       clock=clock)
    hook.start_epoch(1)
    for step in (1, 2):
        hook.on_step(StepInfo(1, step, step, 0.25, 0.0, 4, step_seconds=2.0))
    ckpt["s"] = 3.0
    hook.after_step(_state(1))  # not an epoch end: nothing reported
    assert logged == []
    hook.after_step(_state(2, epoch_end=True))
    (t,) = hook.history[0]
    assert (t.wall, t.data_wait, t.compute, t.allreduce, t.checkpoint) == (10.0, 0.5, 3.0, 1.0, 1.0)
    assert logged[0][1] == 1 and logged[0][0]["time_compute_fraction"] == pytest.approx(0.3)


# -- timeline summaries -----------------------------------------------------------------------------------

def _event(ph: str, ts: int, pid: int, name: str = "") -> dict:
    return {"ph": ph, "ts": ts, "pid": pid, **({"name": name} if name else {})}


FUSED = [  # two tensors fused into one Gloo all-reduce; times in microseconds
    {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad_a"}},
    _event("B", 0, 1, "NEGOTIATE_ALLREDUCE"), _event("B", 10, 2, "NEGOTIATE_ALLREDUCE"),
    {"ph": "X", "name": "1", "ts": 5, "pid": 1, "dur": 0},
    _event("E", 100, 1), _event("E", 100, 2),
    _event("B", 100, 1, "ALLREDUCE"), _event("B", 100, 2, "ALLREDUCE"),
    _event("B", 100, 1, "MEMCPY_IN_FUSION_BUFFER"), _event("B", 100, 2, "MEMCPY_IN_FUSION_BUFFER"),
    _event("E", 120, 1), _event("E", 120, 2),
    _event("B", 120, 1, "GLOO_ALLREDUCE"), _event("B", 120, 2, "GLOO_ALLREDUCE"),
    _event("E", 420, 1), _event("E", 420, 2), _event("E", 450, 1), _event("E", 450, 2),
    {"ph": "X", "name": "WAIT_FOR_DATA", "ts": 500, "pid": 3, "dur": 40},
]


def test_a_summary_counts_fused_phases_once_in_wall_time() -> None:
    phases, activities = timeline.summarize_events(FUSED)
    by = {p.phase: p for p in phases}
    assert by["negotiation"].wall_seconds == pytest.approx(100e-6)
    assert by["negotiation"].summed_seconds == pytest.approx(190e-6)
    assert by["memcpy into fusion buffer"].wall_seconds == pytest.approx(20e-6)
    assert by["all-reduce"].wall_seconds == pytest.approx(300e-6) and by["all-reduce"].count == 2
    assert by["wait for data"].wall_seconds == pytest.approx(40e-6)
    assert activities["ALLREDUCE"] == pytest.approx(700e-6) and "1" not in activities


def test_union_length_counts_overlaps_once() -> None:
    assert timeline.union_length([(50, 150), (0, 100), (200, 210), (205, 207)]) == 160


def test_an_unclosed_timeline_still_reads(tmp_path: Path) -> None:
    text = "[\n" + ",\n".join(json.dumps(e) for e in FUSED) + ",\n"  # as Horovod leaves a file it is writing
    path = tmp_path / "t.json"
    path.write_text(text)
    out = timeline.summarize(str(path))
    assert re.search(r"all-reduce\s+0\.0003\s+0\.0006\s+2", out), out


def test_a_bad_timeline_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read timeline"):
        timeline.summarize(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match="not a Chrome-trace JSON timeline"):
        timeline.summarize(str(tmp_path / "bad.json"))
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(DataError, match="no Horovod activities"):
        timeline.summarize(str(tmp_path / "empty.json"))


def test_a_missing_prometheus_client_is_named_with_the_fix(monkeypatch) -> None:
    assert monitoring.available() is None
    monkeypatch.setitem(__import__("sys").modules, "prometheus_client", None)  # as if not installed
    problem = monitoring.available()
    assert problem and "pip install 'prometheus_client" in problem and "monitoring.enabled=false" in problem


def _tensor_trace(pid: int, name: str, steps: list[tuple[float, float]]) -> list[dict]:
    """One tensor's events: per step a negotiation from its queue entry, then a transfer from ``xfer``."""
    events = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}]
    for queued, xfer in steps:
        events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": queued, "pid": pid},
                   {"ph": "E", "ts": xfer, "pid": pid},
                   {"ph": "B", "name": "ALLREDUCE", "ts": xfer, "pid": pid},
                   {"ph": "E", "ts": xfer + 50, "pid": pid}]
    return events


def test_step_queues_tell_overlapped_from_grouped_all_reduces() -> None:
    # step 1: top layer queued at 0, bottom at 9000, the top's transfer began at 4000 (overlap);
    # step 2: all queued together at 20000, transfers after (grouped)
    events = (_tensor_trace(1, "top", [(0, 4000), (20000, 20100)])
              + _tensor_trace(2, "bottom", [(9000, 9100), (20010, 20100)]))
    first, second = timeline.step_queues(events)
    assert (first.first_tensor, first.last_tensor, first.spread_us, first.lead_us) == ("top", "bottom", 9000, 5000)
    assert second.spread_us == 10 and second.lead_us == -90
    assert timeline.step_queues([]) == []
