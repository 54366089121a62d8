"""Post-hoc: does the extractive-QA head's SQuAD 2.0 "null vs best span" score separate sufficient from not
better than the classifier? Loads one checkpoint (encoder + classifier in model.safetensors, span layer in
model_1.safetensors: both from the same step), packs the prepared rows as training does, scores both.

    python benchmarks/span_null_eval.py CHECKPOINT PREPARED_DATA base [SPLITS=validation] [LIMIT=0]
    python benchmarks/span_null_eval.py models/reading-span100k/checkpoints/step-0002402 data/reading base validation

For a run of configs/reading.yaml with --span.loss_weight > 0 (window 192, select packing, all-MiniLM-L6-v2
config; the third argument names a model directory with that config, or ``base``). Only the real sources
(not ``*-synthetic``) are scored. Record: benchmarks/results/2026-12-04/reading-span-scale-vnni.md."""
import sys, json, time
import numpy as np, torch
from datasets import load_from_disk
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForSequenceClassification
from sklearn.metrics import roc_auc_score, f1_score
from suffice.serving.packing import ContextPacker, pad_packed
from suffice.training.fit.model import load_tokenizer, resolve_base_dir

ckpt, data_dir, model_dir = sys.argv[1], sys.argv[2], sys.argv[3]
splits = sys.argv[4].split(",") if len(sys.argv) > 4 else ["validation"]
limit = int(sys.argv[5]) if len(sys.argv) > 5 else 0
torch.set_num_threads(2)
cfg = AutoConfig.from_pretrained(model_dir if model_dir != "base" else resolve_base_dir("minilm-l6"), num_labels=2)
model = AutoModelForSequenceClassification.from_config(cfg)
sd = load_file(f"{ckpt}/model.safetensors")
missing, unexpected = model.load_state_dict(sd, strict=False)
assert not [m for m in missing if "position_ids" not in m], missing
head = torch.nn.Linear(cfg.hidden_size, 2)
h = load_file(f"{ckpt}/model_1.safetensors"); head.load_state_dict({k.split(".")[-1]: v for k, v in h.items()})
model.eval()
packer = ContextPacker(load_tokenizer(resolve_base_dir("minilm-l6")), max_length=192, strategy="select")
ds = load_from_disk(data_dir)
out = {}
for split in splits:
    d = ds[split]
    rows = [r for r in d if not r["source"].endswith("-synthetic")]
    if limit: rows = rows[:limit]
    cls_p, span_s, ys, srcs = [], [], [], []
    t = time.perf_counter()
    for i in range(0, len(rows), 64):
        chunk = rows[i:i + 64]
        packed = [packer.pack(r["question"], r["passages"]) for r in chunk]
        feeds = pad_packed(packed, packer.pad_id)
        with torch.no_grad():
            o = model(input_ids=torch.tensor(feeds["input_ids"]), token_type_ids=torch.tensor(feeds["token_type_ids"]),
                      attention_mask=torch.tensor(feeds["attention_mask"]), output_hidden_states=True)
            lg = head(o.hidden_states[-1])  # (b, L, 2)
        p = torch.softmax(o.logits.float(), -1)[:, 1].numpy()
        tt = torch.tensor(feeds["token_type_ids"]); am = torch.tensor(feeds["attention_mask"])
        ctx = (tt == 1) & (am == 1)
        s, e = lg[..., 0], lg[..., 1]
        for b in range(len(chunk)):
            idx = torch.nonzero(ctx[b]).flatten()[:-1]  # context tokens, not the final [SEP]
            null = float(s[b, 0] + e[b, 0])
            if len(idx) == 0:
                best = -1e9
            else:
                sc = s[b, idx][:, None] + e[b, idx][None, :]
                n = len(idx)
                mask = torch.triu(torch.ones(n, n, dtype=torch.bool)) & ~torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=30)
                best = float(sc.masked_fill(~mask, -1e9).max())
            span_s.append(best - null)
        cls_p.extend(p.tolist()); ys.extend(int(r["label"] == 1) for r in chunk); srcs.extend(r["source"] for r in chunk)
    cls_p, span_s, ys, srcs = map(np.asarray, (cls_p, span_s, ys, srcs))
    res = {}
    for src in sorted(set(srcs)) + ["all"]:
        m = np.ones(len(ys), bool) if src == "all" else srcs == src
        if len(set(ys[m])) < 2: continue
        z = (span_s[m] - span_s[m].mean()) / (span_s[m].std() + 1e-9)
        res[src] = {"n": int(m.sum()), "auroc_classifier": round(roc_auc_score(ys[m], cls_p[m]), 4),
                    "auroc_span_null": round(roc_auc_score(ys[m], span_s[m]), 4),
                    "auroc_sum_ranks": round(roc_auc_score(ys[m], np.argsort(np.argsort(cls_p[m])) + np.argsort(np.argsort(span_s[m]))), 4),
                    "f1_span_at_0": round(f1_score(ys[m], (span_s[m] > 0).astype(int), average="macro"), 4)}
    out[split] = res
    print(split, f"{time.perf_counter() - t:.0f} s", json.dumps(res, indent=1), flush=True)
