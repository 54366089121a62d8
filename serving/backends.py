"""Which model variant runs, and the inference engines that run it: ONNX Runtime everywhere, OpenVINO where it is faster.

A bundle holds ``model.onnx`` (fp32), ``model.int8.onnx`` (ONNX Runtime dynamic int8) and
``model.int8.xml`` (OpenVINO int8, NNCF) when export's int8 rule accepted them. OpenVINO (the
optional extra ``suffice[openvino]``) runs the int8 IR and reads the same ``model.onnx`` to run it
in fp32, or in bf16 on CPUs with AMX or AVX-512 BF16. :func:`rank_variants` orders what the bundle holds and the CPU supports,
fastest first, from the CPU's ISA class (``suffice.serving.cpu``), not from a timing race at
start-up; the runtime takes the first variant that reproduces the bundle's parity probe.

On CPUs with bf16 units the int8 IR can also run with OpenVINO's bf16 precision hint around its int8
layers (variant ``openvino-int8-bf16``: the float parts, such as the pooler, classifier, softmax and
LayerNorm, in bf16); the runtime tries it only where export's int8 rule passed that combination
(``parity.openvino_int8.bf16_hint``).

>>> from suffice.serving.cpu import CpuInfo
>>> amx = CpuInfo.from_flags("Xeon", {"avx2", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"})
>>> [v.name for v in rank_variants("model.onnx", "model.int8.onnx", amx, openvino=True, openvino_int8_model_file="model.int8.xml")]
['openvino-int8-bf16', 'openvino-int8', 'openvino-bf16', 'onnxruntime-int8', 'openvino-fp32', 'onnxruntime-fp32']
"""

from __future__ import annotations

import ctypes
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
    """One way to run a bundle: an engine, a precision and the bundle file it reads.

    hint: OpenVINO's inference precision around an int8 model's int8 layers (``bf16``), or None (f32).
    """

    backend: str
    precision: str
    model_file: str
    hint: str | None = None

    @property
    def name(self) -> str:
        return f"{self.backend}-{self.precision}" + (f"-{self.hint}" if self.hint else "")


def openvino_available() -> bool:
    return importlib.util.find_spec("openvino") is not None


OV_INT8_BF16 = (OPENVINO, "int8", "bf16")  # the int8 IR with the bf16 hint around its int8 layers


def _speed_order(cpu: CpuInfo) -> list[tuple[str, str, str | None]]:
    """(backend, precision, hint) fastest first for a CPU, from its ISA class.

    OpenVINO int8 (the bundle's NNCF model, where export made one that passed the int8 rule) comes
    first on CPUs with int8 dot products (AVX-512 VNNI, AMX). On CPUs with bf16 units the same IR with
    the bf16 hint around its int8 layers is tried before it, but only where the manifest records that
    export's int8 rule passed that combination: the hint can keep the parity probe's scores while
    lowering macro-F1, which the label-free probe cannot see. On AMX, OpenVINO bf16 comes next (ranked
    so without a measurement on such a CPU); with AVX-512 BF16 but no AMX, ONNX Runtime int8 comes
    before OpenVINO bf16. On AVX2 (no VNNI) ONNX Runtime int8 with reduce_range weights stays first, then
    ONNX Runtime fp32, and OpenVINO int8 comes last: without VNNI its int8 kernels are 1.3-1.5x slower
    than fp32 (benchmarks/results/2026-12-02/scorer-avx2.md, 2026-12-03/scorer-avx2-levers.md). Elsewhere
    the fp32 engines come last, OpenVINO's first. Every variant must still reproduce the bundle's
    parity probe on the serving CPU. The timings behind this order are in
    benchmarks/results/2026-11-28/scorer-latency.md and int8-export.md.
    """
    ov_int8, ort_int8 = (OPENVINO, "int8", None), (ONNXRUNTIME, "int8", None)
    ov_bf16, ov_fp32, ort_fp32 = (OPENVINO, "bf16", None), (OPENVINO, "fp32", None), (ONNXRUNTIME, "fp32", None)
    if cpu.isa_class == AMX and cpu.bf16:
        return [OV_INT8_BF16, ov_int8, ov_bf16, ort_int8, ov_fp32, ort_fp32]
    if cpu.bf16:
        return [OV_INT8_BF16, ov_int8, ort_int8, ov_bf16, ov_fp32, ort_fp32]
    if cpu.isa_class in (AMX, AVX512_VNNI):
        return [ov_int8, ort_int8, ov_fp32, ort_fp32]
    if cpu.isa_class == AVX2:  # OpenVINO int8 is slower than either fp32 engine without VNNI: last
        return [ort_int8, ort_fp32, ov_fp32, ov_int8]
    return [ort_int8, ort_fp32, ov_int8, ov_fp32]


def rank_variants(model_file: str, int8_model_file: str | None, cpu: CpuInfo, *, backend: str = "auto",
                  precision: str = "auto", openvino: bool | None = None,
                  openvino_int8_model_file: str | None = None, openvino_int8_bf16: bool = True) -> list[Variant]:
    """The variants to try, fastest first: what the bundle holds, the CPU supports and the config allows.

    ``openvino_int8_bf16``: whether export's int8 rule passed the int8 IR with the bf16 hint (the
    manifest's ``parity.openvino_int8.bf16_hint``); when False ``openvino-int8-bf16`` is never tried.
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
    for be, prec, hint in _speed_order(cpu):
        if (backend != "auto" and be != backend) or (precision != "auto" and prec != precision):
            continue
        if (be == OPENVINO and not has_ov) or ((be, prec, hint) == OV_INT8_BF16 and not openvino_int8_bf16):
            continue
        if files[(be, prec)]:
            out.append(Variant(be, prec, files[(be, prec)], hint))
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


# OpenVINO compiles kernels and keeps memory for every input shape it meets, so a service seeing many
# sequence lengths would grow without bound. Inputs are padded (attention mask 0, which leaves the [CLS]
# logits unchanged) to a multiple of this many tokens: at most 8 shapes per batch size in a 256-token window.
# 128/256/512-token inputs are not padded at all. What padding costs and saves:
# benchmarks/results/2026-11-28/scorer-latency.md ("Memory").
OPENVINO_LENGTH_BUCKET = 32


def keep_int8_tables(model) -> int:
    """Rewrite ``Gather(Convert(int8 table) * scale, ids)`` as ``Convert(Gather(int8 table, ids)) * Gather(scale, ids)``.

    NNCF stores the embedding tables int8 with a per-row scale; the CPU plugin folds the dequantisation
    into an fp32 copy at compile (47 MB for MiniLM's word embeddings). Gathering the int8 rows first
    gives the same numbers (the same int8 value times the same scale) without that copy. Returns how
    many Gathers were rewritten; other graphs are left as they are.
    """
    import openvino as ov
    import openvino.opset13 as ops

    done = 0
    for gather in model.get_ordered_ops():
        if gather.get_type_name() != "Gather" or gather.input_value(0).get_node().get_type_name() != "Multiply":
            continue
        mul, axis = gather.input_value(0).get_node(), gather.input_value(2).get_node()
        convert, scale = (mul.input_value(i).get_node() for i in (0, 1))
        if convert.get_type_name() != "Convert":
            convert, scale = scale, convert
        if convert.get_type_name() != "Convert" or scale.get_type_name() != "Constant" or axis.get_type_name() != "Constant":
            continue
        table = convert.input_value(0).get_node()
        if table.get_type_name() != "Constant" or table.get_output_element_type(0) not in (ov.Type.i8, ov.Type.u8):
            continue
        rows, scale_shape = list(table.get_output_shape(0)), list(scale.get_output_shape(0))
        if len(rows) != 2 or int(axis.get_data().reshape(-1)[0]) % 2 != 0 or gather.get_batch_dims() != 0:
            continue
        if scale_shape == [rows[0], 1]:
            row_scale = ops.gather(scale.output(0), gather.input_value(1), axis.output(0))
        elif int(np.prod(scale_shape)) == 1:
            row_scale = scale.output(0)
        else:
            continue
        picked = ops.convert(ops.gather(table.output(0), gather.input_value(1), axis.output(0)), convert.get_output_element_type(0))
        out = ops.multiply(picked, row_scale)
        out.set_friendly_name(gather.get_friendly_name())
        gather.output(0).replace(out.output(0))
        done += 1
    return done


def trim_heap() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``); a no-op where libc has no such call.

    Compiling and the parity probe leave tens of MB freed but still resident; a long-lived service
    should not carry them.
    """
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError, TypeError):  # not glibc (macOS, musl, Windows): nothing to trim
        return


class OpenVinoEngine:
    """An OpenVINO CPU model compiled from ``model.onnx`` or the int8 IR.

    ``precision`` ``bf16`` (or ``hint`` ``bf16`` for the int8 IR) sets INFERENCE_PRECISION_HINT to bf16.
    Embedding tables stay int8 (:func:`keep_int8_tables`) and inputs are padded to a multiple of
    ``length_bucket`` tokens (:data:`OPENVINO_LENGTH_BUCKET`; 0 or 1 = no padding), which keeps the
    memory of a long-lived process bounded (``keep_int8=False``, ``length_bucket=0``: the plain engine,
    for benchmarks). One infer request per thread (an OpenVINO request is not
    thread-safe; the compiled model is).
    """

    def __init__(self, path: Path, precision: str = "fp32", threads: int = 0, hint: str | None = None,
                 length_bucket: int = OPENVINO_LENGTH_BUCKET, keep_int8: bool = True):
        try:
            import openvino as ov
        except ImportError as e:
            raise BackendUnavailableError(f"OpenVINO is not installed ({e}): {OPENVINO_INSTALL}") from e
        core = ov.Core()
        config: dict[str, object] = {"INFERENCE_PRECISION_HINT": "bf16" if "bf16" in (precision, hint) else "f32",
                                     "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        model = core.read_model(str(path))
        if keep_int8:
            keep_int8_tables(model)
        self.compiled = core.compile_model(model, "CPU", config)
        del model
        self.input_names = [i.get_any_name() for i in self.compiled.inputs]
        shape = self.compiled.outputs[0].get_partial_shape()
        last = shape[shape.rank.get_length() - 1]
        self.num_outputs = last.get_length() if last.is_static else None
        self.length_bucket = length_bucket
        self._local = threading.local()

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        req = getattr(self._local, "request", None)
        if req is None:
            req = self._local.request = self.compiled.create_infer_request()
        feeds = {n: feeds[n] for n in self.input_names}
        length = feeds[self.input_names[0]].shape[1]
        pad = -length % self.length_bucket if self.length_bucket > 1 and "attention_mask" in feeds else 0
        if pad:
            feeds = {n: np.pad(a, ((0, 0), (0, pad))) for n, a in feeds.items()}
        req.infer(feeds)
        return np.array(req.get_output_tensor(0).data, dtype=np.float32, copy=True)


def open_engine(root: Path, variant: Variant, intra_op_threads: int = 0, inter_op_threads: int = 1) -> OrtEngine | OpenVinoEngine:
    """Open the engine for one variant of the bundle at ``root``."""
    path = root / variant.model_file
    if variant.backend == OPENVINO:
        return OpenVinoEngine(path, variant.precision, intra_op_threads, hint=variant.hint)
    return OrtEngine(path, intra_op_threads, inter_op_threads)


