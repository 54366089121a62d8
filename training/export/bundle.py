"""``export_bundle``: the export steps in order, in a temporary folder, moved into place only when every check passed.

>>> export_bundle("runs/x/model", "bundles/x", validation_items=items)  # doctest: +SKIP
PosixPath('bundles/x')
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

from suffice.serving.bundle import MODEL_FP32, MODEL_INT8, MODEL_OV_INT8, TOKENIZER, ParityReport, VariantCheck, write_manifest
from suffice.training.export.errors import ExportError, ParityConfig
from suffice.training.export.manifest import build_manifest
from suffice.training.export.parity import check_parity, check_roundtrip
from suffice.training.export.steps import ORT_INT8_KEEP_FP32, merge, optimise, quantise, read_model, to_onnx, write_probe
from suffice.training.export.validation import PROBE_ITEMS, as_pair

log = logging.getLogger("suffice.export")


def export_bundle(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    validation_items: Sequence[Any] | None = None,
    *,
    quantize: bool = True,
    optimize: bool = True,
    parity: ParityConfig | None = None,
    overwrite: bool = False,
    registered_model: str | None = None,
    model_version: str | None = None,
    probe_items: int = 32,
    openvino_int8: bool | None = None,
    int8_optional: bool = False,
) -> Path:
    """Export a trained-model directory to a checked bundle at ``out_dir`` and return its path.

    ``validation_items``: Items, ``{question, passages, label}`` dicts or ``(question, passages)``
    tuples (labels enable the F1 check); None uses a few built-in probe pairs.
    ``probe_items``: how many of the parity items (spread over them) go into the bundle's parity
    probe with their fp32 scores, so serving can check every variant on its own CPU; 0 writes none.

    ``int8_optional``: an ONNX Runtime int8 model that fails the parity rule is left out (the manifest's
    ``parity.int8_refused`` says why) instead of failing the export; the other variants are checked in the same pass.

    >>> export_bundle("runs/x/model", "/tmp/bundle", validation_items=[("Where is Paris?", ["Paris is in France."])])  # doctest: +SKIP
    PosixPath('/tmp/bundle')
    """
    from tokenizers import Tokenizer

    from suffice.serving.packing import ContextPacker

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    pc = parity or ParityConfig()
    meta = read_model(model_dir)
    if out_dir.exists() and not overwrite:
        raise ExportError(f"{out_dir} already exists: choose another --out or pass --overwrite")
    items = [as_pair(x, i) for i, x in enumerate(validation_items)] if validation_items else [(q, p, None) for q, p in PROBE_ITEMS]

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".suffice-export-", dir=out_dir.parent))
    try:
        merged = merge(model_dir, meta, work)
        plain = to_onnx(merged, work)
        fp32_src, opt_desc = optimise(plain.parent, work) if optimize else (plain, "none (disabled)")
        bundle = work / "bundle"
        bundle.mkdir()
        shutil.copy(fp32_src, bundle / MODEL_FP32)
        shutil.copy(model_dir / TOKENIZER, bundle / TOKENIZER)
        quant_desc = quantise(bundle / MODEL_FP32, bundle / MODEL_INT8) if quantize else None

        # inputs exactly as serving builds them
        packer = ContextPacker(Tokenizer.from_file(str(model_dir / TOKENIZER)), max_length=int(meta.max_length),
                               strategy=str(meta.long_context_strategy))
        packed = [packer.pack(q, p) for q, p, _ in items]
        ov_file, ov_desc, ov_skipped = make_openvino_int8(bundle, packed, packer.pad_id, quantize if openvino_int8 is None else openvino_int8,
                                              required=openvino_int8 is True)
        measured, fp32_par = check_parity(merged, bundle, packed, packer.pad_id, [lab for _, _, lab in items], meta, pc,
                                          quantized=quantize, graph_optimization=opt_desc, quantization=quant_desc, openvino_int8=ov_file,
                                          int8_optional=int8_optional,
                                          requantise=lambda: quantise(bundle / MODEL_FP32, bundle / MODEL_INT8, exclude=ORT_INT8_KEEP_FP32))
        report = ParityReport.from_dict(measured)
        shipped_int8 = quantize and "refused" not in report.int8
        if shipped_int8 and "first_recipe" in report.int8:
            log.info("ONNX Runtime int8: the first recipe was refused (%s); shipping the second (%s)",
                     report.int8["first_recipe"]["refused"], report.quantization)
        if quantize and not shipped_int8:
            log.warning("ONNX Runtime int8 left out of the bundle: %s", report.int8["refused"])
            (bundle / MODEL_INT8).unlink()
            # the bundle ships no ORT int8 model: ``quantization`` (what made the shipped one) is empty,
            # the refused model's recipe stays beside its numbers and the refusal
            report = dataclasses.replace(report, quantization=None, int8={**report.int8, "quantization": report.quantization})
        if ov_skipped:
            report = dataclasses.replace(report, openvino_int8=VariantCheck(passed=False, refused=ov_skipped))
        elif ov_file:
            ov = report.openvino_int8
            report = dataclasses.replace(report, openvino_int8=dataclasses.replace(ov, numbers={**ov.numbers, "quantization": ov_desc}))
            if not ov.passed:
                log.warning("OpenVINO int8 left out of the bundle: %s", ov.refused)
                for f in (bundle / ov_file, (bundle / ov_file).with_suffix(".bin")):
                    f.unlink()
                ov_file = None
        probe_file = (write_probe(bundle, packed, fp32_par, meta, pc, packer.pad_id, probe_items,
                                  variants=shipped_int8_variants(shipped_int8, ov_file, report)) if probe_items else None)
        write_manifest(bundle, build_manifest(bundle, meta, report, quantized=shipped_int8, probe_file=probe_file,
                                              registered_model=registered_model, model_version=model_version, openvino_int8_file=ov_file))
        check_roundtrip(bundle, packed, fp32_par, pc)

        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(bundle, out_dir)
        log.info("bundle written to %s: %s", out_dir, json.dumps(report.to_dict()))
        return out_dir
    finally:
        shutil.rmtree(work, ignore_errors=True)


def shipped_int8_variants(quantized: bool, ov_file: str | None, report: ParityReport) -> list[Any]:
    """The int8 variants the bundle ships that export's rule passed: ONNX Runtime int8, OpenVINO int8 and,
    where its bf16-hint check passed, OpenVINO int8 with the bf16 hint (the probe records their scores)."""
    from suffice.serving.backends import ONNXRUNTIME, OPENVINO, Variant

    out = [Variant(ONNXRUNTIME, "int8", MODEL_INT8)] if quantized else []
    if ov_file:
        out.append(Variant(OPENVINO, "int8", ov_file))
        if report.openvino_int8_bf16_passed:
            out.append(Variant(OPENVINO, "int8", ov_file, "bf16"))
    return out


def make_openvino_int8(bundle: Path, packed: Sequence[Any], pad_id: int, wanted: bool, *,
                       required: bool) -> tuple[str | None, str | None, str | None]:
    """(IR file name, recipe, None) when made; (None, None, why not) when nncf/openvino are missing (an
    :class:`ExportError` if ``required``); (None, None, None) when not wanted. Calibrated on ``packed``."""
    from suffice.serving.packing import pad_packed
    from suffice.training.export.steps import nncf_missing, quantise_openvino

    if not wanted:
        return None, None, None
    why = nncf_missing()
    if why:
        if required:
            raise ExportError(f"openvino_int8=True but {why}")
        log.warning("export: no OpenVINO int8 model: %s", why)
        return None, None, why
    desc = quantise_openvino(bundle / MODEL_FP32, bundle / MODEL_OV_INT8, [pad_packed([p], pad_id) for p in packed])
    return MODEL_OV_INT8, desc, None


def export_shipping_what_passes(model_dir: str | os.PathLike, out_dir: str | os.PathLike,
                                validation_items: Sequence[Any] | None = None, *, quantize: bool = True,
                                openvino_int8: bool | None = None, **kwargs: Any) -> tuple[Path, str | None]:
    """:func:`export_bundle` with ``int8_optional``: when the ONNX Runtime int8 model fails its parity check
    the bundle ships without it (fp32 plus the OpenVINO int8 model, checked on its own in the same pass,
    where it passes), instead of failing. What ``suffice export`` and training's ``export: true`` both do,
    so a refused variant never costs the user the faster one that passed. Returns (bundle, the refusal or
    None): the caller says it (on stderr, on the run).

    >>> export_shipping_what_passes("models/x", "models/x/bundle", items)  # doctest: +SKIP
    (PosixPath('models/x/bundle'), 'int8 moves the calibrated score by 0.0212 on average ...')
    """
    from suffice.serving.bundle import read_manifest

    bundle = export_bundle(model_dir, out_dir, validation_items, quantize=quantize, openvino_int8=openvino_int8,
                           int8_optional=True, **kwargs)
    return bundle, read_manifest(bundle).parity.int8.get("refused")
