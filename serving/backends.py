"""Which model variant runs, and the inference engines that run it: ONNX Runtime everywhere, OpenVINO where it is faster.

A bundle holds ``model.onnx`` (fp32), ``model.int8.onnx`` (ONNX Runtime dynamic int8) and
``model.int8.xml`` (OpenVINO int8, NNCF) when export's int8 rule accepted them. OpenVINO (the
optional extra ``suffice[openvino]``) runs the int8 IR and reads the same ``model.onnx`` to run it
in fp32, or in bf16 on CPUs with AMX or AVX-512 BF16. :func:`rank_variants` orders what the bundle holds and the CPU supports,
fastest first, from the CPU's ISA class (``suffice.serving.cpu``), not from a timing race at
start-up; the runtime takes the first variant that reproduces the bundle's parity probe.

>>> from suffice.serving.cpu import CpuInfo
>>> amx = CpuInfo.from_flags("Xeon", {"avx2", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"})
>>> [v.name for v in rank_variants("model.onnx", "model.int8.onnx", amx, openvino=True, openvino_int8_model_file="model.int8.xml")]
['openvino-int8', 'openvino-bf16', 'onnxruntime-int8', 'openvino-fp32', 'onnxruntime-fp32']
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from suffice.serving.cpu import AMX, AVX2, AVX512_VNNI, CpuInfo

BACKENDS = ("auto", "onnxruntime", "openvino")
PRECISIONS = ("auto", "int8", "fp32", "bf16")
ONNXRUNTIME, OPENVINO = BACKENDS[1:]
OPENVINO_INSTALL = "pip install 'suffice[openvino]'"


class BackendUnavailableError(ImportError):
    """The requested inference backend is not installed or cannot run on this CPU."""


@dataclass(frozen=True)
class Variant:
    """One way to run a bundle: an engine, a precision and the bundle file it reads."""

    backend: str
    precision: str
    model_file: str

    @property
    def name(self) -> str:
        return f"{self.backend}-{self.precision}"


def openvino_available() -> bool:
    return importlib.util.find_spec("openvino") is not None


def _speed_order(cpu: CpuInfo) -> list[tuple[str, str]]:
    """(backend, precision) fastest first for a CPU.

    OpenVINO int8 (the bundle's NNCF model, where export made one that passed the int8 rule) comes
    first on CPUs with int8 dot products: on the idle-ish AMD EPYC (AVX-512 VNNI + BF16, no AMX; 2
    threads, batch 1, 256 tokens, one run of benchmarks/bench_quantization.py,
    benchmarks/results/2026-11-28/int8_recipes.json) 13.6 ms against 16.6 for ONNX Runtime int8 and
    35.7 for ONNX Runtime fp32. On AMX it is ranked first unmeasured (AMX has int8 tiles; the issue's
    Sapphire Rapids table had OpenVINO bf16 at 9.4 ms vs ONNX Runtime int8 13.7), OpenVINO bf16 next.
    With AVX-512 BF16 but no AMX (Zen 4, this project's AMD EPYC) ONNX Runtime int8 is next and
    OpenVINO bf16 after it, ahead of both fp32 engines: measured on the idle EPYC
    (bench_scorer_idle.json) int8 8.4 / 18.7 / 43.5 ms vs bf16 10.4 / 20.0 / 44.0 ms at 128 / 256 / 512
    tokens, fp32 ORT 18.8 / 38.8 / 79.0. On AVX2 (no VNNI; unmeasured for OpenVINO int8) ONNX Runtime
    int8 with reduce_range weights stays first. OpenVINO fp32 beat ONNX Runtime fp32 by 1.06-1.12x on
    the idle EPYC. Every variant must still reproduce the bundle's parity probe on the serving CPU.
    """
    if cpu.isa_class == AMX and cpu.bf16:
        return [(OPENVINO, "int8"), (OPENVINO, "bf16"), (ONNXRUNTIME, "int8"), (OPENVINO, "fp32"), (ONNXRUNTIME, "fp32")]
    if cpu.bf16:
        return [(OPENVINO, "int8"), (ONNXRUNTIME, "int8"), (OPENVINO, "bf16"), (OPENVINO, "fp32"), (ONNXRUNTIME, "fp32")]
    if cpu.isa_class in (AMX, AVX512_VNNI):
        return [(OPENVINO, "int8"), (ONNXRUNTIME, "int8"), (OPENVINO, "fp32"), (ONNXRUNTIME, "fp32")]
    if cpu.isa_class == AVX2:
        return [(ONNXRUNTIME, "int8"), (OPENVINO, "int8"), (OPENVINO, "fp32"), (ONNXRUNTIME, "fp32")]
    return [(ONNXRUNTIME, "int8"), (ONNXRUNTIME, "fp32"), (OPENVINO, "int8"), (OPENVINO, "fp32")]


def rank_variants(model_file: str, int8_model_file: str | None, cpu: CpuInfo, *, backend: str = "auto",
                  precision: str = "auto", openvino: bool | None = None,
                  openvino_int8_model_file: str | None = None) -> list[Variant]:
    """The variants to try, fastest first: what the bundle holds, the CPU supports and the config allows.

    Raises :class:`BackendUnavailableError` when ``backend='openvino'`` is asked for but not installed,
    ``ValueError`` when nothing is left (e.g. ``precision='bf16'`` on a CPU without bf16 units).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {list(BACKENDS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {list(PRECISIONS)}")
    has_ov = openvino_available() if openvino is None else openvino
    if backend == OPENVINO and not has_ov:
        raise BackendUnavailableError(f"backend='openvino' but OpenVINO is not installed: {OPENVINO_INSTALL}, or use backend='auto'")
    files = {(ONNXRUNTIME, "fp32"): model_file, (ONNXRUNTIME, "int8"): int8_model_file, (OPENVINO, "fp32"): model_file,
             (OPENVINO, "bf16"): model_file, (OPENVINO, "int8"): openvino_int8_model_file}
    out = []
    for be, prec in _speed_order(cpu):
        if (backend != "auto" and be != backend) or (precision != "auto" and prec != precision):
            continue
        if be == OPENVINO and not has_ov:
            continue
        if files[(be, prec)]:
            out.append(Variant(be, prec, files[(be, prec)]))
    if not out:
        why = (f"the bundle has no int8 model (use precision='fp32' or 'auto', or re-export with quantisation)" if precision == "int8"
               else f"{cpu.describe()} has no bf16 units (AMX or AVX-512 BF16) or OpenVINO is missing ({OPENVINO_INSTALL})" if precision == "bf16"
               else "choose another backend or precision")
        raise ValueError(f"no model variant for backend={backend!r}, precision={precision!r}: {why}")
    return out


class OrtEngine:
    """An onnxruntime CPU session; ``InferenceSession.run`` is thread-safe."""

    def __init__(self, path: Path, intra_op_threads: int = 0, inter_op_threads: int = 1):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = inter_op_threads
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_name = self.session.get_outputs()[0].name
        n_out = self.session.get_outputs()[0].shape[-1]
        self.num_outputs = n_out if isinstance(n_out, int) else None

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run([self.output_name], {n: feeds[n] for n in self.input_names})[0]


class OpenVinoEngine:
    """An OpenVINO CPU model compiled from ``model.onnx``; ``bf16`` sets INFERENCE_PRECISION_HINT.

    One infer request per thread (an OpenVINO request is not thread-safe; the compiled model is).
    """

    def __init__(self, path: Path, precision: str = "fp32", threads: int = 0):
        try:
            import openvino as ov
        except ImportError as e:
            raise BackendUnavailableError(f"OpenVINO is not installed ({e}): {OPENVINO_INSTALL}") from e
        core = ov.Core()
        config: dict[str, object] = {"INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32",
                                     "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        self.input_names = [i.get_any_name() for i in self.compiled.inputs]
        shape = self.compiled.outputs[0].get_partial_shape()
        last = shape[shape.rank.get_length() - 1]
        self.num_outputs = last.get_length() if last.is_static else None
        self._local = threading.local()

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        req = getattr(self._local, "request", None)
        if req is None:
            req = self._local.request = self.compiled.create_infer_request()
        req.infer({n: feeds[n] for n in self.input_names})
        return np.array(req.get_output_tensor(0).data, dtype=np.float32, copy=True)


def open_engine(root: Path, variant: Variant, intra_op_threads: int = 0, inter_op_threads: int = 1) -> OrtEngine | OpenVinoEngine:
    """Open the engine for one variant of the bundle at ``root``."""
    path = root / variant.model_file
    if variant.backend == OPENVINO:
        return OpenVinoEngine(path, variant.precision, intra_op_threads)
    return OrtEngine(path, intra_op_threads, inter_op_threads)


