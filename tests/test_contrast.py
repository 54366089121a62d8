"""Questions over one passage side by side in sufficiency training (``contrast``): the units
(:func:`group_units`), the group ranking loss, the config checks and a tiny end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from suffice.serving.config import ConfigError
from suffice.training.fit.config import build_train_config
from suffice.training.fit.run import features_for
from suffice.training.fit.pairs import GroupRankingLoss, group_units, ranking_loss

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "train20.jsonl"


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from(["", "a", "b", "c", "d"]), st.integers(0, 1)), max_size=60),
       size=st.integers(2, 6), seed=st.integers(0, 3))
def test_units_hold_one_group_mixed_classes_and_at_most_size_rows(rows, size, seed):
    groups, labels = [g for g, _ in rows], [y for _, y in rows]
    units = group_units(groups, labels, size, positive_id=1, seed=seed)
    assert len(units) == len(rows) and units == group_units(groups, labels, size, positive_id=1, seed=seed)
    members: dict[int, list[int]] = {}
    for i, u in enumerate(units):
        if u >= 0:
            members.setdefault(u, []).append(i)
    assert sorted(members) == list(range(len(members)))  # ids are dense
    for rows_ in members.values():
        assert 2 <= len(rows_) <= size
        assert len({groups[i] for i in rows_}) == 1 and groups[rows_[0]]
    for g in set(groups) - {""}:
        in_g = [i for i, x in enumerate(groups) if x == g]
        mixed = len({labels[i] for i in in_g}) == 2
        covered = [i for i in in_g if units[i] >= 0]
        if not mixed:
            assert not covered  # nothing to contrast
        else:  # every row but at most one leftover is in a unit, and the first unit holds both classes
            assert len(covered) >= len(in_g) - 1
            first = min(units[i] for i in covered)
            assert {labels[i] for i in members[first]} == {0, 1}
    assert all(units[i] == -1 for i, g in enumerate(groups) if not g)


def test_group_ranking_loss_ranks_sufficient_above_insufficient_within_a_unit():
    loss = GroupRankingLoss(weight=2.0, positive_id=1)
    logits = torch.tensor([[0.0, 1.0], [0.0, 3.0], [0.0, 0.0], [0.0, -5.0]], requires_grad=True)
    batch = {"unit": torch.tensor([0, 0, 1, 1]), "labels": torch.tensor([1, 0, 1, 0])}
    value = loss(SimpleNamespace(logits=logits), batch)
    # unit 0: sufficient margin 1 below its insufficient 3 -> softplus(2); unit 1: 0 vs -5 -> softplus(-5)
    expected = 2.0 * (torch.nn.functional.softplus(torch.tensor(2.0)) + torch.nn.functional.softplus(torch.tensor(-5.0))) / 2
    assert torch.isclose(value, expected)
    value.backward()
    assert logits.grad[0, 1] < 0 < logits.grad[1, 1]  # push the sufficient row up, the insufficient one down
    # across units nothing is compared; a unit of one class adds nothing
    alone = {"unit": torch.tensor([0, 1, 2, -1]), "labels": torch.tensor([1, 0, 1, 0])}
    assert float(loss(SimpleNamespace(logits=logits.detach()), alone)) == 0.0


def test_pair_and_group_losses_share_one_ranking():
    """The gate's pair loss is the group loss over units of two."""
    from suffice.training.fit.pairs import PairRankingLoss

    logits = torch.tensor([[0.3, 1.0], [0.1, -0.4], [2.0, 0.0], [0.0, 0.5]])
    labels = torch.tensor([1, 0, 0, 1])
    pair = PairRankingLoss(1.0, 1)(SimpleNamespace(logits=logits), {"row": torch.arange(4), "partner": torch.tensor([1, 0, 3, 2]),
                                                                     "labels": labels})
    group = GroupRankingLoss(1.0, 1)(SimpleNamespace(logits=logits), {"unit": torch.tensor([0, 0, 1, 1]), "labels": labels})
    assert torch.isclose(pair, group)
    same = torch.tensor([[True, True], [True, True]])
    assert float(ranking_loss(torch.tensor([[0.0, 1.0], [0.0, 1.0]]), torch.tensor([1, 1]), same, 1)) == 0.0


def test_config_checks():
    cfg = build_train_config(REPO / "configs" / "sufficiency.yaml", ["--contrast.unit_size=4", "--contrast.loss_weight=0.5"])
    assert [(type(f).__name__, type(f.ranking).__name__) for f in features_for(cfg)] == [("PassageContrast", "GroupRankingLoss")]
    units_only = features_for(build_train_config(REPO / "configs" / "sufficiency.yaml", ["--contrast.unit_size=4"]))
    assert [(type(f).__name__, f.ranking, f.columns) for f in units_only] == [("PassageContrast", None, ())]
    assert features_for(build_train_config(REPO / "configs" / "sufficiency.yaml", [])) == []
    bad = {
        "--contrast.unit_size=1": "must be 0 \\(off\\) or >= 2",
        "--contrast.loss_weight=0.5": "needs contrast.unit_size >= 2",
        "--contrast.loss_weight=-1": "must be >= 0",
    }
    for arg, msg in bad.items():
        with pytest.raises(ConfigError, match=msg):
            build_train_config(REPO / "configs" / "sufficiency.yaml", [arg])
    with pytest.raises(ConfigError, match="a unit must fit one batch; lower contrast.unit_size"):
        build_train_config(REPO / "configs" / "sufficiency.yaml", ["--contrast.unit_size=32"])
    with pytest.raises(ConfigError, match="use --label_scheme=binary"):
        build_train_config(REPO / "configs" / "sufficiency.yaml", ["--contrast.unit_size=4", "--contrast.loss_weight=1",
                                                                   "--label_scheme=three_level"])
    with pytest.raises(ConfigError, match="applies to task=sufficiency"):
        build_train_config(REPO / "configs" / "retrieval-gate.yaml", ["--contrast.unit_size=2"])


def _grouped_file(tmp_path: Path) -> Path:
    """The fixture with its train items in four passage groups of mixed labels."""
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
    train = [r for r in rows if r["split"] == "train"]
    for k, r in enumerate(train):
        r["group"] = f"fixture:grouped{k % 4}"
    out = tmp_path / "grouped.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_tiny_run_keeps_units_in_one_batch_and_adds_the_loss(tiny_bert, tmp_path, monkeypatch, capsys):
    from suffice.training.fit import loop
    from suffice.training.fit.run import run

    data = _grouped_file(tmp_path)
    seen = []
    original = loop.batch_loss

    def spy(model, batch, weight_t, features=()):
        seen.append((batch["unit"].tolist(), batch["labels"].tolist(), [type(f).__name__ for f in features]))
        return original(model, batch, weight_t, features)

    monkeypatch.setattr(loop, "batch_loss", spy)
    cfg = build_train_config(None, [
        f"--train_file={data}", f"--base_model={tiny_bert}", f"--output_dir={tmp_path / 'm'}", "--max_length=64",
        "--per_device_train_batch_size=4", "--num_train_epochs=1", "--lora.r=4", "--lora.alpha=8", "--torch_threads=1",
        "--tracking.enabled=false", "--evaluate_test=false", "--baselines=[]", "--early_stopping_patience=0",
        "--contrast.unit_size=2", "--contrast.loss_weight=1.0",
    ])
    run(cfg)
    assert "contrast:" in capsys.readouterr().out
    assert seen and all(names == ["PassageContrast"] for _, _, names in seen)
    whole = [u for units, _, _ in seen for u in set(units) if u >= 0 and units.count(u) == 2]
    assert whole, seen  # units of two travel together
    for units, _, _ in seen:
        assert all(units.count(u) <= 2 for u in units if u >= 0)


def test_contrast_without_mixed_groups_warns_and_trains(tiny_bert, tmp_path, capsys):
    """Items without a group (each its own) give no unit: the run says so and how to switch it off."""
    from suffice.training.fit.run import run

    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
    for r in rows:
        r.pop("group", None)
    data = tmp_path / "nogroup.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build_train_config(None, [
        f"--train_file={data}", f"--base_model={tiny_bert}", f"--output_dir={tmp_path / 'm'}", "--max_length=64",
        "--per_device_train_batch_size=4", "--num_train_epochs=1", "--torch_threads=1", "--tracking.enabled=false",
        "--evaluate_test=false", "--baselines=[]", "--contrast.unit_size=2", "--contrast.loss_weight=1",
    ])
    run(cfg)
    out = capsys.readouterr().out
    assert "contrast: 0 units" in out and "--contrast.unit_size=0" in out
