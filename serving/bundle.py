"""The exported bundle: a self-describing folder that serving reads and nothing else.

A bundle is ``model.onnx`` (fp32), optionally ``model.int8.onnx`` (ONNX Runtime int8) and
``model.int8.xml`` + ``model.int8.bin`` (OpenVINO int8, NNCF post-training quantisation), the
``tokenizer.json`` the model was trained with, and ``suffice.json``: the manifest below. The
manifest names the labels, the window and long-context strategy, the calibration (a temperature,
or Platt scaling's ``a``/``b``: :mod:`suffice.serving.calibration`), the decision thresholds, the
base model, the MLflow run/version, and the sha256 of every other file, so a service can refuse a
tampered or truncated bundle before it scores anything.

The manifest protects itself too: :func:`write_manifest` (the one writer, used by export and by
registration) records in ``field_digests`` the sha256 of every other field's canonical JSON, and
:func:`read_manifest` refuses a manifest whose fields no longer match, naming the field (a
threshold edited from 0.8 to 0.3 would otherwise turn ``partial`` rows ``sufficient`` silently).
This check is cheap and runs whatever ``verify_checksums`` says. Bundles written before digests
existed load with a warning that names the fix (re-export with ``suffice export``).

>>> m = read_manifest("bundles/sufficiency-v3")  # doctest: +SKIP
>>> m.task, m.id2label[1], m.thresholds["sufficient"]  # doctest: +SKIP
('sufficiency', 'sufficient', 0.8)
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from suffice.serving.calibration import Calibration
from suffice.serving.packing import STRATEGIES
from suffice.serving.probe import ParityProbe, ProbeError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MANIFEST_NAME = "suffice.json"
MODEL_FP32 = "model.onnx"
MODEL_INT8 = "model.int8.onnx"
MODEL_OV_INT8 = "model.int8.xml"  # OpenVINO IR; its weights are the sibling ``model.int8.bin``
TOKENIZER = "tokenizer.json"
# The manifest's metrics key holding how decisive the model is at "sufficient" on validation
# (coverage, recall and precision at the threshold, the score reaching 90% precision).
VALIDATION_LEVELS = "validation_levels"

# ------------------------------------------------------------------------------------------
# The task vocabulary: the one place that names the tasks, their labels and default thresholds
# (training imports it; the bundle carries it to serving).
# ------------------------------------------------------------------------------------------
# The three sufficiency levels, most to least sufficient.
LEVELS = ("sufficient", "partial", "insufficient")
SUFFICIENT, PARTIAL, INSUFFICIENT = LEVELS
# The retrieval gate's two decisions, and its one threshold's name.
RETRIEVE, SKIP = "RETRIEVE", "SKIP"
SKIP_THRESHOLD = "skip"


@dataclass(frozen=True)
class TaskSpec:
    """One task of the bundle contract.

    name: the manifest's ``task``. label_schemes: scheme -> label names in logit-column order.
    positive_label: the label whose calibrated probability is the score. default_thresholds: the
    decision thresholds a bundle falls back to (sufficiency: calibrated P(sufficient) >= 0.8 answers,
    >= 0.5 caveats; the gate: SKIP at P(SKIP) >= 0.5).

    >>> TASK_SPECS["sufficiency"].id2label("three_level")
    {0: 'insufficient', 1: 'partial', 2: 'sufficient'}
    >>> TASK_SPECS["retrieval_gate"].positive_index("binary")
    1
    """

    name: str
    label_schemes: Mapping[str, tuple[str, ...]]
    positive_label: str
    default_thresholds: Mapping[str, float]

    def labels(self, label_scheme: str = "binary") -> tuple[str, ...]:
        """The label names of ``label_scheme`` in logit-column order; names the schemes this task has."""
        if label_scheme not in self.label_schemes:
            raise ValueError(f"task {self.name!r} has no label_scheme {label_scheme!r}: choose one of {sorted(self.label_schemes)}")
        return self.label_schemes[label_scheme]

    def id2label(self, label_scheme: str = "binary") -> dict[int, str]:
        return dict(enumerate(self.labels(label_scheme)))

    def positive_index(self, label_scheme: str = "binary") -> int:
        return self.labels(label_scheme).index(self.positive_label)


SUFFICIENCY = TaskSpec("sufficiency", MappingProxyType({"binary": (INSUFFICIENT, SUFFICIENT), "three_level": (INSUFFICIENT, PARTIAL, SUFFICIENT)}),
                       SUFFICIENT, MappingProxyType({SUFFICIENT: 0.8, PARTIAL: 0.5}))
RETRIEVAL_GATE = TaskSpec("retrieval_gate", MappingProxyType({"binary": (RETRIEVE, SKIP)}), SKIP, MappingProxyType({SKIP_THRESHOLD: 0.5}))
TASK_SPECS: Mapping[str, TaskSpec] = MappingProxyType({t.name: t for t in (SUFFICIENCY, RETRIEVAL_GATE)})
TASKS = tuple(TASK_SPECS)
DEFAULT_THRESHOLDS: Mapping[str, Mapping[str, float]] = MappingProxyType({t.name: t.default_thresholds for t in TASK_SPECS.values()})


class BundleError(ValueError):
    """A bundle cannot be used; the message names the folder, what is wrong and the fix."""


class BundleNotFoundError(BundleError, FileNotFoundError):
    """The bundle folder, its manifest or a file the manifest lists does not exist."""


class ManifestError(BundleError):
    """``suffice.json`` is not valid JSON or breaks the manifest schema."""


class ChecksumError(BundleError):
    """A file's sha256 differs from the manifest: the bundle was modified or truncated."""


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks.

    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "x"; _ = p.write_bytes(b"abc")
    >>> sha256_file(p)[:12]
    'ba7816bf8f01'
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class VariantCheck:
    """Export's verdict on an int8 variant checked on its own (the OpenVINO int8 model, and that model
    run with OpenVINO's bf16 hint): ``passed``, ``refused`` (why not, when it did not pass), the rule's
    ``numbers`` (items, largest logit difference, agreement, score change, the quantisation recipe),
    and ``bf16_hint``, the verdict on the bf16-hint run (None: not checked, or an older bundle).

    >>> VariantCheck.from_dict({"passed": True, "items": 40, "bf16_hint": {"passed": False, "refused": "no bf16"}}).bf16_hint.refused
    'no bf16'
    """

    passed: bool = False
    refused: str | None = None
    numbers: Mapping[str, Any] = field(default_factory=dict)
    bf16_hint: "VariantCheck | None" = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "parity") -> "VariantCheck | None":
        if data is None:
            return None
        if not isinstance(data, Mapping):
            raise ManifestError(f"{where} must be a JSON object or null, got {data!r}: re-export the bundle with `suffice export`")
        rest = {k: v for k, v in data.items() if k not in ("passed", "refused", "bf16_hint")}
        return cls(passed=data.get("passed") is True, refused=data.get("refused"), numbers=rest,
                   bf16_hint=cls.from_dict(data.get("bf16_hint"), f"{where}.bf16_hint"))

    def to_dict(self) -> dict[str, Any]:
        """The manifest's layout: the numbers, ``passed``, then ``refused`` / ``bf16_hint`` where there are any."""
        out: dict[str, Any] = {**self.numbers, "passed": self.passed}
        if self.refused is not None:
            out["refused"] = self.refused
        if self.bf16_hint is not None:
            out["bf16_hint"] = self.bf16_hint.to_dict()
        return out


@dataclass(frozen=True)
class ParityReport:
    """What export's parity step measured (the manifest's ``parity``; see :mod:`suffice.training.export.parity`).

    fp32_vs_torch_max_abs_diff / fp32_vs_torch_items: the fp32 ONNX graph against PyTorch.
    graph_optimization / quantization: how the fp32 graph was optimised and the ONNX Runtime int8 one made.
    int8: the ONNX Runtime int8 rule's numbers against fp32 (the manifest's ``int8_*`` keys, without the prefix).
    openvino_int8: the OpenVINO int8 model's :class:`VariantCheck` (None: not made).
    other: keys this version does not know (a benchmark's notes), kept as they were.
    The JSON layout is the flat one every bundle has had, so older bundles load unchanged.

    >>> r = ParityReport.from_dict({"fp32_vs_torch_max_abs_diff": 1e-6, "int8_agreement": 1.0, "openvino_int8": {"passed": True}})
    >>> r.int8["agreement"], r.openvino_int8.passed, r.openvino_int8_bf16_passed, r.to_dict()["int8_agreement"]
    (1.0, True, False, 1.0)
    """

    fp32_vs_torch_max_abs_diff: float | None = None
    fp32_vs_torch_items: int | None = None
    graph_optimization: str | None = None
    quantization: str | None = None
    int8: Mapping[str, Any] = field(default_factory=dict)
    openvino_int8: VariantCheck | None = None
    other: Mapping[str, Any] = field(default_factory=dict)

    SCALARS = ("fp32_vs_torch_max_abs_diff", "fp32_vs_torch_items", "graph_optimization", "quantization")

    @property
    def openvino_int8_bf16_passed(self) -> bool:
        """Whether export's int8 rule passed the OpenVINO int8 model with the bf16 hint: only then does serving try
        ``openvino-int8-bf16`` (the parity probe serving checks at load has no labels, so it cannot see a metric drop)."""
        ov = self.openvino_int8
        return ov is not None and ov.bf16_hint is not None and ov.bf16_hint.passed

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "parity") -> "ParityReport":
        if not isinstance(data, Mapping):
            raise ManifestError(f"{where} must be a JSON object, got {data!r}: re-export the bundle with `suffice export`")
        int8 = {k[len("int8_"):]: v for k, v in data.items() if k.startswith("int8_")}
        other = {k: v for k, v in data.items() if k not in (*cls.SCALARS, "openvino_int8") and not k.startswith("int8_")}
        return cls(**{k: data[k] for k in cls.SCALARS if k in data}, int8=int8,
                   openvino_int8=VariantCheck.from_dict(data.get("openvino_int8"), f"{where}.openvino_int8"),
                   other=other)

    def to_dict(self) -> dict[str, Any]:
        """The manifest's flat layout (``int8_*`` keys, ``openvino_int8`` an object); empty fields left out."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self.SCALARS if getattr(self, k) is not None}
        out.update({f"int8_{k}": v for k, v in self.int8.items()})
        if self.openvino_int8 is not None:
            out["openvino_int8"] = self.openvino_int8.to_dict()
        out.update(self.other)
        return out


@dataclass(frozen=True)
class BundleManifest:
    """Everything a service needs to know about an exported model (``suffice.json``).

    schema_version: manifest format version (this code reads ``SCHEMA_VERSION``).
    task: ``sufficiency`` or ``retrieval_gate``.
    id2label: logit column -> label name; ``positive_label`` is the one whose probability is the score.
    max_length / long_context_strategy: the encoder window and how long context is fitted into it
        (the same :class:`~suffice.serving.packing.ContextPacker` strategy as in training).
    temperature: calibration temperature; score = softmax(logits / temperature)[positive].
    calibration: absent (None) for temperature scaling, the only method older bundles know; else the
        record ``{method: platt, platt: {a, b}}`` (score = sigmoid(a * (z_pos - z_neg) + b), binary
        models; ``temperature`` is then 1.0 and unused). :attr:`calibrator` applies either.
    thresholds: decision thresholds (sufficiency: ``sufficient``/``partial``; gate: ``skip``).
    files: file name -> sha256 for every file of the bundle except this manifest.
    model_file / int8_model_file: the fp32 ONNX graph and the optional ONNX Runtime int8 one.
    openvino_int8_model_file: the optional OpenVINO int8 IR (``.xml``; its ``.bin`` weights next to it).
    probe_file: the parity probe (packed validation inputs + fp32 scores) every variant is checked
        against at load; None in bundles exported before it existed.
    field_digests: field name -> sha256 of its canonical JSON, for every other field (written by
        :func:`write_manifest`, checked by :func:`read_manifest`); None in bundles exported before it.
    """

    task: str
    id2label: Mapping[int, str]
    positive_label: str
    max_length: int
    long_context_strategy: str
    temperature: float
    thresholds: Mapping[str, float]
    base_model: str
    files: Mapping[str, str]
    schema_version: int = SCHEMA_VERSION
    label_scheme: str = "binary"
    model_file: str = MODEL_FP32
    int8_model_file: str | None = None
    tokenizer_file: str = TOKENIZER
    openvino_int8_model_file: str | None = None
    probe_file: str | None = None
    mlflow_run_id: str | None = None
    registered_model: str | None = None
    model_version: str | None = None
    created_at: str | None = None
    parity: ParityReport = field(default_factory=ParityReport)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    calibration: Mapping[str, Any] | None = None
    field_digests: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise ManifestError(
                f"manifest schema_version {self.schema_version!r} is not supported (this suffice reads "
                f"version {SCHEMA_VERSION}): re-export the model with this version of `suffice export`"
            )
        if not isinstance(self.parity, ParityReport):
            raise ManifestError(f"parity must be a ParityReport, got {type(self.parity).__name__}: build it with ParityReport.from_dict")
        if self.task not in TASKS:
            raise ManifestError(f"unknown task {self.task!r}: expected one of {list(TASKS)}")
        if not self.id2label or sorted(self.id2label) != list(range(len(self.id2label))):
            raise ManifestError(f"id2label must map 0..n-1 to label names, got {dict(self.id2label)!r}")
        if self.positive_label not in self.id2label.values():
            raise ManifestError(
                f"positive_label {self.positive_label!r} is not one of the labels {list(self.id2label.values())}"
            )
        if not isinstance(self.max_length, int) or not 16 <= self.max_length <= 8192:
            raise ManifestError(f"max_length must be an integer in [16, 8192], got {self.max_length!r}")
        if self.long_context_strategy not in STRATEGIES:
            raise ManifestError(
                f"unknown long_context_strategy {self.long_context_strategy!r}: expected one of {list(STRATEGIES)}"
            )
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature > 0):
            raise ManifestError(f"calibration temperature must be a positive number, got {self.temperature!r}")
        if self.calibration is not None:
            try:
                cal = self.calibrator
            except ValueError as e:
                raise ManifestError(f"calibration: {e}: re-export the bundle with `suffice export`") from None
            if cal.method == "platt" and len(self.id2label) != 2:
                raise ManifestError(f"calibration method 'platt' needs a binary model, but id2label has {len(self.id2label)} labels: "
                                    "re-train with calibration.method=temperature")
        for k, v in self.thresholds.items():
            if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ManifestError(f"threshold {k!r}={v!r} must be a number in [0, 1]")
        if self.task == "sufficiency":
            t = {**DEFAULT_THRESHOLDS["sufficiency"], **self.thresholds}
            if t[PARTIAL] > t[SUFFICIENT]:
                raise ManifestError(f"thresholds partial={t[PARTIAL]} > sufficient={t[SUFFICIENT]}: partial must be the lower one")
        ov = self.openvino_int8_model_file
        ov_files = (ov, str(Path(ov).with_suffix(".bin"))) if ov else ()
        for name in (self.model_file, self.tokenizer_file) + tuple(f for f in (self.int8_model_file, self.probe_file) if f) + ov_files:
            if name not in self.files:
                raise ManifestError(f"manifest lists no sha256 for {name!r}: every bundle file needs a checksum in 'files'")

    @property
    def positive_index(self) -> int:
        return next(i for i, name in self.id2label.items() if name == self.positive_label)

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @functools.cached_property
    def calibrator(self) -> Calibration:
        """The calibration that turns this model's logits into scores (temperature-only bundles: ``softmax(z / T)``)."""
        return Calibration.from_record({**(self.calibration or {}), "temperature": self.temperature})

    def threshold(self, name: str) -> float:
        """A decision threshold, falling back to the task default."""
        merged = {**DEFAULT_THRESHOLDS[self.task], **self.thresholds}
        if name not in merged:
            raise KeyError(f"no threshold {name!r} for task {self.task!r}: known {sorted(merged)}")
        return float(merged[name])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["parity"] = self.parity.to_dict()
        d["id2label"] = {str(k): v for k, v in self.id2label.items()}
        d["thresholds"] = dict(self.thresholds)
        d["files"] = dict(self.files)
        if self.calibration is None:
            del d["calibration"]  # a temperature-only manifest stays readable by every older suffice
        else:
            d["calibration"] = dict(self.calibration)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "suffice.json") -> "BundleManifest":
        """Build and validate a manifest; unknown or missing keys are errors that name them."""
        if not isinstance(data, Mapping):
            raise ManifestError(f"{where}: the manifest must be a JSON object, got {type(data).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ManifestError(f"{where}: unknown manifest key(s) {unknown}; known keys are {sorted(known)}")
        required = ["task", "id2label", "positive_label", "max_length", "long_context_strategy", "temperature",
                    "thresholds", "base_model", "files"]
        missing = [k for k in required if k not in data]
        if missing:
            raise ManifestError(f"{where}: manifest is missing {missing}: re-export the bundle with `suffice export`")
        d = dict(data)
        try:
            d["id2label"] = {int(k): str(v) for k, v in dict(d["id2label"]).items()}
        except (TypeError, ValueError) as e:
            raise ManifestError(f"{where}: id2label keys must be integers, got {d['id2label']!r}") from e
        for key in ("thresholds", "files", "parity", "metrics", "calibration", "field_digests"):
            if key in d and not isinstance(d[key], Mapping) and not (key in ("calibration", "field_digests") and d[key] is None):
                raise ManifestError(f"{where}: {key} must be a JSON object, got {d[key]!r}")
        if "parity" in d:
            d["parity"] = ParityReport.from_dict(d["parity"], where=f"{where}: parity")
        try:
            return cls(**d)
        except ManifestError as e:
            raise ManifestError(f"{where}: {e}") from None


def read_manifest(path: str | os.PathLike) -> BundleManifest:
    """Read and validate ``<bundle>/suffice.json`` (checksums are not checked here: see :func:`verify_bundle`)."""
    root = Path(path)
    if not root.is_dir():
        raise BundleNotFoundError(f"bundle folder {root} does not exist: give the folder `suffice export --out` wrote")
    mpath = root / MANIFEST_NAME
    if not mpath.is_file():
        raise BundleNotFoundError(
            f"{root} has no {MANIFEST_NAME}: it is not a suffice bundle (a training output folder has "
            "suffice_model.json instead; run `suffice export --model DIR --out BUNDLE` on it)"
        )
    try:
        data = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(f"{mpath} is not valid JSON ({e}): the bundle is damaged; re-export or re-download it") from e
    manifest = BundleManifest.from_dict(data, where=str(mpath))
    check_file_names(manifest, where=str(mpath))
    check_field_digests(manifest, where=str(mpath))
    return manifest


def check_file_names(manifest: BundleManifest, where: str = MANIFEST_NAME) -> None:
    """Every file the manifest names is a plain name inside the bundle (no ``..``, no absolute path),
    whether or not its checksum is verified."""
    for name in manifest.files:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ManifestError(f"{where}: file entry {name!r} must be a plain name inside the bundle: re-export it with `suffice export`")


def field_digests(manifest: BundleManifest) -> dict[str, str]:
    """sha256 of each field's canonical JSON (sorted keys, no spaces), every field but ``field_digests``.

    >>> m = read_manifest("bundles/sufficiency-v3")  # doctest: +SKIP
    >>> field_digests(m) == m.field_digests  # doctest: +SKIP
    True
    """
    d = manifest.to_dict()
    d.pop("field_digests", None)
    d.setdefault("calibration", None)  # to_dict leaves out an absent calibration; its digest is still recorded
    return {k: hashlib.sha256(json.dumps(v, sort_keys=True, separators=(",", ":")).encode()).hexdigest() for k, v in sorted(d.items())}


def check_field_digests(manifest: BundleManifest, where: str = MANIFEST_NAME) -> None:
    """Refuse a manifest edited after export: every field must match the digest :func:`write_manifest` recorded."""
    if manifest.field_digests is None:
        log.warning("%s has no field_digests (exported before suffice protected its manifest): an edit to its thresholds "
                    "or calibration would go unnoticed; re-export it with `suffice export` (and re-register) to protect it", where)
        return
    now = field_digests(manifest)
    changed = sorted(k for k in set(now) | set(manifest.field_digests) if now.get(k) != manifest.field_digests.get(k))
    if changed:
        shown = {k: manifest.to_dict().get(k) for k in changed[:3]}
        raise ManifestError(
            f"{where}: field(s) {changed} were edited after export (now {shown}): the manifest is written only by "
            "`suffice export` (and registration). Restore the exported suffice.json, or re-export; to serve with other "
            "thresholds, override them at load (ScorerConfig(thresholds=...), or sufficient_context.thresholds in the service config) instead of editing the bundle"
        )


def verify_bundle(path: str | os.PathLike, manifest: BundleManifest | None = None) -> BundleManifest:
    """Check that every file the manifest lists exists and has the recorded sha256.

    >>> verify_bundle("bundles/sufficiency-v3")  # doctest: +SKIP
    BundleManifest(task='sufficiency', ...)
    """
    root = Path(path)
    manifest = manifest or read_manifest(root)
    check_file_names(manifest, where=str(root / MANIFEST_NAME))
    for name, expected in manifest.files.items():
        f = root / name
        if not f.is_file():
            raise BundleNotFoundError(f"bundle {root} is missing {name!r} listed in its manifest: re-export or re-download it")
        got = sha256_file(f)
        if got != expected:
            raise ChecksumError(
                f"bundle {root}: {name!r} has sha256 {got[:16]}... but the manifest records {str(expected)[:16]}... "
                f"({f.stat().st_size} bytes): the file was modified or truncated; re-export or re-download the bundle"
            )
    return manifest


def read_probe(path: str | os.PathLike, manifest: BundleManifest | None = None) -> ParityProbe | None:
    """The bundle's parity probe, validated against the manifest; None for bundles without one.

    >>> read_probe("bundles/sufficiency-v3").scores.shape  # doctest: +SKIP
    (32,)
    """
    root = Path(path)
    manifest = manifest or read_manifest(root)
    if not manifest.probe_file:
        return None
    f = root / manifest.probe_file
    if not f.is_file():
        raise BundleNotFoundError(f"bundle {root} is missing its parity probe {manifest.probe_file!r}: re-export or re-download it")
    try:
        probe = ParityProbe.read(f)
    except ProbeError as e:
        raise ManifestError(str(e)) from e
    width = probe.input_ids.shape[1]
    if width > manifest.max_length:
        raise ManifestError(f"{f}: probe rows are {width} tokens but the model's window is {manifest.max_length}: re-export the bundle")
    return probe


def write_manifest(path: str | os.PathLike, manifest: BundleManifest) -> Path:
    """Write ``suffice.json`` (pretty, sorted keys) with the digest of every field, and return its path."""
    out = Path(path) / MANIFEST_NAME
    d = manifest.to_dict()
    d["field_digests"] = field_digests(manifest)
    out.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out
