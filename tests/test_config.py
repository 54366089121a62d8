from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from suffice.serving.config import ConfigError, build_config, config_to_dict, flatten, parse_overrides


@dataclass
class Inner:
    r: int = 16
    targets: list[str] = field(default_factory=lambda: ["query", "value"])


@dataclass
class Outer:
    lr: float = 1e-3
    epochs: int = 1
    mode: Literal["lora", "full"] = "lora"
    name: Optional[str] = None
    use_x: bool = False
    lora: Inner = field(default_factory=Inner)

    def __post_init__(self):
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")


def test_defaults_yaml_and_overrides(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("lr: 0.01\nlora:\n  r: 4\n")
    cfg = build_config(Outer, y, ["--epochs=3", "--lora.targets=query,key", "--use_x=true", "--name=none"])
    assert cfg.lr == 0.01 and cfg.epochs == 3 and cfg.lora.r == 4
    assert cfg.lora.targets == ["query", "key"] and cfg.use_x is True and cfg.name is None
    assert flatten(config_to_dict(cfg))["lora.r"] == 4


@pytest.mark.parametrize(
    "override, needle",
    [
        ("--epoch=3", "unknown config key(s) ['epoch']"),
        ("--lora.rank=3", "['lora.rank']"),
        ("--epochs=three", "epochs must be an integer"),
        ("--mode=half", "choose one of ['lora', 'full']"),
        ("--use_x=maybe", "use_x must be true or false"),
        ("--lr=-1", "lr must be > 0"),
        ("epochs=3", "must look like --key=value"),
    ],
)
def test_bad_overrides_name_the_key(override, needle):
    with pytest.raises(ConfigError) as e:
        build_config(Outer, None, [override])
    assert needle in str(e.value)


def test_bad_yaml_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        build_config(Outer, tmp_path / "missing.yaml")
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        build_config(Outer, p)


def test_parse_overrides_nested():
    assert parse_overrides(["--a.b.c=1", "--d-e=x"]) == {"a": {"b": {"c": "1"}}, "d_e": "x"}


# -- one engine for `suffice train` and `suffice serve` --------------------------------------
def test_training_config_module_reexports_the_engine():
    import suffice.serving.config as engine
    import suffice.serving.config as shim

    for name in engine.__all__:
        assert getattr(shim, name) is getattr(engine, name)


def test_serve_overrides_are_typed_by_field_like_train():
    from suffice.serving.service.config import load_service_config

    cfg = load_service_config(None, ["--server.port=9000", "--sufficient-context.decline-insufficient=off",
                                     "--limits.max_body_bytes=2_048", "--sufficient_context.caveat=yes", "--retrieval_gate.bundle=null",
                                     "--retriever.options={corpus: c.jsonl}", "--sufficient_context.thresholds.partial=0.4"])
    assert cfg.server.port == 9000 and cfg.sufficient_context.decline_insufficient is False
    assert cfg.limits.max_body_bytes == 2048 and cfg.sufficient_context.caveat == "yes"  # a string field keeps the text
    assert cfg.retrieval_gate.bundle is None and cfg.retriever.options == {"corpus": "c.jsonl"}
    assert cfg.sufficient_context.thresholds.partial == 0.4
    section = load_service_config(None, ["--sufficient_context.thresholds={sufficient: 0.7, partial: 0.4}"])
    assert (section.sufficient_context.thresholds.sufficient, section.sufficient_context.thresholds.partial) == (0.7, 0.4)


@pytest.mark.parametrize("override, needle", [
    ("--limits.queue=8", "unknown config key(s) ['limits.queue']"),
    ("--server.port=eighty", "server.port must be an integer"),
    ("--sufficient_context.enabled=maybe", "sufficient_context.enabled must be true or false"),
    ("--limits.queue_size=0", "limits: queue_size=0 must be >= 1"),
    ("limits.queue_size=3", "must look like --key=value"),
])
def test_serve_override_errors_match_train(override, needle):
    from suffice.serving.service.config import ServiceConfigError, load_service_config

    with pytest.raises(ServiceConfigError) as e:
        load_service_config(None, [override])
    assert needle in str(e.value)
    assert isinstance(e.value, ConfigError)


def test_service_context_gate_is_the_gate_config_with_the_max_docs_key(tmp_path):
    from suffice.serving.gates import ContextGateConfig
    from suffice.serving.service.config import ServiceConfigError, load_service_config

    p = tmp_path / "service.yaml"
    p.write_text("context_gate: {max_docs: 3, budget_tokens: 200}\n")
    cfg = load_service_config(p, ["--context_gate.relevance_threshold=0.2"])
    assert cfg.context_gate == ContextGateConfig(budget_tokens=200, doc_cap=3, relevance_threshold=0.2)
    assert load_service_config(None, ["--context-gate.max-docs=2"]).context_gate.doc_cap == 2
    with pytest.raises(ServiceConfigError, match=r"max_docs=65 must be in \[0, 64\]"):
        load_service_config(None, ["--context_gate.max_docs=65"])
    assert load_service_config(p, ["--context_gate.doc_cap=4"]).context_gate.doc_cap == 4  # the override wins
    with pytest.raises(ServiceConfigError, match="not both"):
        load_service_config(None, ["--context_gate.max_docs=2", "--context_gate.doc_cap=3"])
