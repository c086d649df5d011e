"""hvdtrain.model.lean_keras: a training rank imports Keras without matplotlib's pyplot and scikit-learn, and can still
import both itself afterwards."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys
import hvdtrain.training.train  # the rank's entry module: Keras first, through hvdtrain.model.lean_keras
skipped = {m: m in sys.modules for m in ("sklearn", "matplotlib.pyplot")}
import keras
import sklearn.linear_model  # the rank's own code (or a user's model builder) may still use them
import matplotlib.pyplot
print(json.dumps({"loaded_with_keras": skipped, "keras_layers": hasattr(keras.layers, "Dense"),
                  "sklearn": sklearn.__version__ != "", "pyplot": hasattr(matplotlib.pyplot, "figure")}))
"""


@pytest.mark.slow
def test_a_rank_imports_keras_without_pyplot_and_sklearn_yet_can_import_them_later() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"loaded_with_keras": {"sklearn": False, "matplotlib.pyplot": False}, "keras_layers": True,
                   "sklearn": True, "pyplot": True}


def test_with_keras_already_imported_nothing_changes() -> None:
    import keras

    from hvdtrain.model import lean_keras

    assert lean_keras.import_keras() is keras and all(sys.modules.get(m) is not None or m not in sys.modules
                                                      for m in lean_keras.OPTIONAL)
