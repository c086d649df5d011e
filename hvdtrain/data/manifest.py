"""The dataset contract between ETL and training: ``manifest.json``.

The ETL writes the manifest last, after every shard is in place, so a dataset
without a manifest does not exist for readers. Shard paths are relative to the
manifest's folder, so a dataset can be copied (local -> HDFS) as a whole.

Pure Python: no TensorFlow, no Spark.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from hvdtrain.core.errors import DataError
from hvdtrain.hadoop import fs

FORMAT_VERSION = 2  # 2: some features are stored packed (FeatureSpec.encoding); written as 1 when none is
READS = (1, 2)  # format versions this hvdtrain reads (1 is 2 without packed features)
MANIFEST_NAME = "manifest.json"
NOT_CONTENT = ("created_at", "versions")  # left out of Manifest.digest: when and with what, not what

# Packed encodings: a fixed-shape integer feature stored as ONE bytes value per
# record, the values laid end to end in this little-endian numpy dtype. Readers
# decode with one whole-batch op, where parsing an int64_list costs a varint
# decode per value (the biggest cost of the input pipeline).
ENCODINGS = {"u8": "<u1", "u16le": "<u2", "i32le": "<i4"}


def packed_encoding(max_value: int) -> str:
    """The narrowest packed encoding that holds ``0..max_value``."""
    for name, limit in (("u8", 0xFF), ("u16le", 0xFFFF), ("i32le", 0x7FFFFFFF)):
        if max_value <= limit:
            return name
    raise ValueError(f"{max_value} does not fit a packed encoding (at most {0x7FFFFFFF})")


@dataclass
class FeatureSpec:
    """One feature of every record: dtype (int64, float32, bytes) and fixed shape, as a reader gets it.

    ``encoding`` is how it is stored: "" for the protobuf list of its dtype
    (int64_list, float_list, bytes_list), or a packed encoding (``ENCODINGS``)
    of an int64 feature, stored as one bytes value.
    """

    dtype: str
    shape: list[int]
    encoding: str = ""

    def describe(self) -> str:
        return f"{self.dtype}{self.shape}" + (f" packed {self.encoding}" if self.encoding else "")


@dataclass
class Shard:
    path: str  # relative to the manifest's folder
    records: int
    bytes: int
    sha256: str
    class_counts: dict[str, int] = field(default_factory=dict)


@dataclass
class Split:
    shards: list[Shard]

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def class_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for shard in self.shards:
            for k, v in shard.class_counts.items():
                out[k] = out.get(k, 0) + v
        return out


@dataclass
class Manifest:
    """Everything a reader needs to use the dataset, and to trust it."""

    features: dict[str, FeatureSpec]
    label_feature: str
    labels: list[str]
    splits: dict[str, Split]
    compression: str = "none"
    vocab: dict[str, Any] = field(default_factory=dict)  # path (relative), size, sha256
    preprocessing: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    etl_config_hash: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    format_version: int = FORMAT_VERSION
    task: str = "multiclass"  # how the labels are encoded (hvdtrain.core.tasks); regression: labels is empty
    # How rows are ordered inside a shard: "hash:<etl.seed>" (a seeded hash of the key, etl/split.py); "" in
    # datasets written before it, whose shards are sorted by key (see :func:`order_warning`).
    row_order: str = ""
    # Where the manifest was read from (not serialized).
    location: Optional[str] = field(default=None, compare=False, repr=False)

    # -- serialization --------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("location")
        if data["task"] == "multiclass":
            del data["task"]  # the layout (and digest) of datasets written before tasks existed
        if not data["row_order"]:
            del data["row_order"]  # the layout (and digest) of datasets sorted by key
        for feature in data["features"].values():
            if not feature["encoding"]:
                del feature["encoding"]  # stored as the protobuf list of its dtype (the format 1 layout)
        if not any(f.encoding for f in self.features.values()):
            data["format_version"] = 1  # nothing packed: readable by hvdtrain versions that read only format 1
        for name, split in self.splits.items():
            data["splits"][name]["records"] = split.records
            data["splits"][name]["bytes"] = split.bytes
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], location: Optional[str] = None) -> "Manifest":
        where = location or "manifest"
        try:
            if data.get("format_version") not in READS:
                raise DataError(f"{where}: format_version {data.get('format_version')!r} is not supported "
                                f"(this hvdtrain reads {', '.join(map(str, READS))}); rerun the ETL with this "
                                "version, or use the hvdtrain version that wrote it")
            splits = {
                name: Split([Shard(**{k: v for k, v in s.items()}) for s in body["shards"]])
                for name, body in data["splits"].items()
            }
            for name, split in splits.items():
                for i, shard in enumerate(split.shards):
                    check_relative(shard.path, f"{where}: splits.{name}.shards[{i}].path")
            for key in ("path", "tokenizer"):
                if data.get("vocab", {}).get(key) is not None:
                    check_relative(data["vocab"][key], f"{where}: vocab.{key}")
            return cls(
                features={k: _feature(k, v, where) for k, v in data["features"].items()},
                label_feature=data["label_feature"],
                labels=list(data["labels"]),
                splits=splits,
                compression=data.get("compression", "none"),
                vocab=data.get("vocab", {}),
                preprocessing=data.get("preprocessing", {}),
                source=data.get("source", {}),
                etl_config_hash=data.get("etl_config_hash", ""),
                versions=data.get("versions", {}),
                created_at=data.get("created_at", ""),
                format_version=data["format_version"],
                task=data.get("task", "multiclass"),
                row_order=data.get("row_order", ""),
                location=location,
            )
        except (KeyError, TypeError) as exc:
            raise DataError(f"{where}: malformed manifest ({exc!r}); rerun the ETL to rewrite it") from None

    # -- derived ------------------------------------------------------------
    @property
    def root(self) -> str:
        """The dataset folder (the manifest's folder)."""
        if not self.location:
            raise DataError("this manifest was not read from a location; its shard paths cannot be resolved")
        return self.location.rsplit("/", 1)[0] if "/" in self.location else "."

    def shard_uri(self, shard: Shard) -> str:
        return fs.join(self.root, shard.path)

    def split(self, name: str) -> Split:
        if name not in self.splits:
            raise DataError(f"{self.location}: has no split {name!r}; it has {', '.join(self.splits)}")
        return self.splits[name]

    def digest(self) -> str:
        """A hash of the dataset's content (logged with every training run, kept in every checkpoint).

        Not content, so not hashed: when the ETL ran and with which versions (``NOT_CONTENT``), and the folder
        its files sit in (an overwrite's ``v-<run>/``): an ETL rerun of the same data keeps its digest, and its
        checkpoints stay resumable. File names, checksums, counts and everything fitted are hashed.
        """
        data = self.to_dict()
        for key in NOT_CONTENT:
            data.pop(key, None)
        for split in data["splits"].values():
            for shard in split["shards"]:
                shard["path"] = shard["path"].rsplit("/", 1)[-1]
        data["vocab"] = {k: (v.rsplit("/", 1)[-1] if k in ("path", "tokenizer") and isinstance(v, str) else v)
                         for k, v in data["vocab"].items()}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def legacy_digest(self) -> str:
        """The digest as hvdtrain wrote it before :meth:`digest` left out what is not content (the whole
        manifest, ``created_at`` included): what older checkpoints and exported models carry."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def matches_digest(self, digest: Optional[str]) -> bool:
        """Whether a recorded digest (either form) names this manifest's dataset."""
        return digest is not None and digest in (self.digest(), self.legacy_digest())

    @property
    def num_classes(self) -> int:
        return len(self.labels)


def order_warning(manifest: Manifest) -> Optional[str]:
    """The warning training gives on a dataset whose shards are sorted by key (None for seeded-hash order).

    Training shuffles within windows of a rank's records; on a table whose key follows time or the label, key
    order makes those windows (and so the batches) biased samples, and the model trains worse.
    """
    if manifest.row_order:
        return None
    return (f"{manifest.location or 'the dataset'} was written by an hvdtrain ETL that sorted each shard's rows by "
            "key: on a table whose key follows time or the label, batches are biased samples and the model trains "
            "worse than it should; rerun the ETL with this hvdtrain version (rows in a seeded-hash order)")


def check_relative(path: Any, entry: str) -> None:
    """A path a manifest names must stay inside the dataset folder: relative, no scheme, no ``..``."""
    parts = path.replace("\\", "/").split("/") if isinstance(path, str) else []
    if not parts or path.startswith(("/", "~")) or ":" in path or any(p in ("", ".", "..") for p in parts):
        raise DataError(f"{entry} is {path!r}: a manifest names files only inside its dataset folder (a relative "
                        "path without .., a scheme or a leading /); this manifest was not written by hvdtrain's "
                        "ETL or was edited: rerun the ETL")


def text_features(max_length: int, vocab_size: int, packed: bool = True) -> dict[str, FeatureSpec]:
    """``input_ids`` and ``attention_mask`` as the ETL writes them: packed (ids in the narrowest encoding
    that holds the vocabulary, the mask as bytes), or int64 lists when ``packed`` is false."""
    if not packed:
        return {"input_ids": FeatureSpec("int64", [max_length]), "attention_mask": FeatureSpec("int64", [max_length])}
    return {"input_ids": FeatureSpec("int64", [max_length], packed_encoding(max(vocab_size - 1, 0))),
            "attention_mask": FeatureSpec("int64", [max_length], "u8")}


def encodings(features: dict[str, FeatureSpec]) -> dict[str, str]:
    """The packed features and their encodings (what a writer needs to lay records out)."""
    return {name: spec.encoding for name, spec in features.items() if spec.encoding}


def _feature(name: str, body: dict[str, Any], where: str) -> FeatureSpec:
    spec = FeatureSpec(**body)
    if spec.encoding and (spec.encoding not in ENCODINGS or spec.dtype != "int64"):
        raise DataError(f"{where}: feature {name!r} is {spec.dtype} stored as {spec.encoding!r}; this hvdtrain "
                        f"reads packed int64 features as {', '.join(ENCODINGS)}: rerun the ETL with this version")
    return spec


def manifest_uri(dataset: str) -> str:
    """Accept a dataset folder or the manifest file itself."""
    return dataset if dataset.endswith(".json") else fs.join(dataset, MANIFEST_NAME)


NEXT_SUFFIX = ".next"  # manifest.json.next: the complete new manifest, renamed over manifest.json


def read(dataset: str) -> Manifest:
    uri = manifest_uri(dataset)
    data = _published_bytes(uri)
    if data is None:
        raise DataError(f"no dataset at {dataset}: {uri} does not exist. Run the ETL first "
                        "(hvdtrain etl CONFIG), or point etl.output at a published dataset")
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as exc:
        raise DataError(f"{uri}: not valid JSON ({exc}); rerun the ETL") from None
    return Manifest.from_dict(doc, location=uri)


def _published_bytes(uri: str) -> Optional[bytes]:
    """The manifest's bytes; None when there is none.

    Where the filesystem cannot rename over a file (libhdfs), :func:`write` deletes
    ``manifest.json`` just before renaming the complete ``manifest.json.next`` onto it;
    in that moment the ``.next`` file is the published manifest. Looking at
    ``manifest.json``, then ``.next``, then ``manifest.json`` again always finds one
    while a single publish is under way.
    """
    for candidate in (uri, uri + NEXT_SUFFIX, uri):
        try:
            if fs.exists(candidate):
                return fs.read_bytes(candidate)
        except FileNotFoundError:  # renamed away between the two calls
            continue
    return None


def write(manifest: Manifest, dataset: str) -> str:
    """Publish the manifest atomically; call this last, after every file it names is in place.

    The new manifest is written whole to ``manifest.json.next``, then renamed over
    ``manifest.json`` (:func:`hvdtrain.hadoop.fs.replace`: atomic on local disks and
    WebHDFS), so a reader finds the old manifest or the new one, never none.
    """
    uri = manifest_uri(dataset)
    staged = uri + NEXT_SUFFIX
    fs.write_bytes_atomic(staged, manifest.to_json().encode())
    fs.replace(staged, uri)
    return uri
