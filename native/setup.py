"""hvdtrain-native: the compiled loops of hvdtrain's TFRecord writer (hvdtrain_native.c).

A distribution of its own, installed (not editable) beside hvdtrain by scripts/bootstrap.sh, so the packed
environment a YARN job ships carries the built module: the project's code travels as a zip (``--py-files``),
from which Python cannot load a compiled module. The version ends in a digest of the C source, so a changed
source is a new version: pip reinstalls it, and the YARN environment cache (keyed by the installed versions)
packs a new archive.
"""
import hashlib
import os

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = "hvdtrain_native.c"
with open(os.path.join(HERE, SOURCE), "rb") as f:
    DIGEST = hashlib.sha256(f.read()).hexdigest()[:12]

setup(
    name="hvdtrain-native",
    version=f"1.0.0+{DIGEST}",
    description="Compiled varints, record assembly and CRC32C framing for hvdtrain's TFRecord writer.",
    license="Apache-2.0",
    python_requires=">=3.10,<3.13",
    ext_modules=[Extension("hvdtrain_native", [SOURCE], extra_compile_args=["-O3", "-std=c99", "-Wall"])],
)
