import pytest

from suffice.training.paths import data_dir, resolve_base_model


def test_minilm_resolves_offline(minilm_dir):
    p = resolve_base_model("minilm-l6")
    assert (p / "tokenizer.json").is_file() and (p / "config.json").is_file()
    assert resolve_base_model("sentence-transformers/all-MiniLM-L6-v2") == p


def test_unknown_base_model_names_choices(monkeypatch):
    with pytest.raises(FileNotFoundError, match="unknown base_model 'minilm'.*minilm-l6"):
        resolve_base_model("minilm")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="hub is offline"):
        resolve_base_model("org/some-model")


def test_local_dir_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_base_model(str(tmp_path))


def test_data_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SUFFICE_DATA_DIR", str(tmp_path))
    assert data_dir(required=False) is None
    with pytest.raises(FileNotFoundError, match="SUFFICE_DATA_DIR"):
        data_dir()
    (tmp_path / "items.jsonl").write_text("")
    assert data_dir() == tmp_path.resolve()
