import os

import pytest
import yaml

from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "configs", "demo.yaml")


def write(tmp_path, data):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_demo_config_loads_and_resolves_paths_against_its_folder():
    cfg = config.load(DEMO)
    assert cfg.name == "demo"
    assert cfg.workdir == os.path.join(ROOT, "work", "demo")
    assert cfg.etl.output == os.path.join(ROOT, "work", "demo", "data")
    assert cfg.train.output == os.path.join(ROOT, "work", "demo", "runs", "demo")
    assert cfg.source.sample.label_noise == 0.1


def test_overrides_parse_yaml_values_and_nest():
    cfg = config.load(DEMO, ["train.epochs=7", "train.learning_rate=0.01", "etl.compression=gzip",
                             "spark.conf={spark.executor.memory: 2g}"])
    assert cfg.train.epochs == 7 and isinstance(cfg.train.learning_rate, float)
    assert cfg.etl.compression == "gzip"
    assert cfg.spark.conf == {"spark.executor.memory": "2g"}


@pytest.mark.parametrize("override, message", [
    ("train.batch_size=0", "train.batch_size must be > 0 (got 0)"),
    ("train.batch_sise=3", "train.batch_sise is not a known key; allowed: epochs, batch_size"),
    ("etl.compression=zip", "etl.compression must be one of none, gzip (got 'zip')"),
    ("train.allreduce=ring", "train.allreduce must be one of grouped, overlap (got 'ring')"),
    ("train.epochs=two", "train.epochs must be an integer (got 'two')"),
    ("model.num_heads=3", "model.embed_dim must be divisible by model.num_heads (3) (got 64)"),
    ("source.sample.label_noise=1.5", "source.sample.label_noise must be in [0, 1) (got 1.5)"),
    ("etl.splits={train: 0.5, validation: 0.1, test: 0.1}", "etl.splits fractions must sum to 1"),
    ("nonsense", "override must look like section.key=value"),
])
def test_bad_values_name_field_value_and_fix(override, message):
    with pytest.raises(ConfigError) as info:
        config.load(DEMO, [override])
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_key_suggests_the_close_one(tmp_path):
    path = write(tmp_path, {"name": "x", "source": {"table": "db.t"}, "trian": {"epochs": 1}})
    with pytest.raises(ConfigError, match="did you mean 'train'"):
        config.load(path)


def test_missing_file_and_bad_yaml_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        config.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(bad)


def test_source_needs_exactly_one_of_table_and_path(tmp_path):
    with pytest.raises(ConfigError, match="source.table .* must be set, not both"):
        config.load(write(tmp_path, {"source": {"table": "a.b", "path": "/x", "format": "csv"}}))
    with pytest.raises(ConfigError, match="source.format must be set"):
        config.load(write(tmp_path, {"source": {"path": "/x"}}))


def test_uris_are_kept_and_yaml_round_trips(tmp_path):
    path = write(tmp_path, {"name": "j", "source": {"table": "db.t"},
                            "etl": {"output": "hdfs://nn:8020/data/{name}"}})
    cfg = config.load(path)
    assert cfg.etl.output == "hdfs://nn:8020/data/j"
    again = config.from_dict(yaml.safe_load(cfg.to_yaml()), base_dir=str(tmp_path))
    assert again == cfg
    assert cfg.flat()["train.batch_size"] == cfg.train.batch_size


def test_config_import_does_not_pull_heavy_dependencies():
    import subprocess
    import sys

    code = ("import sys, hvdtrain.core.config, hvdtrain.data.manifest, hvdtrain.cli; "
            "bad = [m for m in ('tensorflow', 'pyspark', 'horovod', 'mlflow', 'etl', 'yarn') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
