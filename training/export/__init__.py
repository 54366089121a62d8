"""``suffice export`` and ``suffice promote``: a trained-model directory -> a checked ONNX bundle -> the registry.

The steps, one public function each, in the order :func:`.bundle.export_bundle` runs them
(like sentence-transformers' ``backend/`` folder):

    steps.read_model -> steps.merge -> steps.to_onnx -> steps.optimise -> steps.quantise -> steps.quantise_openvino
    -> parity.check_parity -> manifest.build_manifest -> parity.check_roundtrip

An ONNX Runtime int8 model the int8 rule refuses is made once more with ``steps.ORT_INT8_KEEP_FP32`` left in
fp32 and checked again (``int8_first_recipe`` in the manifest's parity keeps the refused recipe's numbers).

- :mod:`.validation` the items parity is checked on; :mod:`.errors` ExportError, ParityError, ParityConfig
- :mod:`.registry`   register a bundle in MLflow, resolve a registry URI, promote an alias
- :mod:`.cli`        the ``suffice export`` command

>>> from suffice.training.export import export_bundle
>>> export_bundle("models/demo", "bundles/demo", validation_items=items)  # doctest: +SKIP
PosixPath('bundles/demo')
"""

from suffice.training.export.bundle import export_bundle
from suffice.training.export.cli import build_parser, main
from suffice.training.export.errors import ExportError, ParityConfig, ParityError
from suffice.training.export.steps import merge, optimise, quantise, read_model, to_onnx
from suffice.training.export.validation import PROBE_ITEMS, load_validation_jsonl

__all__ = [
    "PROBE_ITEMS", "ExportError", "ParityConfig", "ParityError", "build_parser", "export_bundle",
    "load_validation_jsonl", "main", "merge", "optimise", "quantise", "read_model", "to_onnx",
]
