"""``hvdtrain check-script``: the Keras 2 uses in a Horovod/Keras script that break on Keras 3.

The script is read as a syntax tree and never run (nor is TensorFlow imported). Each
finding names the line, what was found and the exact replacement. The tables come from
the project's Horovod work (patch 0002, the Keras 3 ports of Horovod's tests, Horovod's own
TF2 examples) and were checked against TensorFlow 2.21 with Keras 3.15: ``tf.keras`` (Keras
3's ``keras._tf_keras`` namespace) and plain ``keras`` differ in which function aliases
they keep, so names are resolved through the script's imports to the namespace they use.

Exit codes of the command: 0 no findings, 1 findings, 2 the script cannot be read or parsed.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from typing import IO, Iterator, Optional

from hvdtrain.core.errors import UsageError

TF_KERAS, KERAS = "tf.keras", "keras"  # the two namespaces a script's `keras` can resolve to
# (prefix of a qualified name, namespace, what the prefix stands for below the namespace)
_NS_PREFIXES = (("tensorflow.keras.", TF_KERAS, ""), ("tensorflow.python.keras.", TF_KERAS, ""), ("keras.", KERAS, ""),
                *((f"tensorflow.{m}.", TF_KERAS, f"{m}.") for m in ("optimizers", "losses", "metrics")))

# Attributes Keras 3 does not have, by (namespace or "*", path below it) -> replacement.
_LONG_TO_SHORT = {"mean_squared_error": "mse", "mean_absolute_error": "mae",
                  "mean_absolute_percentage_error": "mape", "mean_squared_logarithmic_error": "msle",
                  "kl_divergence": "kld", "log_cosh": "logcosh"}
_SHORT_TO_LONG = {"mse": "mean_squared_error", "MSE": "mean_squared_error", "mae": "mean_absolute_error",
                  "MAE": "mean_absolute_error", "mape": "mean_absolute_percentage_error",
                  "MAPE": "mean_absolute_percentage_error", "msle": "mean_squared_logarithmic_error",
                  "MSLE": "mean_squared_logarithmic_error", "kld": "kl_divergence", "KLD": "kl_divergence",
                  "kullback_leibler_divergence": "kl_divergence", "logcosh": "log_cosh"}
REMOVED: dict[tuple[str, str], str] = {
    ("*", "optimizers.legacy"): "{base}.optimizers.<Name>(learning_rate=...) (Keras 3 has no legacy optimizers; "
                                "they need the tf_keras package and TF_USE_LEGACY_KERAS=1)",
    ("*", "layers.experimental"): "{base}.layers.<Name> (the experimental preprocessing layers are in layers)",
    ("*", "layers.CuDNNLSTM"): "{base}.layers.LSTM (it uses cuDNN by itself where it can)",
    ("*", "layers.CuDNNGRU"): "{base}.layers.GRU (it uses cuDNN by itself where it can)",
    ("*", "utils.multi_gpu_model"): "Horovod's one process per GPU (hvd.local_rank() pins the GPU)",
    ("*", "backend.get_session"): "nothing: Keras 3 runs eagerly (drop the session)",
    (KERAS, "layers.ThresholdedReLU"): "{base}.layers.ReLU(threshold=THETA)",
    (KERAS, "backend.get_value"): "x.numpy() (or keras.ops.convert_to_numpy(x))",
    (KERAS, "backend.set_value"): "x.assign(value)",
    (KERAS, "backend.constant"): "keras.ops.convert_to_tensor(value)",
    **{(TF_KERAS, f"{m}.{n}"): f"{{base}}.{m}.{s} (the same function; tf.keras in Keras 3 keeps only the short name)"
       for m in ("losses", "metrics") for n, s in _LONG_TO_SHORT.items()},
    **{(KERAS, f"{m}.{n}"): f"{{base}}.{m}.{s} (the same function; Keras 3 dropped the alias)"
       for m in ("losses", "metrics") for n, s in _SHORT_TO_LONG.items()},
}
# Keyword arguments Keras 3 rejects or ignores: (path pattern below the namespace, keyword) -> replacement.
KEYWORDS: list[tuple[re.Pattern, str, str]] = [
    (re.compile(r"optimizers\.(legacy\.)?[A-Z]\w*"), "lr", "learning_rate="),
    (re.compile(r"optimizers\.(legacy\.)?[A-Z]\w*"), "decay",
     "learning_rate={base}.optimizers.schedules.InverseTimeDecay(LR, decay_steps=1, decay_rate=DECAY) "
     "(Keras 3 ignores decay=, so the rate would not decay)"),
    (re.compile(r"layers\.(\w+\.)*BatchNormalization"), "fused", "no fused= (Keras 3 has no such argument)"),
    (re.compile(r"layers\.Embedding"), "input_length", "no input_length= (Keras 3 ignores it; give the "
                                                       "shape to keras.Input)"),
    (re.compile(r"layers\.(LSTM|GRU|SimpleRNN|RNN)"), "time_major",
     "no time_major= (Keras 3 is batch-major only: transpose the input to (batch, time, ...))"),
    (re.compile(r"callbacks\.ModelCheckpoint"), "period", "save_freq=STEPS_PER_EPOCH * PERIOD"),
    (re.compile(r"callbacks\.TensorBoard"), "write_grads", "no write_grads= (removed in Keras 3)"),
]
RENAMED_METHODS = {"fit_generator": "fit", "evaluate_generator": "evaluate", "predict_generator": "predict"}
# Keras 2 optimizer members Keras 3 optimizers lack -> replacement (on a receiver known to be an optimizer).
OPTIMIZER_MEMBERS = {
    "lr": "{recv}.learning_rate",
    "get_gradients": "tf.GradientTape: grads = tape.gradient(loss, variables)",
    "get_updates": "{recv}.apply(grads, variables)",
    "compute_gradients": "tf.GradientTape, then {recv}.apply_gradients(zip(grads, variables))",
    "get_weights": "[v.numpy() for v in {recv}.variables]",
    "set_weights": "for v, w in zip({recv}.variables, weights): v.assign(w)",
    "weights": "{recv}.variables",
}
HOROVOD_KERAS_OPTIMIZERS = ("horovod.tensorflow.keras.DistributedOptimizer", "horovod.keras.DistributedOptimizer")


@dataclass(frozen=True)
class Finding:
    """One Keras 2 use: where, what, and what to write instead."""

    line: int
    col: int
    code: str
    found: str
    fix: str

    def format(self, path: str) -> str:
        return f"{path}:{self.line}:{self.col + 1}: {self.code} {self.found} -> {self.fix}"


def namespace(qualified: Optional[str]) -> Optional[tuple[str, str]]:
    """(tf.keras | keras, path below it) for a fully qualified Keras name, else None (pure)."""
    for prefix, ns, below in _NS_PREFIXES:
        if qualified and qualified.startswith(prefix):
            return ns, below + qualified[len(prefix):]
    return None


class _Checker(ast.NodeVisitor):
    """Collects findings over one module; names resolve through its imports and simple aliases."""

    def __init__(self, tree: ast.Module):
        self.aliases: dict[str, str] = {}
        self.optimizer_names: set[str] = set()
        self.defines_variables = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "variables"
                                     for n in ast.walk(tree))
        self.findings: list[Finding] = []
        self._collect_names(tree)

    # -- names -------------------------------------------------------------------------------

    def _collect_names(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):  # `keras = tf.keras`, `opt = tf.keras.optimizers.Adam(...)`
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name, value = node.targets[0].id, node.value
                qualified = self.qualified(value) if isinstance(value, (ast.Name, ast.Attribute)) else None
                if qualified and namespace(qualified):
                    self.aliases[name] = qualified
                elif isinstance(value, ast.Call) and self._is_optimizer_call(value):
                    self.optimizer_names.add(name)

    def qualified(self, node: ast.AST) -> Optional[str]:
        """The dotted name an expression stands for, through the imports (None if not a plain name)."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.qualified(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def _is_optimizer_call(self, call: ast.Call) -> bool:
        qualified = self.qualified(call.func)
        ns = namespace(qualified)
        return bool(ns and re.fullmatch(r"optimizers\.(legacy\.)?[A-Z]\w*", ns[1])
                    or qualified in HOROVOD_KERAS_OPTIMIZERS)

    def _is_optimizer(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in self.optimizer_names
                or isinstance(node, ast.Attribute) and node.attr == "optimizer")

    def _add(self, node: ast.AST, code: str, found: str, fix: str) -> None:
        self.findings.append(Finding(getattr(node, "lineno", 0), getattr(node, "col_offset", 0), code, found, fix))

    # -- visitors ----------------------------------------------------------------------------

    def visit_Attribute(self, node: ast.Attribute) -> None:
        ns = namespace(self.qualified(node))
        if ns:
            fix = REMOVED.get(ns) or REMOVED.get(("*", ns[1]))
            if fix:
                self._add(node, "K3-REMOVED", f"{ast.unparse(node)} (not in {ns[0]} on Keras 3)",
                          fix.format(base=_base(node, ns)))
        if node.attr in OPTIMIZER_MEMBERS and self._is_optimizer(node.value):
            recv = ast.unparse(node.value)
            self._add(node, "K3-OPTIMIZER", f"{recv}.{node.attr} (Keras 3 optimizers have no {node.attr})",
                      OPTIMIZER_MEMBERS[node.attr].format(recv=recv))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self._check_keywords(node)
        func = node.func
        if isinstance(func, ast.Attribute):
            recv = ast.unparse(func.value)
            if func.attr == "variables" and not node.args and not node.keywords and not self.defines_variables:
                self._add(node, "K3-VARIABLES", f"{recv}.variables() (a property in Keras 3)", f"{recv}.variables")
            if func.attr in RENAMED_METHODS:
                self._add(node, "K3-REMOVED", f"{recv}.{func.attr}(...) (not in Keras 3)",
                          f"{recv}.{RENAMED_METHODS[func.attr]}(...)")
        ns = namespace(self.qualified(func))
        if ns and ns[1] == "optimizers.Optimizer" and not node.args and not _has_keyword(node, "learning_rate"):
            self._add(node, "K3-NO-LR", f"{ast.unparse(func)}(...) without learning_rate",
                      "pass learning_rate=... (Keras 3's Optimizer requires it)")
        self.generic_visit(node)

    def _check_keywords(self, node: ast.Call) -> None:
        for kw in node.keywords:
            if kw.arg == "experimental_run_tf_function":
                self._add(kw.value, "K3-KWARG", "experimental_run_tf_function= (Keras 3's compile() rejects it)",
                          "remove the argument")
        ns = namespace(self.qualified(node.func))
        if not ns:
            return
        base = _base(node.func, ns)
        for pattern, keyword, fix in KEYWORDS:
            if pattern.fullmatch(ns[1]) and _has_keyword(node, keyword):
                kw = next(k for k in node.keywords if k.arg == keyword)
                self._add(kw.value, "K3-KWARG", f"{ast.unparse(node.func)}({keyword}=...)", fix.format(base=base))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if any(self._is_keras_optimizer_base(b) for b in node.bases):
            methods = {f.name: f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
            self._check_optimizer_init(node.name, methods.get("__init__"))
            update = methods.get("update_step")
            if update is not None and len(update.args.args) == 3:
                a = [x.arg for x in update.args.args]
                self._add(update, "K3-OPTIMIZER", f"def update_step({', '.join(a)}) (Keras 2 signature)",
                          f"def update_step({', '.join(a)}, learning_rate) (Keras 3 passes the learning rate)")
            elif update is None and "_resource_apply_dense" in methods:
                self._add(methods["_resource_apply_dense"], "K3-OPTIMIZER",
                          f"{node.name}._resource_apply_dense (Keras 3 never calls it)",
                          "def update_step(self, gradient, variable, learning_rate)")
        self.generic_visit(node)

    def _is_keras_optimizer_base(self, base: ast.AST) -> bool:
        ns = namespace(self.qualified(base))
        return bool(ns and ns[1].rsplit(".", 1)[-1] in ("Optimizer", "OptimizerV2"))

    def _check_optimizer_init(self, cls: str, init: Optional[ast.FunctionDef | ast.AsyncFunctionDef]) -> None:
        """Keras 3's Optimizer.__init__ requires learning_rate; Keras 2's defaulted it."""
        if init is None:
            return
        for call in ast.walk(init):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__init__"
                    and _is_super(call.func.value) and not call.args and not _has_keyword(call, "learning_rate")):
                self._add(call, "K3-NO-LR", f"{cls}: {ast.unparse(call.func)}(...) without learning_rate",
                          "add a learning_rate=... parameter and pass learning_rate=learning_rate "
                          "(Keras 3's Optimizer requires it)")


def _base(node: ast.AST, ns: tuple[str, str]) -> str:
    """How the script spells the Keras namespace of ``node`` (``tf.keras``, ``keras``, ...)."""
    text = ast.unparse(node)
    return text[:-len(ns[1]) - 1] if text.endswith("." + ns[1]) else ns[0]


def _has_keyword(call: ast.Call, name: str) -> bool:
    return any(k.arg == name for k in call.keywords)


def _is_super(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def check_source(source: str, filename: str = "<script>") -> list[Finding]:
    """Every Keras-2-only use in a script's source, in line order (pure)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as exc:
        raise UsageError(f"{filename}:{exc.lineno}: cannot parse the script ({exc.msg}); check-script reads "
                         "Python 3 source") from exc
    checker = _Checker(tree)
    checker.visit(tree)
    return sorted(set(checker.findings), key=lambda f: (f.line, f.col, f.code))


def script_path(path: str) -> str:
    """``path`` when it is a Python file, else UsageError naming it."""
    if not os.path.isfile(path):
        raise UsageError(f"script {path} does not exist or is not a file; pass the path of your training script "
                         "(e.g. train.py)")
    return path


def check_file(path: str) -> list[Finding]:
    """The findings of a script file; UsageError when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read the script {path}: {exc.strerror}; pass the path of a Python file") from exc
    return check_source(source, path)


def print_findings(path: str, stream: IO[str]) -> list[Finding]:
    """Check a script before it is launched and print what was found (nothing when clean)."""
    findings = check_file(path)
    if findings:
        for line in report(path, findings):
            print(f"hvdtrain: check-script: {line}", file=stream)
        print("hvdtrain: launching it anyway; if it fails, the lines above say what to change", file=stream,
              flush=True)
    return findings


def report(path: str, findings: list[Finding]) -> Iterator[str]:
    """The lines ``check-script`` prints."""
    for finding in findings:
        yield finding.format(path)
    yield (f"{path}: no Keras 2 uses found" if not findings else
           f"{path}: {len(findings)} Keras 2 use(s) that break or change on Keras 3")
