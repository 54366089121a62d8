"""CPU detection: one function decides the ISA class; it can be fed any CPU's flags."""

from suffice.serving.cpu import AMX, AVX2, AVX512_VNNI, BASELINE, CpuInfo, detect, parse_cpuinfo

SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}
GENOA = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}
MILAN = {"avx2", "fma"}


def test_isa_class_by_flags():
    assert CpuInfo.from_flags("x", SAPPHIRE_RAPIDS).isa_class == AMX
    assert CpuInfo.from_flags("x", GENOA).isa_class == AVX512_VNNI
    assert CpuInfo.from_flags("x", MILAN).isa_class == AVX2
    assert CpuInfo.from_flags("x", {"sse4_2"}).isa_class == BASELINE
    # amx_tile alone (no bf16/int8 tile ops reported) is not enough for the AMX class
    assert CpuInfo.from_flags("x", {"amx_tile", "avx512_vnni"}).isa_class == AVX512_VNNI


def test_bf16_and_vnni():
    assert CpuInfo.from_flags("x", SAPPHIRE_RAPIDS).bf16 and CpuInfo.from_flags("x", SAPPHIRE_RAPIDS).vnni
    assert CpuInfo.from_flags("x", GENOA).bf16
    assert not CpuInfo.from_flags("x", MILAN).bf16 and not CpuInfo.from_flags("x", MILAN).vnni
    assert CpuInfo.from_flags("x", {"avx2", "avx_vnni"}).vnni


def test_parse_cpuinfo_reads_first_processor():
    text = "processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: avx2 amx_tile amx_bf16\n\nprocessor\t: 1\nmodel name\t: other\nflags\t: sse\n"
    model, flags = parse_cpuinfo(text)
    assert model == "Intel Xeon" and flags == {"avx2", "amx_tile", "amx_bf16"}


def test_detect_describes_this_machine():
    info = detect()
    assert info.isa_class in (AMX, AVX512_VNNI, AVX2, BASELINE)
    assert info.cores >= 1 and info.model
    assert info.isa_class in info.describe()
    assert set(info.as_dict()) == {"cpu_model", "isa_class", "bf16", "vnni", "cores"}


def test_mixed_precision_auto_picks_bf16_only_on_cpus_with_bf16_units(monkeypatch):
    import torch

    from suffice.training.fit.run import resolve_mixed_precision

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_mixed_precision("auto", CpuInfo.from_flags("x", SAPPHIRE_RAPIDS)) == "bf16"
    assert resolve_mixed_precision("auto", CpuInfo.from_flags("x", GENOA)) == "bf16"
    assert resolve_mixed_precision("auto", CpuInfo.from_flags("x", MILAN)) == "no"
    assert resolve_mixed_precision("no", CpuInfo.from_flags("x", SAPPHIRE_RAPIDS)) == "no"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # accelerate launch --mixed_precision bf16 chose
    assert resolve_mixed_precision("auto", CpuInfo.from_flags("x", MILAN)) is None
    # `accelerate launch` exports "no" whenever it was not told: its default, not a choice
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert resolve_mixed_precision("auto", CpuInfo.from_flags("x", SAPPHIRE_RAPIDS)) == "bf16"
    assert resolve_mixed_precision("no", CpuInfo.from_flags("x", SAPPHIRE_RAPIDS)) == "no"
