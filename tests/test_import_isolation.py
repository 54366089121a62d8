"""``import suffice.serving`` pulls in no torch / transformers / peft / mlflow, and scores without them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from serving_support import make_model_dir

HEAVY = ("torch", "transformers", "peft", "mlflow", "optimum", "accelerate", "datasets")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_import_serving_loads_no_heavy_modules():
    p = _run(f"""
        import sys, json
        import suffice.serving
        from suffice.serving import SufficiencyScorer, ContextGate, SafetyGate, SelectiveAnswerer, RetrievalGate
        print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
    """)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


def test_scores_with_torch_import_blocked(tiny_bert_dir, tmp_path):
    pytest.importorskip("optimum")
    from suffice.training.export import export_bundle

    bundle = export_bundle(make_model_dir(tiny_bert_dir, tmp_path / "model", lora=False), tmp_path / "bundle")
    p = _run(f"""
        import sys, json
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {HEAVY!r}:
                    raise ImportError(f"blocked import of {{name}}")
                return None
        sys.meta_path.insert(0, Block())
        try:
            import torch
            raise SystemExit("torch import was not blocked")
        except ImportError:
            pass
        from suffice.serving import SufficiencyScorer, SafetyGate
        scorer = SufficiencyScorer.load({str(bundle)!r})
        r = scorer.score("Where is the Eiffel Tower?", [{{"title": "Paris", "text": "The Eiffel Tower is in Paris."}}])
        g = SafetyGate(scorer).check("Where is the Eiffel Tower?", [{{"text": "The Eiffel Tower is in Paris. " * 5, "score": 0.9}}])
        print(json.dumps({{"level": r.level, "score": r.score, "gate": g.should_reject,
                          "heavy": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
    """)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["level"] in ("sufficient", "partial", "insufficient") and 0 <= out["score"] <= 1 and out["heavy"] == []
