"""Experiment: which ops, kept in fp32, let ONNX Runtime dynamic int8 pass export's score-shift rule, and at what speed.

    python benchmarks/int8_exclusion_experiment.py BUNDLE PREPARED_DATA_DIR [--items 400]

For a bundle whose ONNX Runtime int8 export refused (mean calibrated score shift > 0.01), quantises the
bundle's fp32 graph with export's ``quantise`` under recipes that keep parts of the graph in fp32 (attention,
the last layers, the classifier head), then reports per recipe the mean / largest |calibrated P(positive)
change| against fp32 on the first ``--items`` validation rows of the prepared data (``datasets`` folder,
e.g. data/default) and the p50 at the bundle's window (one 256-token input, batch 1, 2 threads).
Writes nothing in the bundle; prints one JSON line per recipe.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("data", type=Path)
    ap.add_argument("--items", type=int, default=400)
    a = ap.parse_args()
    import onnx
    from datasets import load_from_disk

    from suffice.serving.cpu import detect
    from suffice.serving.packing import pad_packed
    from suffice.serving.runtime import OnnxClassifier, RuntimeConfig
    from suffice.training.export.steps import quantise

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from avx2_int8_levers import feeds, p50, session  # noqa: E402

    clf = OnnxClassifier(a.bundle, RuntimeConfig(backend="onnxruntime", precision="fp32", check_probe=False))
    packer, man = clf.packer_for(None), clf.manifest
    rows = load_from_disk(str(a.data))["validation"].select(range(a.items))
    packed = []
    for r in rows:
        ps = r["passages"]
        ps = ast.literal_eval(ps) if isinstance(ps, str) else ps
        packed.append(packer.pack(r["question"], ps))
    src = a.bundle / "model.onnx"
    names = [i.name for i in session(src, 2).get_inputs()]
    layers = sorted({n.name.split("/")[3] for n in onnx.load(str(src), load_external_data=False).graph.node
                     if n.name.startswith("/bert/encoder/layer.")}, key=lambda s: int(s.split(".")[1]))
    last = layers[-1]
    recipes = {
        "shipped (MatMul+Attention+Gather)": {},
        "MatMul only (attention fp32)": dict(op_types=("MatMul",)),
        "MatMul+Attention (embeddings fp32)": dict(op_types=("MatMul", "Attention")),
        f"shipped, {last} fp32": dict(exclude=(rf"/{last}/", rf"^Attention_{len(layers) - 1}$")),
        "shipped, attention + FFN output MatMuls fp32": dict(exclude=(r"/output/dense/MatMul",)),
        "shipped, FFN output MatMuls only fp32": dict(exclude=(r"/layer\.\d+/output/dense/MatMul",)),
        "shipped, attention output MatMuls only fp32": dict(exclude=(r"/attention/output/dense/MatMul",)),
        "shipped, pooler/classifier fp32": dict(exclude=(r"pooler", r"classifier")),
        "per-tensor": dict(per_channel=False),
    }
    work = Path(tempfile.mkdtemp(prefix="suffice-int8-excl-"))

    def scores(path: Path) -> np.ndarray:
        s = session(path, 2)
        out = []
        for i in range(0, len(packed), 32):
            chunk = packed[i:i + 32]
            batch = pad_packed(chunk, pad_id)
            logits = s.run(None, {k: batch[k] for k in names})[0]
            out.append(man.calibrator.probabilities(logits, man.positive_index)[:, man.positive_index])
        return np.concatenate(out)

    pad_id = clf.packer.pad_id
    ref = scores(src)
    f = feeds(256, names)
    cpu = detect()
    print(json.dumps({"recipe": "fp32", "p50_ms": round(p50(session(src, 2), f, 4)[0], 2), "cpu": cpu.model, "isa": cpu.isa_class,
                      "items": len(packed)}), flush=True)
    for i, (name, kw) in enumerate(recipes.items()):
        dst = work / f"int8_{i}.onnx"
        quantise(src, dst, **kw)
        d = np.abs(scores(dst) - ref)
        print(json.dumps({"recipe": name, "fp32_nodes": len(kw_nodes(src, kw)), "mean_shift": round(float(d.mean()), 4), "max_shift": round(float(d.max()), 3),
                          "passes_0.01": bool(d.mean() <= 0.01), "p50_ms": round(p50(session(dst, 2), f, 4)[0], 2)}), flush=True)


def kw_nodes(src: Path, kw: dict) -> list[str]:
    """The node names a recipe's ``exclude`` patterns keep in fp32 (as export's ``quantise`` matches them)."""
    import re

    import onnx

    pats = kw.get("exclude", ())
    return [n.name for n in onnx.load(str(src), load_external_data=False).graph.node if any(re.search(p, n.name) for p in pats)]


if __name__ == "__main__":
    main()
