"""``suffice export``: merge, export to ONNX, optimise, quantise, check parity, write a bundle.

Export and parity are one step. The bundle is first assembled in a temporary folder next to
``--out``; only after every check passes is it moved into place, so a failed export leaves no
bundle behind. A failed check exits 3 naming the check and the largest difference.

    suffice export --model runs/2025-01-01/model --out bundles/sufficiency-v3 --validation-data data/validation.jsonl
    suffice export --model models:/suffice-sufficiency-model/3 --out bundles/v3 --register
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from suffice.serving.bundle import MANIFEST_NAME
from suffice.training.export.bundle import export_shipping_what_passes
from suffice.training.export.errors import ExportError, ParityConfig, ParityError
from suffice.training.export.validation import load_validation_jsonl


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="suffice export", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="trained-model dir, models:/NAME/N, models:/NAME@alias or runs:/RUN/PATH")
    ap.add_argument("--out", required=True, help="bundle folder to write (must not exist unless --overwrite)")
    ap.add_argument("--validation-data", help="JSONL of items (question, passages, label); without it parity runs on 8 built-in probe pairs only")
    ap.add_argument("--split", default="validation", help="split to keep from --validation-data (default validation; 'all' keeps every row)")
    ap.add_argument("--no-quantize", action="store_true", help="write only the fp32 model")
    ap.add_argument("--no-optimize", action="store_true", help="skip onnxruntime transformer fusions")
    ap.add_argument("--openvino-int8", choices=("auto", "on", "off"), default="auto",
                    help="also make an OpenVINO int8 model (NNCF, calibrated on the validation items): auto = when quantising and "
                         "nncf is installed (pip install 'suffice[openvino]'), on = required, off = never")
    ap.add_argument("--parity-items", type=int, default=200)
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--confident-margin", type=float, default=0.1,
                    help="int8: items whose fp32 score is at least this far from every threshold must keep their decision")
    ap.add_argument("--min-confident-agreement", type=float, default=0.99, help="int8: decision agreement needed on those items")
    ap.add_argument("--max-mean-score-shift", type=float, default=0.01, help="int8: allowed mean |calibrated score change|")
    ap.add_argument("--max-metric-drop", type=float, default=0.005, help="int8: allowed macro-F1 / AUROC drop (0.005 = 0.5 point)")
    ap.add_argument("--min-agreement", type=float, default=0.99, help="int8 argmax agreement for models with more than two labels")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--register", action="store_true", help="log the bundle to the model's MLflow run and register it")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from suffice.training.export.registry import RegistryError, register_bundle, resolve_model_dir

    try:
        model_dir = resolve_model_dir(args.model)
        items = load_validation_jsonl(args.validation_data, None if args.split == "all" else args.split) if args.validation_data else None
        if items is None:
            print("export: no --validation-data given; parity is checked on built-in probe pairs only", file=sys.stderr)
        pc = ParityConfig(parity_items=args.parity_items, atol=args.atol, confident_margin=args.confident_margin,
                          min_confident_agreement=args.min_confident_agreement, max_mean_score_shift=args.max_mean_score_shift,
                          max_metric_drop=args.max_metric_drop, min_agreement=args.min_agreement)
        # a refused ONNX Runtime int8 model leaves fp32 and the OpenVINO int8 model (checked on its own), as in training
        out, refused = export_shipping_what_passes(model_dir, args.out, items, quantize=not args.no_quantize, optimize=not args.no_optimize,
                                                   parity=pc, overwrite=args.overwrite,
                                                   openvino_int8={"auto": None, "on": True, "off": False}[args.openvino_int8])
        if refused:
            print(f"export: ONNX Runtime int8 refused by its parity check ({refused}); the bundle ships without it", file=sys.stderr)
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
