"""``suffice export``: merge, export to ONNX, optimise, quantise, check parity, write a bundle.

Export and parity are one step. The bundle is first assembled in a temporary folder next to
``--out``; only after every check passes is it moved into place, so a failed export leaves no
bundle behind. Checks (defaults from the issue):

* fp32 ONNX vs PyTorch logits: max |diff| <= 1e-4 on up to 200 validation items;
* int8 vs fp32 decisions agree on >= 99% of the validation items, and F1 (where items carry
  labels) drops by <= 0.5 point;
* the written bundle loads with the serving code and reproduces the fp32 logits.

A failed check raises :class:`ParityError` naming the check and the largest difference.

    suffice export --model runs/2025-01-01/model --out bundles/sufficiency-v3 --validation-data data/validation.jsonl
    suffice export --model models:/suffice-sufficiency/3 --out bundles/v3 --register

>>> export_bundle("runs/x/model", "bundles/x", validation_items=items)  # doctest: +SKIP
PosixPath('bundles/x')
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from suffice.serving.bundle import (
    MANIFEST_NAME,
    MODEL_FP32,
    MODEL_INT8,
    TOKENIZER,
    BundleManifest,
    sha256_file,
    write_manifest,
)

log = logging.getLogger("suffice.export")

MODEL_META = "suffice_model.json"
# Probe pairs used for parity when no validation data is given (export still checks something real).
PROBE_ITEMS = [
    ("Where is the Eiffel Tower?", ["The Eiffel Tower is a wrought-iron lattice tower in Paris, France."]),
    ("When did Chopin leave Warsaw?", [{"title": "Chopin", "text": "Chopin left Warsaw in 1830, shortly before the November Uprising."}]),
    ("Who founded the city of Lima?", ["Lima is the capital of Peru.", "It lies on the Pacific coast."]),
    ("What is the boiling point of water at sea level?", ["Water boils at 100 degrees Celsius at sea level."]),
    ("Which river flows through Vienna?", ["Vienna is known for its music and coffee houses."]),
    ("How many moons does Mars have?", [{"title": "Mars", "text": "Mars has two small moons, Phobos and Deimos."}]),
    ("Who painted the Mona Lisa?", ["The Louvre is the world's most visited museum."] * 3),
    ("What year did the Berlin Wall fall?", ["The Berlin Wall fell on 9 November 1989. " * 20]),
]


class ExportError(RuntimeError):
    """The model cannot be exported; the message names what is wrong and the fix."""


class ParityError(ExportError):
    """An exported model disagrees with its reference beyond the tolerance.

    check: ``fp32_vs_torch``, ``int8_agreement``, ``int8_f1`` or ``bundle_roundtrip``;
    largest_difference: the largest |logit difference| (or the shortfall for agreement/F1).
    """

    def __init__(self, message: str, *, check: str, largest_difference: float, tolerance: float):
        super().__init__(message)
        self.check, self.largest_difference, self.tolerance = check, float(largest_difference), float(tolerance)


@dataclass(frozen=True)
class ParityConfig:
    """Export checks. parity_items: items for the fp32-vs-torch check; atol: its tolerance;
    min_agreement: int8-vs-fp32 decision agreement; max_f1_drop: allowed F1 drop (0.005 = 0.5 point)."""

    parity_items: int = 200
    atol: float = 1e-4
    min_agreement: float = 0.99
    max_f1_drop: float = 0.005
    batch_size: int = 16


# ------------------------------------------------------------------------------------------
# model directory
# ------------------------------------------------------------------------------------------
def read_model_meta(model_dir: Path) -> dict[str, Any]:
    """Read and check ``suffice_model.json`` of a trained-model directory."""
    p = model_dir / MODEL_META
    if not p.is_file():
        raise ExportError(f"{model_dir} has no {MODEL_META}: give a directory written by `suffice train`")
    try:
        meta = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ExportError(f"{p} is not valid JSON: {e}") from e
    missing = [k for k in ("task", "id2label", "positive_label", "max_length") if k not in meta]
    if missing:
        raise ExportError(f"{p} is missing {missing}: re-run training or add them (see BRIEF's model-directory contract)")
    if not (model_dir / TOKENIZER).is_file():
        raise ExportError(f"{model_dir} has no {TOKENIZER}: the bundle needs the fast tokenizer the model was trained with")
    return meta


def merged_model_dir(model_dir: Path, meta: Mapping[str, Any], work: Path) -> Path:
    """A directory holding a merged HF sequence-classification model (merging the LoRA adapter if needed)."""
    if (model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file():
        return model_dir
    adapter = model_dir / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        raise ExportError(f"{model_dir} has neither config.json + model.safetensors (merged model) nor adapter/ (LoRA): nothing to export")
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from suffice.training.paths import resolve_base_model

    base = resolve_base_model(str(meta.get("base_model") or json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]))
    id2label = {int(k): v for k, v in meta["id2label"].items()}
    model = AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=len(id2label), id2label=id2label, label2id={v: k for k, v in id2label.items()}, torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    out = work / "merged"
    model.save_pretrained(out, safe_serialization=True)
    for name in (TOKENIZER, "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, out / name)
    return out


# ------------------------------------------------------------------------------------------
# ONNX steps
# ------------------------------------------------------------------------------------------
def export_onnx(merged: Path, work: Path) -> Path:
    """Plain optimum export (dynamic batch and sequence axes), validation done by our parity step."""
    from optimum.exporters.onnx import main_export

    out = work / "onnx"
    main_export(str(merged), output=str(out), task="text-classification", do_validation=False, local_files_only=True)
    path = out / "model.onnx"
    if not path.is_file():
        raise ExportError(f"optimum wrote no model.onnx in {out} (files: {sorted(os.listdir(out))})")
    return path


def optimise_onnx(onnx_dir: Path, work: Path) -> tuple[Path, str]:
    """onnxruntime transformer fusions (Attention, SkipLayerNorm, BiasGelu) at level 2, no approximations.

    Returns (path, description). Models the optimiser does not know keep the plain graph
    (onnxruntime still applies its generic optimisations when the session starts).
    """
    from optimum.onnxruntime import ORTOptimizer
    from optimum.onnxruntime.configuration import OptimizationConfig

    try:
        opt = ORTOptimizer.from_pretrained(str(onnx_dir))
        opt.optimize(OptimizationConfig(optimization_level=2, enable_gelu_approximation=False), save_dir=str(work / "opt"))
    except (KeyError, NotImplementedError, ValueError) as e:
        log.warning("ORT transformer optimisation not available for this model (%s); keeping the plain export", e)
        return onnx_dir / "model.onnx", f"none ({type(e).__name__}: {e})"
    return work / "opt" / "model_optimized.onnx", "ort-transformers-level2"


def cpu_has_vnni() -> bool:
    """True when this x86 CPU has VNNI (AVX-512 VNNI or AVX-VNNI); False when unknown."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def quantise_onnx(src: Path, dst: Path, reduce_range: bool | None = None, weight_type: str = "QInt8",
                  op_types: Sequence[str] = ("MatMul", "Attention", "Gather")) -> str:
    """Dynamic int8: per-channel s8 weights / u8 activations (the VNNI fast path).

    Without VNNI, ONNX Runtime's u8s8 kernels multiply with VPMADDUBSW, whose 16-bit
    intermediate sums saturate on full-range 8-bit weights (measured here on an AVX2-only
    EPYC: a systematic 0.05 shift of every score). ``reduce_range`` (7-bit weights) avoids it;
    by default it is on exactly when the exporting CPU lacks VNNI, and the manifest says which.

    Fused Attention nodes become QAttention. ``DefaultTensorType`` lets the quantiser handle
    tensors the optimiser left without shape inference (the "Unable to find data type for
    weight_name=...MatMul_output_0" failure seen when quantising ORTOptimizer output).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if reduce_range is None:
        reduce_range = not cpu_has_vnni()
    quantize_dynamic(str(src), str(dst), op_types_to_quantize=list(op_types), per_channel=True,
                     reduce_range=reduce_range, weight_type=getattr(QuantType, weight_type),
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    rr = ", reduce_range (7-bit weights: no VNNI on the exporting CPU)" if reduce_range else ""
    w = "s8" if weight_type == "QInt8" else "u8"
    return f"dynamic-int8 per-channel {w} weights/u8 activations QOperator ({', '.join(op_types)}){rr}"


def _session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _onnx_logits(session, feeds_list: Iterable[dict[str, np.ndarray]]) -> np.ndarray:
    names = [i.name for i in session.get_inputs()]
    outs = [session.run(None, {n: f[n] for n in names})[0] for f in feeds_list]
    return np.concatenate(outs, axis=0) if outs else np.zeros((0, 0), np.float32)


# ------------------------------------------------------------------------------------------
# validation data
# ------------------------------------------------------------------------------------------
def _as_pair(item: Any, i: int) -> tuple[str, Any, int | None]:
    if isinstance(item, tuple) and len(item) == 2:
        return item[0], item[1], None
    if isinstance(item, Mapping):
        q, ps, lab = item.get("question"), item.get("passages"), item.get("label")
    else:
        q, ps, lab = getattr(item, "question", None), getattr(item, "passages", None), getattr(item, "label", None)
    if not isinstance(q, str) or ps is None:
        raise ExportError(f"validation item {i} has no question/passages: give Items, dicts with question and passages, or (question, passages) tuples")
    return q, ps, (None if lab is None else int(lab))


def load_validation_jsonl(path: str | os.PathLike, split: str | None = "validation") -> list[dict[str, Any]]:
    """Items from a JSONL file (``question``, ``passages``, optional ``label``/``split``), or
    retrieval-gate threads (``messages``, ``label`` RETRIEVE/SKIP), turned into items the way the
    gate packs them: the latest user message is the question, earlier turns the passages."""
    p = Path(path)
    if not p.is_file():
        raise ExportError(f"validation data {p} does not exist: give a JSONL file of items (question, passages, label)")
    items = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ExportError(f"{p}, line {n}: not valid JSON ({e})") from e
            if split and d.get("split") not in (None, split):
                continue
            if isinstance(d, dict) and "messages" in d and "question" not in d:
                d = _thread_item(d, p, n)
            items.append(d)
    if not items:
        raise ExportError(f"{p} holds no items" + (f" of split {split!r}" if split else ""))
    return items


def _thread_item(d: dict[str, Any], path: Path, line: int) -> dict[str, Any]:
    msgs = d["messages"]
    ok = isinstance(msgs, list) and msgs and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs)
    if not ok or msgs[-1].get("role") != "user":
        raise ExportError(f"{path}, line {line}: a thread's messages must be {{role, content}} objects ending with the user's turn")
    label = d.get("label")
    if label not in (None, "RETRIEVE", "SKIP"):
        raise ExportError(f"{path}, line {line}: a thread's label must be RETRIEVE or SKIP, got {label!r}")
    from suffice.serving.retrieval_gate import turns_as_passages

    item: dict[str, Any] = {"question": msgs[-1]["content"], "passages": turns_as_passages(msgs[:-1])}
    if label is not None:
        item["label"] = int(label == "SKIP")
    return item


def _f1(pred: np.ndarray, gold: np.ndarray) -> float:
    tp = float(((pred == 1) & (gold == 1)).sum())
    fp = float(((pred == 1) & (gold == 0)).sum())
    fn = float(((pred == 0) & (gold == 1)).sum())
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


# ------------------------------------------------------------------------------------------
# the export step
# ------------------------------------------------------------------------------------------
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
) -> Path:
    """Export a trained-model directory to a checked bundle at ``out_dir`` and return its path.

    ``validation_items``: Items, ``{question, passages, label}`` dicts or ``(question, passages)``
    tuples (labels enable the F1 check); None uses a few built-in probe pairs.

    >>> export_bundle("runs/x/model", "/tmp/bundle", validation_items=[("Where is Paris?", ["Paris is in France."])])  # doctest: +SKIP
    PosixPath('/tmp/bundle')
    """
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification

    from suffice.serving.packing import ContextPacker, pad_packed
    from suffice.serving.runtime import OnnxClassifier, RuntimeConfig

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    pc = parity or ParityConfig()
    meta = read_model_meta(model_dir)
    if out_dir.exists() and not overwrite:
        raise ExportError(f"{out_dir} already exists: choose another --out or pass --overwrite")
    id2label = {int(k): str(v) for k, v in meta["id2label"].items()}
    items = [_as_pair(x, i) for i, x in enumerate(validation_items)] if validation_items else [(q, p, None) for q, p in PROBE_ITEMS]
    calib = meta.get("calibration") or {}
    task = meta["task"]
    default_th = {"sufficiency": {"sufficient": 0.8, "partial": 0.5}, "retrieval_gate": {"skip": 0.5}}.get(task, {})

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".suffice-export-", dir=out_dir.parent))
    try:
        merged = merged_model_dir(model_dir, meta, work)
        plain = export_onnx(merged, work)
        fp32_src, opt_desc = optimise_onnx(plain.parent, work) if optimize else (plain, "none (disabled)")
        bundle = work / "bundle"
        bundle.mkdir()
        shutil.copy(fp32_src, bundle / MODEL_FP32)
        shutil.copy(model_dir / TOKENIZER, bundle / TOKENIZER)
        quant_desc = quantise_onnx(bundle / MODEL_FP32, bundle / MODEL_INT8) if quantize else None

        # inputs exactly as serving builds them
        packer = ContextPacker(Tokenizer.from_file(str(model_dir / TOKENIZER)), max_length=int(meta["max_length"]),
                               strategy=str(meta.get("long_context_strategy", "select")))
        packed = [packer.pack(q, p) for q, p, _ in items]
        batches = [pad_packed(packed[i : i + pc.batch_size], packer.pad_id) for i in range(0, len(packed), pc.batch_size)]
        n_par = min(pc.parity_items, len(packed))
        par_batches = [pad_packed(packed[i : min(i + pc.batch_size, n_par)], packer.pad_id) for i in range(0, n_par, pc.batch_size)]

        # 1. fp32 ONNX vs PyTorch
        torch_model = AutoModelForSequenceClassification.from_pretrained(merged, torch_dtype=torch.float32).eval()
        with torch.inference_mode():
            ref = np.concatenate([torch_model(**{k: torch.from_numpy(v) for k, v in b.items()}).logits.numpy() for b in par_batches])
        del torch_model
        fp32_sess = _session(bundle / MODEL_FP32)
        fp32_par = _onnx_logits(fp32_sess, par_batches)
        diff = float(np.abs(fp32_par - ref).max())
        if diff > pc.atol:
            raise ParityError(f"fp32 ONNX logits differ from PyTorch by up to {diff:.3g} on {n_par} items (tolerance {pc.atol:g}): "
                              "the export or graph optimisation changed the model; try --no-optimize",
                              check="fp32_vs_torch", largest_difference=diff, tolerance=pc.atol)
        report: dict[str, Any] = {"fp32_vs_torch_max_abs_diff": diff, "fp32_vs_torch_items": n_par,
                                  "graph_optimization": opt_desc, "quantization": quant_desc}

        # 2. int8 vs fp32 on all validation items
        fp32_all = _onnx_logits(fp32_sess, batches)
        if quantize:
            int8_all = _onnx_logits(_session(bundle / MODEL_INT8), batches)
            d32, d8 = fp32_all.argmax(1), int8_all.argmax(1)
            agreement = float((d32 == d8).mean())
            report.update(int8_items=len(items), int8_agreement=agreement,
                          int8_max_abs_logit_diff=float(np.abs(int8_all - fp32_all).max()))
            if agreement < pc.min_agreement:
                raise ParityError(f"int8 decisions agree with fp32 on {agreement:.2%} of {len(items)} items (needs >= {pc.min_agreement:.0%}); "
                                  f"largest logit difference {report['int8_max_abs_logit_diff']:.3g}: ship fp32 only with --no-quantize",
                                  check="int8_agreement", largest_difference=pc.min_agreement - agreement, tolerance=1 - pc.min_agreement)
            labels = [lab for _, _, lab in items]
            if all(lab is not None for lab in labels) and len(id2label) == 2:
                pos = next(k for k, v in id2label.items() if v == meta["positive_label"])
                gold = np.array(labels)
                f1_32, f1_8 = _f1((d32 == pos).astype(int), gold), _f1((d8 == pos).astype(int), gold)
                report.update(f1_fp32=f1_32, f1_int8=f1_8)
                if f1_32 - f1_8 > pc.max_f1_drop:
                    raise ParityError(f"int8 F1 {f1_8:.4f} is {100 * (f1_32 - f1_8):.2f} points below fp32 {f1_32:.4f} (allowed {100 * pc.max_f1_drop:.2f}): "
                                      "ship fp32 only with --no-quantize", check="int8_f1", largest_difference=f1_32 - f1_8, tolerance=pc.max_f1_drop)

        # 3. manifest, then load it back with the serving code
        ml = meta.get("mlflow") or {}
        files = {name: sha256_file(bundle / name) for name in sorted(os.listdir(bundle))}
        manifest = BundleManifest(
            task=task, id2label=id2label, positive_label=str(meta["positive_label"]), max_length=int(meta["max_length"]),
            long_context_strategy=str(meta.get("long_context_strategy", "select")),
            temperature=float(calib.get("temperature", 1.0)), thresholds={**default_th, **(meta.get("thresholds") or {})},
            base_model=str(meta.get("base_model", "unknown")), files=files, label_scheme=str(meta.get("label_scheme", "binary")),
            int8_model_file=MODEL_INT8 if quantize else None, mlflow_run_id=ml.get("run_id"),
            registered_model=registered_model or ml.get("registered_model"),
            model_version=None if (model_version or ml.get("version")) is None else str(model_version or ml.get("version")),
            created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            parity=report, metrics=dict(meta.get("metrics") or {}),
        )
        write_manifest(bundle, manifest)
        served = OnnxClassifier(bundle, RuntimeConfig(precision="fp32"))
        back = np.concatenate([served.predict_packed(packed[i : min(i + pc.batch_size, n_par)])[0] for i in range(0, n_par, pc.batch_size)])
        rt = float(np.abs(back - fp32_par).max())
        if rt > pc.atol:
            raise ParityError(f"the written bundle's logits differ from the checked fp32 model by {rt:.3g}",
                              check="bundle_roundtrip", largest_difference=rt, tolerance=pc.atol)

        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(bundle, out_dir)
        log.info("bundle written to %s: %s", out_dir, json.dumps(report))
        return out_dir
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="suffice export", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="trained-model dir, models:/NAME/N, models:/NAME@alias or runs:/RUN/PATH")
    ap.add_argument("--out", required=True, help="bundle folder to write (must not exist unless --overwrite)")
    ap.add_argument("--validation-data", help="JSONL of items (question, passages, label); without it parity runs on 8 built-in probe pairs only")
    ap.add_argument("--split", default="validation", help="split to keep from --validation-data (default validation; 'all' keeps every row)")
    ap.add_argument("--no-quantize", action="store_true", help="write only the fp32 model")
    ap.add_argument("--no-optimize", action="store_true", help="skip onnxruntime transformer fusions")
    ap.add_argument("--parity-items", type=int, default=200)
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--min-agreement", type=float, default=0.99)
    ap.add_argument("--max-f1-drop", type=float, default=0.005)
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--register", action="store_true", help="log the bundle to the model's MLflow run and register it")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from suffice.training.registry import RegistryError, register_bundle, resolve_model_dir

    try:
        model_dir = resolve_model_dir(args.model)
        items = load_validation_jsonl(args.validation_data, None if args.split == "all" else args.split) if args.validation_data else None
        if items is None:
            print("export: no --validation-data given; parity is checked on built-in probe pairs only", file=sys.stderr)
        pc = ParityConfig(parity_items=args.parity_items, atol=args.atol, min_agreement=args.min_agreement, max_f1_drop=args.max_f1_drop)
        out = export_bundle(model_dir, args.out, items, quantize=not args.no_quantize, optimize=not args.no_optimize,
                            parity=pc, overwrite=args.overwrite)
    except ParityError as e:
        print(f"export failed parity check {e.check}: {e}", file=sys.stderr)
        return 3
    except (ExportError, RegistryError) as e:
        print(f"export failed: {e}", file=sys.stderr)
        return 2
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    print(json.dumps({"bundle": str(out), "parity": manifest["parity"],
                      "sizes_mb": {f: round((out / f).stat().st_size / 1e6, 2) for f in manifest["files"]}}, indent=2))
    if args.register:
        try:
            name, version = register_bundle(out)
        except RegistryError as e:
            print(f"export wrote {out} but registration failed: {e}", file=sys.stderr)
            return 2
        print(f"registered {out} as models:/{name}/{version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
