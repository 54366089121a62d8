"""Contrastive pairs in retrieval-gate training: both threads of a pair in one batch (the sampler),
each row's partner (the encoder), the pair ranking loss, and a tiny end-to-end run."""

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
from suffice.training.fit.encode import LengthGroupedSampler, partner_rows
from suffice.training.fit.run import features_for
from suffice.training.fit.pairs import PairRankingLoss

REPO = Path(__file__).resolve().parent.parent


def _batches(order: list[int], size: int) -> list[list[int]]:
    return [order[k:k + size] for k in range(0, len(order), size)]


@settings(max_examples=60, deadline=None)
@given(n_pairs=st.integers(0, 40), n_single=st.integers(0, 40), bs=st.sampled_from([2, 4, 8, 16]), seed=st.integers(0, 5),
       group=st.booleans())
def test_sampler_keeps_pairs_in_one_batch_and_batches_full(n_pairs, n_single, bs, seed, group):
    keys = [f"p{k}" for k in range(n_pairs) for _ in range(2)] + [""] * n_single
    lengths = [(7 * i) % 23 + 1 for i in range(len(keys))]
    sampler = LengthGroupedSampler(lengths, bs, seed, group, together=keys)
    order = list(sampler)
    assert sorted(order) == list(range(len(keys)))
    batches = _batches(order, bs)
    assert all(len(b) == bs for b in batches[:-1])
    where = {i: n for n, b in enumerate(batches) for i in b}
    split = [k for k in range(n_pairs) if where[2 * k] != where[2 * k + 1]]
    assert not split  # even batch sizes: single rows travel two by two, no pair is ever cut
    assert order == list(sampler)  # deterministic for a (seed, epoch)
    sampler.set_epoch(1)
    assert sorted(sampler) == sorted(order)


def test_sampler_without_keys_is_unchanged():
    """Runs without pairs keep their exact data order (reproducibility of earlier runs)."""
    lengths = [(5 * i) % 17 for i in range(100)]
    assert list(LengthGroupedSampler(lengths, 8, 3)) == list(LengthGroupedSampler(lengths, 8, 3, together=None))
    with pytest.raises(ValueError, match="together has 2 keys for 3 rows"):
        LengthGroupedSampler([1, 2, 3], 2, together=["a", "a"])


def test_partner_rows():
    assert partner_rows(["a", "", "b", "a", "b", None]) == [3, -1, 4, 0, 2, -1]
    assert partner_rows(["solo"]) == [-1]  # a pair whose partner was filtered out has none


def test_pair_ranking_loss_orders_skip_above_its_partner():
    loss = PairRankingLoss(weight=2.0, skip_id=1)
    batch = {"row": torch.tensor([5, 6, 7, 8]), "partner": torch.tensor([6, 5, 9, -1]), "labels": torch.tensor([1, 0, 1, 0])}
    right = SimpleNamespace(logits=torch.tensor([[0.0, 3.0], [0.0, -3.0], [0.0, 0.0], [0.0, 0.0]]))
    wrong = SimpleNamespace(logits=torch.tensor([[0.0, -3.0], [0.0, 3.0], [0.0, 0.0], [0.0, 0.0]]))
    # one complete pair (rows 5/6); row 7's partner 9 is not in the batch, row 8 has none
    assert float(loss(right, batch)) == pytest.approx(2.0 * float(torch.nn.functional.softplus(torch.tensor(-6.0))))
    assert float(loss(wrong, batch)) == pytest.approx(2.0 * float(torch.nn.functional.softplus(torch.tensor(6.0))))
    lonely = {"row": torch.tensor([1, 2]), "partner": torch.tensor([-1, -1]), "labels": torch.tensor([1, 0])}
    logits = torch.zeros(2, 2, requires_grad=True)
    zero = loss(SimpleNamespace(logits=logits), lonely)
    assert float(zero.detach()) == 0.0 and zero.requires_grad


def _pair(domain: str, k: int) -> list[dict]:
    prefix = [{"role": "user", "content": f"what do {domain} plans cost? ({k})"},
              {"role": "assistant", "content": f"Basic is ${k}, Pro is ${k + 10}."}]
    pid = f"{domain}-{k}"
    return [{"id": f"{pid}-s", "messages": [*prefix, {"role": "user", "content": "sort those by price"}], "label": "SKIP",
             "category": "sort_filter_existing", "domain": domain, "pair": pid},
            {"id": f"{pid}-r", "messages": [*prefix, {"role": "user", "content": f"what about gift cards for {domain}?"}],
             "label": "RETRIEVE", "category": "new_entity", "domain": domain, "pair": pid}]


def _gate_files(tmp_path: Path) -> tuple[Path, Path]:
    plain = [{k: v for k, v in r.items() if k not in ("domain", "pair")} | {"id": f"plain-{r['id']}"}
             for k in range(4) for r in _pair("shop", k)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in plain))
    pairs = [r for d in range(10) for k in range(3) for r in _pair(f"dom{d}", k)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    return tmp_path / "train.jsonl", tmp_path / "pairs.jsonl"


def test_config_checks_and_which_losses_run(tmp_path):
    cfg = build_train_config(REPO / "configs" / "retrieval-gate.yaml", ["--gate.pair_loss_weight=0.5"])
    assert cfg.gate.pair_batches and [(type(f).__name__, type(f.ranking).__name__) for f in features_for(cfg)] == [
        ("GatePairs", "PairRankingLoss")]
    batches_only = features_for(build_train_config(REPO / "configs" / "retrieval-gate.yaml", ["--gate.pair_loss_weight=0"]))
    assert [(type(f).__name__, f.ranking, f.columns) for f in batches_only] == [("GatePairs", None, ())]
    assert features_for(build_train_config(REPO / "configs" / "retrieval-gate.yaml", ["--gate.pair_loss_weight=0",
                                                                                      "--gate.pair_batches=false"])) == []
    with pytest.raises(ConfigError, match="needs gate.pair_batches=true"):
        build_train_config(REPO / "configs" / "retrieval-gate.yaml", ["--gate.pair_loss_weight=0.5", "--gate.pair_batches=false"])
    with pytest.raises(ConfigError, match="must be >= 0"):
        build_train_config(REPO / "configs" / "retrieval-gate.yaml", ["--gate.pair_loss_weight=-1"])


def test_tiny_gate_trains_with_pairs_together_and_the_ranking_loss(tiny_bert, tmp_path, monkeypatch):
    """A domains-split gate run: every batch that holds one thread of a complete pair holds the
    other too (no splits needed here: plenty of single threads), and the ranking loss joins the loss."""
    from suffice.training.fit import loop
    from suffice.training.fit.run import run

    train, pairs = _gate_files(tmp_path)
    seen = []
    original = loop.batch_loss

    def spy(model, batch, weight_t, features=()):
        seen.append((batch["row"].tolist(), batch["partner"].tolist(), [type(f).__name__ for f in features]))
        return original(model, batch, weight_t, features)

    monkeypatch.setattr(loop, "batch_loss", spy)
    cfg = build_train_config(REPO / "configs" / "retrieval-gate.yaml", [
        f"--gate.path={train}", f"--gate.pairs_path={pairs}", "--gate.split=domains", "--gate.pair_loss_weight=0.5",
        "--gate.validation_fraction=0.2", "--gate.test_fraction=0.2", f"--base_model={tiny_bert}", f"--output_dir={tmp_path / 'm'}",
        "--max_length=64", "--per_device_train_batch_size=4", "--num_train_epochs=1", "--lora.r=4", "--lora.alpha=8",
        "--torch_threads=1", "--tracking.enabled=false", "--evaluate_test=false", "--baselines=[]", "--early_stopping_patience=0",
    ])
    run(cfg)
    assert seen and all(names == ["GatePairs"] for _, _, names in seen)
    complete = 0
    for rows, partners, _ in seen:
        for p in partners:
            if p >= 0:
                assert p in rows, (rows, partners)
                complete += 1
    assert complete >= 4


def test_ranking_loss_without_pairs_warns_and_trains(tiny_bert, tmp_path, capsys):
    """Threads without pairs (the opening_message split of a user's own file): the shipped loss weight
    does not block training; the run says the loss adds nothing and how to switch it off."""
    from suffice.training.fit.run import run

    train, _ = _gate_files(tmp_path)
    cfg = build_train_config(REPO / "configs" / "retrieval-gate.yaml", [
        f"--gate.path={train}", "--gate.split=opening_message", "--gate.pair_loss_weight=0.5", "--gate.validation_fraction=0.25",
        "--gate.test_fraction=0.25", f"--base_model={tiny_bert}", f"--output_dir={tmp_path / 'm'}", "--max_length=64",
        "--tracking.enabled=false", "--torch_threads=1", "--baselines=[]", "--num_train_epochs=1", "--evaluate_test=false",
    ])
    run(cfg)
    out = capsys.readouterr().out
    assert "no train thread has a pair partner" in out and "gate.pair_loss_weight=0" in out
