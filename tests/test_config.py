from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from suffice.training.config import ConfigError, build_config, flatten, config_to_dict, parse_overrides


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
