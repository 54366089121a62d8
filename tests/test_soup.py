"""``suffice soup``: weight averaging of fine-tuned models (greedy and uniform), the soup's model
directory, MLflow run and registered version, and the errors for ingredients that cannot be averaged."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from suffice.training.fit.soup import SoupError, SoupRecipe, average, greedy_soup, main, soup
from suffice.training.fit.run import run

from test_train import tiny_config

torch = pytest.importorskip("torch")


def test_average_is_the_elementwise_mean_and_copies_integer_buffers():
    a = {"w": torch.tensor([1.0, 2.0]), "ids": torch.tensor([0, 1, 2])}
    b = {"w": torch.tensor([3.0, 6.0]), "ids": torch.tensor([0, 1, 2])}
    c = {"w": torch.tensor([5.0, 1.0]), "ids": torch.tensor([0, 1, 2])}
    out = average([a, b, c])
    assert torch.allclose(out["w"], torch.tensor([3.0, 3.0]))
    assert out["ids"].dtype == torch.int64 and out["ids"].tolist() == [0, 1, 2]


def test_greedy_soup_keeps_only_ingredients_that_do_not_hurt_validation():
    states = [{"w": torch.tensor([v])} for v in (1.0, 3.0, 100.0)]

    def score(state):  # best when the averaged weight is near 2
        return -abs(float(state["w"][0]) - 2.0)

    kept, best, trace = greedy_soup([0, 1, 2], states, score, "macro_f1", score(states[0]))
    assert kept == [0, 1]  # mean(1, 3) = 2 beats either alone; adding 100 would ruin it
    assert [t["kept"] for t in trace] == [True, True, False]
    assert best == pytest.approx(0.0)


def test_greedy_soup_leaves_out_a_harmful_ingredient_and_honours_loss_direction():
    states = [{"w": torch.tensor([v])} for v in (2.0, 5.0, 2.2)]

    def loss(state):
        return abs(float(state["w"][0]) - 2.0)

    kept, best, trace = greedy_soup([0, 2, 1], states, loss, "loss", loss(states[0]))
    assert kept == [0]  # averaging 2.0 with 2.2 (loss 0.1) or 5.0 only raises the loss
    assert [t["kept"] for t in trace] == [True, False, False]
    assert best == 0.0


@pytest.fixture(scope="module")
def ingredients(tiny_bert_dir, tmp_path_factory):
    """Two tiny LoRA models from the same base (different seeds) and one with a different window."""
    root = tmp_path_factory.mktemp("soup-ingredients")
    common = ("--num_train_epochs=1", "--tracking.enabled=false", "--baselines=[]")
    for name, extra in (("a", ("--seed=1",)), ("b", ("--seed=2", "--learning_rate=3e-3")), ("w", ("--seed=3", "--max_length=48"))):
        run(tiny_config(tiny_bert_dir, root / name, *common, *extra))
    return root


def _weights(path: Path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_uniform_soup_is_the_mean_of_its_ingredients_and_is_tracked_and_registered(ingredients, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from suffice.training.fit.model import load_model_dir

    out = tmp_path / "soup"
    summary = soup([str(ingredients / "a"), str(ingredients / "b")], out, SoupRecipe("uniform"), overrides=["--tracking.enabled=true"])
    wa, wb, ws = _weights(ingredients / "a"), _weights(ingredients / "b"), _weights(out)
    for k in ("classifier.weight", "bert.encoder.layer.0.attention.self.query.weight"):
        assert torch.allclose(ws[k], (wa[k] + wb[k]) / 2, atol=1e-6), k
    assert not torch.allclose(wa["classifier.weight"], wb["classifier.weight"])  # the two really differ

    model, meta = load_model_dir(out)  # a trained-model directory like any other
    assert meta["finetune"] == "soup" and meta["soup"]["method"] == "uniform"
    assert [i["kept"] for i in meta["soup"]["ingredients"]] == [True, True]
    assert meta["calibration"]["temperature"] > 0 and meta["thresholds"] == {"sufficient": 0.8, "partial": 0.5}
    assert "macro_f1" in meta["metrics"]["test"]
    assert not (out / "adapter").exists()

    uri = os.environ["MLFLOW_TRACKING_URI"]  # this test's store (mlflow keeps a process-wide URI once set)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    r = client.get_run(summary["mlflow_run_id"])
    assert r.data.params["method"] == "uniform" and r.data.params["ingredients"] == "2"
    for key in ("ingredient_0_val_macro_f1", "ingredient_1_val_source_macro_f1", "val_macro_f1", "val_temperature", "test_macro_f1"):
        assert key in r.data.metrics, key
    assert r.data.tags["finetune"] == "soup"
    assert summary["registered_model_dir"] == "models:/suffice-sufficiency-model/1" and "registered" not in summary  # no bundle: nothing servable
    mv = client.get_model_version("suffice-sufficiency-model", "1")
    assert mv.tags["finetune"] == "soup" and mv.run_id == r.info.run_id
    assert "soup of" in capsys.readouterr().out


def test_greedy_soup_records_its_ingredients_scores_and_trace(ingredients, tmp_path, monkeypatch):
    import suffice.training.fit.soup as soup_mod

    monkeypatch.setattr(soup_mod, "better_or_equal", lambda metric, value, best: True)  # every average "helps"
    out = tmp_path / "greedy"
    summary = soup([str(ingredients / "a"), str(ingredients / "b")], out, SoupRecipe(metric="auroc"), overrides=["--tracking.enabled=false"])
    meta = json.loads((out / "suffice_model.json").read_text())
    assert meta["soup"]["method"] == "greedy" and meta["soup"]["metric"] == "auroc"
    assert [i["kept"] for i in meta["soup"]["ingredients"]] == [True, True]
    assert all(0.0 <= i["validation_auroc"] <= 1.0 for i in meta["soup"]["ingredients"])
    assert [t["kept"] for t in meta["soup"]["trace"]] == [True, True]
    assert summary["kept"] == [str(ingredients / "a"), str(ingredients / "b")]


def test_greedy_soup_of_one_surviving_ingredient_writes_nothing(ingredients, tmp_path, monkeypatch, capsys):
    import suffice.training.fit.soup as soup_mod

    monkeypatch.setattr(soup_mod, "better_or_equal", lambda metric, value, best: False)  # every average "hurts"
    out = tmp_path / "none"
    summary = soup([str(ingredients / "a"), str(ingredients / "b")], out, overrides=["--tracking.enabled=true"])
    assert summary["output_dir"] is None and len(summary["kept"]) == 1 and not out.exists()
    assert "nothing written" in capsys.readouterr().out
    from mlflow.tracking import MlflowClient

    uri = os.environ["MLFLOW_TRACKING_URI"]
    assert not MlflowClient(tracking_uri=uri, registry_uri=uri).search_registered_models()  # no duplicate version registered


def test_soup_exports_a_bundle(ingredients, tmp_path):
    from suffice.serving.bundle import read_manifest

    out = tmp_path / "exported"
    summary = soup([str(ingredients / "a"), str(ingredients / "b")], out, SoupRecipe("uniform"),
                   overrides=["--tracking.enabled=false", "--export=true"])
    assert summary["bundle"] and read_manifest(Path(summary["bundle"])).task == "sufficiency"


def test_ingredients_that_cannot_be_averaged_are_refused_with_the_reason(ingredients, tmp_path, tiny_bert_dir):
    a, b, w = (str(ingredients / n) for n in "abw")
    with pytest.raises(SoupError, match="max_length.*leave one of them out"):
        soup([a, w], tmp_path / "x")
    with pytest.raises(SoupError, match="at least two"):
        soup([a], tmp_path / "x")
    with pytest.raises(SoupError, match="same directory twice"):
        soup([a, a], tmp_path / "x")
    with pytest.raises(SoupError, match="is one of the ingredients"):
        soup([a, b], a)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(SoupError, match="--overwrite"):
        soup([a, b], tmp_path / "full")
    with pytest.raises(SoupError, match="--method"):
        soup([a, b], tmp_path / "x", SoupRecipe("mean"))
    with pytest.raises(SoupError, match="--metric"):
        soup([a, b], tmp_path / "x", SoupRecipe(metric="f2"))
    shallow = tmp_path / "shallow"
    run(tiny_config(tiny_bert_dir, shallow, "--num_train_epochs=1", "--tracking.enabled=false", "--baselines=[]",
                    "--encoder_layers=1", "--evaluate_test=false"))
    with pytest.raises(SoupError, match="different parameters.*encoder_layers"):
        soup([a, str(shallow)], tmp_path / "x")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "suffice.json").write_text("{}")
    with pytest.raises(SoupError, match="exported bundle"):
        soup([a, str(bundle)], tmp_path / "x")
    assert not (tmp_path / "x").exists()  # nothing written for a refused soup


def test_cli_names_the_problem_and_exits_2(ingredients, tmp_path, capsys):
    assert main(["--models", str(ingredients / "a"), str(ingredients / "w"), "--output_dir", str(tmp_path / "x")]) == 2
    assert "differ in max_length" in capsys.readouterr().err
    assert main(["--models", str(ingredients / "a"), str(tmp_path / "missing"), "--output_dir", str(tmp_path / "x")]) == 2
    assert "no such directory" in capsys.readouterr().err
