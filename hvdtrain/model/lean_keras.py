"""Keras for a training rank, imported without the optional libraries a rank never uses.

``import keras`` also imports matplotlib's pyplot (for ``keras.visualization``) and scikit-learn (for
``keras.wrappers``) whenever they are installed: 0.7 s of the 2.5 s Keras import on the 2-core test host, paid by
every rank, restart and tuning trial. A rank only builds, trains and saves models, so this module imports Keras
with those two hidden (Keras then treats them as absent) and unhides them at once: the rank's own code, and the
user's model builder, can still ``import sklearn`` or ``matplotlib.pyplot``. What a rank loses is only Keras's
plotting helpers and its scikit-learn wrapper classes, which then say the library is missing.

Importing this module does it: import it before anything else that imports Keras (``hvdtrain.training.train`` does,
first). Where Keras is already imported, nothing changes.
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType

OPTIONAL = ("matplotlib.pyplot", "sklearn")  # imported by Keras only if present, used only by helpers a rank skips


def import_keras() -> ModuleType:
    """``keras``, imported with :data:`OPTIONAL` hidden if this is the process's first import of it."""
    if "keras" in sys.modules:
        return sys.modules["keras"]
    hidden = [name for name in OPTIONAL if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # `import name` raises ImportError while set
    try:
        return importlib.import_module("keras")
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


import_keras()
