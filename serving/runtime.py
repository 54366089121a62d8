"""One ONNX classifier session over a bundle: the piece the scorer and the retrieval gate share.

It owns the onnxruntime session (inputs built from ``session.get_inputs()``, int64 ids, all
logit columns kept next to ``id2label``), the bundle's tokenizer and the
:class:`~suffice.serving.packing.ContextPacker` with the manifest's window and strategy.
``InferenceSession.run`` is thread-safe and the tokenizer is only read after construction, so
one instance serves many threads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from suffice.serving.bundle import BundleError, BundleManifest, read_manifest, verify_bundle
from suffice.serving.packing import ContextPacker, PackedInput, pad_packed

PRECISIONS = ("auto", "int8", "fp32")


@dataclass(frozen=True)
class RuntimeConfig:
    """How to run a bundle's ONNX model.

    precision: ``auto`` (int8 when the bundle has it, else fp32), ``int8`` or ``fp32``.
    intra_op_threads: onnxruntime intra-op threads; 0 = one per physical core (onnxruntime's default).
    inter_op_threads: threads across independent graph nodes; 1 suits BERT's sequential graph.
    verify_checksums: check every file's sha256 against the manifest before loading.
    """

    precision: str = "auto"
    intra_op_threads: int = 0
    inter_op_threads: int = 1
    verify_checksums: bool = True

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is not one of {list(PRECISIONS)}")
        for name in ("intra_op_threads", "inter_op_threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name}={v!r} must be an integer >= 0 (0 lets onnxruntime choose)")


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of ``logits / temperature`` in float64.

    >>> softmax(np.array([[0.0, 0.0]])).tolist()
    [[0.5, 0.5]]
    """
    z = np.asarray(logits, dtype=np.float64) / float(temperature)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class OnnxClassifier:
    """A loaded bundle: manifest, tokenizer, packer and one onnxruntime session."""

    def __init__(self, path: str | os.PathLike, config: RuntimeConfig | None = None, expected_task: str | None = None):
        import onnxruntime as ort
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
        if self.config.precision == "int8" and not manifest.int8_model_file:
            raise BundleError(f"bundle {self.path} has no int8 model: use precision='fp32' or 'auto', or re-export with quantisation")
        use_int8 = self.config.precision in ("auto", "int8") and manifest.int8_model_file is not None
        self.model_file = manifest.int8_model_file if use_int8 else manifest.model_file
        self.precision = "int8" if use_int8 else "fp32"

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.config.intra_op_threads
        opts.inter_op_num_threads = self.config.inter_op_threads
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(self.path / self.model_file), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types; name the file and the fix
            raise BundleError(f"onnxruntime cannot load {self.path / self.model_file}: {e}; re-export the bundle") from e
        self.input_names = [i.name for i in self.session.get_inputs()]
        unknown = [n for n in self.input_names if n not in ("input_ids", "attention_mask", "token_type_ids")]
        if unknown or "input_ids" not in self.input_names:
            raise BundleError(f"{self.model_file} expects inputs {self.input_names}: suffice feeds BERT-style input_ids/attention_mask/token_type_ids")
        self.output_name = self.session.get_outputs()[0].name
        n_out = self.session.get_outputs()[0].shape[-1]
        if isinstance(n_out, int) and n_out != manifest.num_labels:
            raise BundleError(f"{self.model_file} outputs {n_out} logits but id2label has {manifest.num_labels} labels: the manifest does not match the model")

        self.tokenizer = Tokenizer.from_file(str(self.path / manifest.tokenizer_file))
        self.packer = ContextPacker(self.tokenizer, max_length=manifest.max_length, strategy=manifest.long_context_strategy)
        self.labels = [manifest.id2label[i] for i in range(manifest.num_labels)]

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
        """Logits (batch, num_labels) as float32 for already packed int64 inputs."""
        logits = self.session.run([self.output_name], {n: feeds[n] for n in self.input_names})[0]
        if logits.ndim != 2 or logits.shape[1] != self.manifest.num_labels:
            raise BundleError(f"model returned logits of shape {logits.shape}, expected (batch, {self.manifest.num_labels})")
        return logits

    def predict_packed(self, packed: Sequence[PackedInput]) -> tuple[np.ndarray, np.ndarray]:
        """(logits, calibrated probabilities) for packed inputs."""
        logits = self.run(pad_packed(packed, self.packer.pad_id))
        return logits, softmax(logits, self.manifest.temperature)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` without special tokens (what a context budget is counted in)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def describe(self) -> dict[str, Any]:
        m = self.manifest
        return {"path": str(self.path), "task": m.task, "precision": self.precision, "model_file": self.model_file,
                "max_length": m.max_length, "strategy": m.long_context_strategy, "model_version": m.model_version,
                "mlflow_run_id": m.mlflow_run_id}
