"""One classifier over a bundle: the piece the scorer, the retrieval gate and ``suffice score`` share.

It picks the model variant (``suffice.serving.backends``: ONNX Runtime int8/fp32, OpenVINO
int8/fp32/bf16), checks it against the bundle's parity probe, owns its engine (inputs built from the
model's input names, int64 ids, all logit columns kept next to ``id2label``), the bundle's tokenizer and the
:class:`~suffice.serving.packing.ContextPacker` with the manifest's window and strategy.
Both engines are thread-safe as used here and the tokenizer is only read after construction,
so one instance serves many threads.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from suffice.serving.backends import (BACKENDS, OPENVINO_INSTALL, PRECISIONS, Variant, open_engine, openvino_available,
                                      rank_variants, trim_heap)
from suffice.serving.bundle import BundleError, BundleManifest, read_manifest, read_probe, verify_bundle
from suffice.serving.cpu import CpuInfo, detect
from suffice.serving.packing import ContextPacker, PackedInput, pad_packed
from suffice.serving.probe import ParityProbe, ProbeCheck

log = logging.getLogger("suffice.runtime")
# A batch is cut into model calls of at most this many (padded) tokens, rows sorted by length:
# see OnnxClassifier.predict_packed for why.
MAX_BATCH_TOKENS = 2048


@dataclass(frozen=True)
class RuntimeConfig:
    """How to run a bundle's model.

    backend: ``auto`` (the fastest variant the bundle holds that this CPU supports), ``onnxruntime``
        or ``openvino`` (the optional extra ``suffice[openvino]``).
    precision: ``auto``, ``int8`` (the bundle's int8 model), ``fp32`` or ``bf16`` (OpenVINO on CPUs with
        AMX or AVX-512 BF16).
    intra_op_threads: threads per inference; 0 = the engine's default (one per physical core).
    inter_op_threads: onnxruntime threads across independent graph nodes; 1 suits BERT's sequential graph.
    verify_checksums: check every file's sha256 against the manifest before loading (file names and the
        manifest's own field digests are checked whatever this says: they cost nothing).
    check_probe: score the bundle's parity probe with each variant before using it (skipped for
        bundles without a probe).
    max_batch_tokens: padded tokens per model call in a batch (rows are sorted by length first).
    cpu: the CPU to select for; None detects this machine's (``suffice.serving.cpu.detect``).
    """

    precision: str = "auto"
    intra_op_threads: int = 0
    inter_op_threads: int = 1
    verify_checksums: bool = True
    backend: str = "auto"
    check_probe: bool = True
    max_batch_tokens: int = MAX_BATCH_TOKENS
    cpu: CpuInfo | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is not one of {list(PRECISIONS)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not one of {list(BACKENDS)}")
        for name in ("intra_op_threads", "inter_op_threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name}={v!r} must be an integer >= 0 (0 lets the engine choose)")
        if not isinstance(self.max_batch_tokens, int) or self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens={self.max_batch_tokens!r} must be a positive integer")


class OnnxClassifier:
    """A loaded bundle: manifest, tokenizer, packer and the engine of the chosen variant.

    ``variant`` (e.g. ``onnxruntime-int8``, ``openvino-bf16``), ``backend`` and ``precision`` say what
    runs; ``rejected`` lists the faster variants that were skipped and why.
    """

    def __init__(self, path: str | os.PathLike, config: RuntimeConfig | None = None, expected_task: str | None = None,
                 engine_factory: Callable[..., Any] = open_engine):
        from tokenizers import Tokenizer

        self.path = Path(path)
        self.config = config or RuntimeConfig()
        manifest = read_manifest(self.path)
        if expected_task is not None and manifest.task != expected_task:
            raise BundleError(
                f"bundle {self.path} is a {manifest.task!r} model but a {expected_task!r} model was expected: "
                + ("load it with RetrievalGate.load" if manifest.task == "retrieval_gate" else "load it with SufficiencyScorer.load")
            )
        if self.config.verify_checksums:
            verify_bundle(self.path, manifest)
        self.manifest: BundleManifest = manifest
        # before the engines compile: a bad tokenizer is a clear BundleError, with or without checksums
        tokenizer_path = self.path / manifest.tokenizer_file
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
            self.packer = ContextPacker(self.tokenizer, max_length=manifest.max_length, strategy=manifest.long_context_strategy)
        except Exception as e:  # tokenizers raises a bare Exception for a missing or malformed file
            raise BundleError(f"bundle {self.path}: cannot read its tokenizer {manifest.tokenizer_file!r} ({e}): "
                              "re-export the bundle with `suffice export` or re-download it") from e
        self.cpu = self.config.cpu or detect()
        if self.config.precision == "int8" and not (manifest.int8_model_file or manifest.openvino_int8_model_file):
            raise BundleError(f"bundle {self.path} has no int8 model: use precision='fp32' or 'auto', or re-export with quantisation")
        has_openvino = openvino_available()
        candidates = rank_variants(manifest.model_file, manifest.int8_model_file, self.cpu, backend=self.config.backend,
                                   precision=self.config.precision, openvino=has_openvino,
                                   openvino_int8_model_file=manifest.openvino_int8_model_file,
                                   openvino_int8_bf16=manifest.parity.openvino_int8_bf16_passed)
        self.notes: list[str] = []
        if self.config.backend == "auto" and not has_openvino and self.cpu.bf16:
            self.notes.append(f"OpenVINO is not installed: its bf16 variant is skipped on this {self.cpu.isa_class} CPU with bf16 units "
                              f"({OPENVINO_INSTALL} to use it)")
            log.info("%s", self.notes[-1])
        probe = read_probe(self.path, manifest) if self.config.check_probe else None
        self.rejected: list[dict[str, Any]] = []
        self.probe_check: ProbeCheck | None = None
        for variant in candidates:
            engine = self._open(engine_factory, variant, last=variant is candidates[-1])
            if engine is None:
                continue
            if probe is not None:
                check = probe.check(self._probe_scores(engine, probe), list(manifest.thresholds.values()), variant.name)
                if not check.ok:
                    log.warning("%s: variant %s drifts from the bundle's probe scores (%s): not used", self.path, variant.name, check.describe())
                    self.rejected.append({"variant": variant.name, "reason": "parity probe: " + check.describe()})
                    continue
                self.probe_check = check
            self.engine, self.variant_info = engine, variant
            break
        else:
            raise BundleError(f"no model variant of {self.path} can be used on {self.cpu.describe()}: "
                              + "; ".join(f"{r['variant']}: {r['reason']}" for r in self.rejected)
                              + ": re-export the bundle on a machine like this one, or file an issue with these numbers")
        self.model_file = self.variant_info.model_file
        self.input_names = self.engine.input_names
        trim_heap()  # what compiling and the probe freed (rejected variants included) goes back to the OS
        log.info("%s: %s on %s%s", self.path, self.variant, self.cpu.describe(),
                 "" if not self.rejected else " (skipped " + ", ".join(r["variant"] for r in self.rejected) + ")")

        self.labels = [manifest.id2label[i] for i in range(manifest.num_labels)]

    @property
    def variant(self) -> str:
        return self.variant_info.name

    @property
    def backend(self) -> str:
        return self.variant_info.backend

    @property
    def precision(self) -> str:
        return self.variant_info.precision

    @property
    def session(self) -> Any:
        """The onnxruntime session of an ONNX Runtime variant (None for OpenVINO)."""
        return getattr(self.engine, "session", None)

    def _open(self, factory: Callable[..., Any], variant: Variant, last: bool):
        """The engine for ``variant``, or None (logged, recorded) when an OpenVINO variant cannot compile this graph."""
        try:
            engine = factory(self.path, variant, self.config.intra_op_threads, self.config.inter_op_threads)
        except Exception as e:  # the engines raise their own types; name the file and the fix
            if variant.backend == "openvino" and not last:
                log.warning("%s: OpenVINO cannot compile %s (%s): trying the next variant", self.path, variant.model_file, e)
                self.rejected.append({"variant": variant.name, "reason": f"{type(e).__name__}: {e}"})
                return None
            raise BundleError(f"{variant.backend} cannot load {self.path / variant.model_file}: {e}; re-export the bundle") from e
        unknown = [n for n in engine.input_names if n not in ("input_ids", "attention_mask", "token_type_ids")]
        if unknown or "input_ids" not in engine.input_names:
            raise BundleError(f"{variant.model_file} expects inputs {engine.input_names}: suffice feeds BERT-style input_ids/attention_mask/token_type_ids")
        if engine.num_outputs is not None and engine.num_outputs != self.manifest.num_labels:
            raise BundleError(f"{variant.model_file} outputs {engine.num_outputs} logits but id2label has {self.manifest.num_labels} labels: the manifest does not match the model")
        return engine

    def _probe_scores(self, engine: Any, probe: ParityProbe) -> np.ndarray:
        return probe.scores_of(lambda feeds: self._checked(engine.run(feeds)), self.manifest.calibrator, self.manifest.positive_index)

    def packer_for(self, max_length: int | None = None, strategy: str | None = None) -> ContextPacker:
        """A packer sharing this tokenizer with a different window or strategy (never wider than the model's)."""
        ml = max_length or self.manifest.max_length
        if ml > self.manifest.max_length:
            raise ValueError(f"max_length {ml} exceeds the model's window {self.manifest.max_length}: use <= {self.manifest.max_length}")
        st = strategy or self.manifest.long_context_strategy
        if ml == self.packer.max_length and st == self.packer.strategy:
            return self.packer
        return ContextPacker(self.tokenizer, max_length=ml, strategy=st)

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Logits (batch, num_labels) as float32 for already packed int64 inputs (one model call)."""
        return self._checked(self.engine.run(feeds))

    def _checked(self, logits: np.ndarray) -> np.ndarray:
        if logits.ndim != 2 or logits.shape[1] != self.manifest.num_labels:
            raise BundleError(f"model returned logits of shape {logits.shape}, expected (batch, {self.manifest.num_labels})")
        return logits

    def predict_packed(self, packed: Sequence[PackedInput]) -> tuple[np.ndarray, np.ndarray]:
        """(logits, calibrated probabilities) for packed inputs, in input order.

        Rows are sorted by length and cut into calls of at most ``max_batch_tokens`` padded tokens,
        each padded to its own longest row: one call padded to the whole batch's longest row would
        make short rows pay for the longest, and attention is quadratic in that length.
        """
        if not packed:
            return np.zeros((0, self.manifest.num_labels), np.float32), np.zeros((0, self.manifest.num_labels))
        lengths = np.array([len(p.input_ids) for p in packed])
        order = np.argsort(lengths, kind="stable")
        logits = np.zeros((len(packed), self.manifest.num_labels), np.float32)
        start = 0
        while start < len(order):
            stop = start + 1
            while stop < len(order) and lengths[order[stop]] * (stop - start + 1) <= self.config.max_batch_tokens:
                stop += 1
            rows = order[start:stop]
            logits[rows] = self.run(pad_packed([packed[i] for i in rows], self.packer.pad_id))
            start = stop
        return logits, self.manifest.calibrator.probabilities(logits, self.manifest.positive_index)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` without special tokens (what a context budget is counted in)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def describe(self) -> dict[str, Any]:
        m = self.manifest
        return {"path": str(self.path), "task": m.task, "variant": self.variant, "backend": self.backend,
                "precision": self.precision, "model_file": self.model_file, "cpu": self.cpu.as_dict(), "rejected_variants": self.rejected, "notes": self.notes,
                "probe": None if self.probe_check is None else self.probe_check.as_dict(),
                "max_length": m.max_length, "strategy": m.long_context_strategy, "model_version": m.model_version,
                "mlflow_run_id": m.mlflow_run_id}
