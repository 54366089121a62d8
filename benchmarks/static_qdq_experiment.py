"""Experiment: static QDQ int8 (calibrated on validation inputs) vs the bundle's dynamic int8 vs fp32 on this CPU.

    python benchmarks/static_qdq_experiment.py BUNDLE VALIDATION_JSONL

Quantises the bundle's model.onnx with onnxruntime's quantize_static (QDQ, per-channel, reduce_range,
MatMul nodes, 64 calibration items, s8s8 and u8s8 activations), prints the mean |P(sufficient) change|
against fp32 on 300 items and the p50 latency at 256 tokens, batch 1, 2 threads (two rounds).
"""
import json, sys, time, numpy as np, onnx, onnxruntime as ort
from onnxruntime.quantization import quantize_static, CalibrationDataReader, QuantType, QuantFormat
from onnxruntime.quantization.shape_inference import quant_pre_process
from suffice.serving.runtime import OnnxClassifier, RuntimeConfig
B = sys.argv[1]
clf = OnnxClassifier(B, RuntimeConfig(precision="fp32", check_probe=False))
packer = clf.packer_for(None)
rows = [json.loads(l) for l in open(sys.argv[2])]
packed = [packer.pack(r["question"], r["passages"]) for r in rows]
names = [i.name for i in onnx.load(f"{B}/model.onnx", load_external_data=False).graph.input]
def feed(p):
    d = {"input_ids": np.array([p.input_ids], dtype=np.int64), "attention_mask": np.ones((1, len(p.input_ids)), dtype=np.int64),
         "token_type_ids": np.array([p.token_type_ids], dtype=np.int64)}
    return {k: d[k] for k in names}
class Reader(CalibrationDataReader):
    def __init__(self, ps): self.it = iter([feed(p) for p in ps])
    def get_next(self): return next(self.it, None)
import tempfile
work = tempfile.mkdtemp(prefix="suffice-qdq-")
import os
B = os.path.abspath(B)
os.chdir(work)  # the quantiser writes its calibration model's external data into the working directory
pre = f"{work}/model.pre.onnx"
quant_pre_process(f"{B}/model.onnx", pre, skip_optimization=False, skip_symbolic_shape=True)
out = {}
for name, kw in {"qdq_s8s8": dict(activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT}),
                 "qdq_u8s8": dict(activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, extra_options={"ActivationSymmetric": False, "DefaultTensorType": onnx.TensorProto.FLOAT})}.items():
    dst = f"{work}/model.{name}.onnx"
    t = time.time()
    quantize_static(pre, dst, Reader(packed[:64]), quant_format=QuantFormat.QDQ, per_channel=True, reduce_range=True,
                    op_types_to_quantize=["MatMul"], **kw)
    out[name] = dst
    print(name, "quantised in", round(time.time() - t, 1), "s", flush=True)
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.inter_op_num_threads = 1
models = {"fp32": f"{B}/model.onnx", "dyn_int8": f"{B}/model.int8.onnx", **out}
sess = {k: ort.InferenceSession(v, so, providers=["CPUExecutionProvider"]) for k, v in models.items()}
# quality: mean |P(suff) change| vs fp32 over 300 items
def prob(s, p):
    z = s.run(None, feed(p))[0][0]; e = np.exp(z - z.max()); return (e / e.sum())[1]
ref = np.array([prob(sess["fp32"], p) for p in packed[:300]])
for k in sess:
    pr = np.array([prob(sess[k], p) for p in packed[:300]])
    print(k, "mean |dP| vs fp32", round(float(np.abs(pr - ref).mean()), 4), "max", round(float(np.abs(pr - ref).max()), 4))
# latency at exactly 256 tokens
long = next(p for p in packed if len(p.input_ids) >= 250)
ids = (long.input_ids * 2)[:256]
f = {"input_ids": np.array([ids], dtype=np.int64), "attention_mask": np.ones((1, 256), dtype=np.int64), "token_type_ids": np.zeros((1, 256), dtype=np.int64)}
f = {k: f[k] for k in names}
for rnd in range(2):
    for k, s in sess.items():
        for _ in range(5): s.run(None, f)
        ts = []
        t_end = time.time() + 4
        while time.time() < t_end:
            t = time.perf_counter(); s.run(None, f); ts.append((time.perf_counter() - t) * 1e3)
        print(f"round {rnd} {k}: p50 {np.percentile(ts, 50):.1f} ms at 256 tokens (n={len(ts)})", flush=True)
