"""The student sweep on one CUDA GPU: stage 0 (pair reading) vs none, seeds, pooling, LoRA vs full.

    python benchmarks/student_sweep/train_gpu.py --data .sweep/data.json.xz --model .sweep/minilm \
        --out $OUT --budget-s 290

Plain torch + transformers (+ peft for the LoRA recipe): the device machine has no MLflow or
datasets, so this is the measurement harness, not the product's trainer. Inputs are packed with
suffice's own ``ContextPacker`` (the code serving runs), 256 tokens, question-aware selection.
Each recipe writes its per-epoch validation and test logits; selection happens afterwards on
validation only (``report.py``). Results are written after every recipe, so a run cut short
keeps what it finished; recipes that would not fit the remaining budget are skipped and named.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import lzma
import math
import os
import random
import sys
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RECIPES = [
    # name, stage0 epochs, stage1 epochs, pooling, finetune, seed, data filter
    {"name": "full-s0-cls-seed1", "s0": 1, "epochs": 3, "pool": "cls", "ft": "full", "seed": 1},
    {"name": "full-nos0-cls-seed1", "s0": 0, "epochs": 4, "pool": "cls", "ft": "full", "seed": 1},
    {"name": "full-s0-cls-seed2", "s0": 1, "epochs": 3, "pool": "cls", "ft": "full", "seed": 2},
    {"name": "full-nos0-cls-seed2", "s0": 0, "epochs": 4, "pool": "cls", "ft": "full", "seed": 2},
    {"name": "lora-s0-cls-seed1", "s0": 1, "epochs": 3, "pool": "cls", "ft": "lora", "seed": 1},
    {"name": "full-s0-mean-seed1", "s0": 1, "epochs": 3, "pool": "mean", "ft": "full", "seed": 1},
    {"name": "full-s0-cls-seed1-no-retrieval-like", "s0": 1, "epochs": 3, "pool": "cls", "ft": "full", "seed": 1, "drop_variant": "retrieval_like"},
    {"name": "full-s0-cls-seed1-no-wiki", "s0": 1, "epochs": 3, "pool": "cls", "ft": "full", "seed": 1, "drop_source": "wiki-synthetic"},
]
LR, HEAD_LR, LORA_LR, LORA_HEAD_LR = 7e-5, 7e-4, 5e-4, 2e-3
BATCH, EVAL_BATCH, MAX_LEN, WARMUP = 32, 256, 256, 0.1
VAL_SOURCES = ("squad2", "qed", "hotpotqa-fullwiki", "wiki-synthetic")

_packer = None


def _init(tok_path: str, repo: str) -> None:
    global _packer
    sys.path.insert(0, repo)
    from tokenizers import Tokenizer

    from suffice.serving.packing import ContextPacker

    _packer = ContextPacker(Tokenizer.from_file(tok_path), max_length=MAX_LEN, strategy="select")


def _pack(job):
    q, passages = job
    p = _packer.pack(q, passages)
    return np.asarray(p.input_ids, dtype=np.int32), int(np.sum(np.asarray(p.token_type_ids) == 0))


def load_and_pack(data_path: str, tok_path: str, pkg_dir: str, procs: int, limit: int = 0):
    with lzma.open(data_path, "rt", encoding="utf-8") as f:
        payload = json.load(f)
    table = payload["passages"]
    splits = payload["splits"]
    if limit:
        splits = {s: rows[:limit] for s, rows in splits.items()}
    jobs, where = [], []
    for s, rows in splits.items():
        for i, r in enumerate(rows):
            jobs.append((r["q"], [{"title": table[k][0], "text": table[k][1]} for k in r["p"]]))
            where.append((s, i))
    with Pool(procs, initializer=_init, initargs=(tok_path, pkg_dir)) as pool:
        packed = pool.map(_pack, jobs, chunksize=256)
    for (s, i), (ids, n_first) in zip(where, packed):
        splits[s][i]["ids"] = ids
        splits[s][i]["n0"] = n_first
    return splits, payload.get("manifest", {})


def batches(rows, batch_size, rng: random.Random | None):
    idx = list(range(len(rows)))
    if rng is None:
        idx.sort(key=lambda i: len(rows[i]["ids"]))
        return [idx[i:i + batch_size] for i in range(0, len(idx), batch_size)]
    rng.shuffle(idx)
    mega = batch_size * 50
    out = []
    for m in range(0, len(idx), mega):
        chunk = sorted(idx[m:m + mega], key=lambda i: len(rows[i]["ids"]))
        out += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(out)
    return out


def collate(rows, b, torch, device):
    n = max(len(rows[i]["ids"]) for i in b)
    ids = np.zeros((len(b), n), dtype=np.int64)
    types = np.zeros((len(b), n), dtype=np.int64)
    mask = np.zeros((len(b), n), dtype=np.int64)
    for j, i in enumerate(b):
        x = rows[i]["ids"]
        ids[j, :len(x)] = x
        types[j, rows[i]["n0"]:len(x)] = 1
        mask[j, :len(x)] = 1
    lab = np.asarray([rows[i]["label"] for i in b], dtype=np.int64)
    t = lambda a: torch.from_numpy(a).to(device, non_blocking=True)
    return t(ids), t(types), t(mask), t(lab)


def build_model(model_dir: str, pool: str, torch):
    import transformers
    from transformers import AutoConfig, BertForSequenceClassification, BertModel

    cfg = AutoConfig.from_pretrained(model_dir, num_labels=2)
    if pool == "cls":
        m = BertForSequenceClassification.from_pretrained(model_dir, config=cfg)
    else:
        class MeanPooled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bert = BertModel.from_pretrained(model_dir, add_pooling_layer=False)
                self.dropout = torch.nn.Dropout(0.1)
                self.classifier = torch.nn.Linear(cfg.hidden_size, 2)

            def forward(self, input_ids, token_type_ids, attention_mask):
                h = self.bert(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask).last_hidden_state
                m = attention_mask.unsqueeze(-1).to(h.dtype)
                return self.classifier(self.dropout((h * m).sum(1) / m.sum(1).clamp(min=1)))

        m = MeanPooled()
    return m.float()


def logits_of(model, out):
    return out.logits if hasattr(out, "logits") else out


def is_head(name: str) -> bool:
    return "classifier" in name or "pooler" in name


def train_stage(model, rows, epochs, lr, head_lr, seed, torch, device, evaluate=None, log=None, curve=None):
    torch.manual_seed(seed)
    rng = random.Random(seed)
    labels = np.asarray([r["label"] for r in rows])
    pos = labels.mean()
    weight = torch.tensor([0.5 / (1 - pos), 0.5 / pos], dtype=torch.float32, device=device)
    params = [p for p in model.parameters() if p.requires_grad]
    head = [p for n, p in model.named_parameters() if p.requires_grad and is_head(n)]
    body = [p for n, p in model.named_parameters() if p.requires_grad and not is_head(n)]
    opt = torch.optim.AdamW([{"params": body, "lr": lr}, {"params": head, "lr": head_lr}], weight_decay=0.01, fused=device.type == "cuda")
    steps_per_epoch = math.ceil(len(rows) / BATCH)
    total = steps_per_epoch * epochs
    warm = max(1, int(WARMUP * total))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (total - s) / max(1, total - warm)))
    lossf = torch.nn.CrossEntropyLoss(weight=weight)
    step = 0
    epoch_logs = []
    for ep in range(epochs):
        model.train()
        t0 = time.perf_counter()
        run = 0.0
        for b in batches(rows, BATCH, rng):
            ids, types, mask, lab = collate(rows, b, torch, device)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                out = logits_of(model, model(input_ids=ids, token_type_ids=types, attention_mask=mask))
            loss = lossf(out.float(), lab)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            step += 1
            if curve is not None and (step <= 300 or step % 10 == 0):
                curve.append((step, round(float(loss.detach()), 4)))
            run += float(loss.detach()) if step % 20 == 0 else 0.0
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        entry = {"epoch": ep + 1, "seconds": round(dt, 2), "examples_per_s": round(len(rows) / dt, 1)}
        if evaluate is not None:
            entry |= evaluate(ep + 1)
        epoch_logs.append(entry)
        if log:
            log(json.dumps(entry))
    return epoch_logs


@np.errstate(all="ignore")
def quick_metrics(logits, rows):
    from sklearn.metrics import f1_score, roc_auc_score

    p = np.exp(logits[:, 1] - np.logaddexp(logits[:, 0], logits[:, 1]))
    y = np.asarray([r["label"] for r in rows])
    src = np.asarray([r["source"] for r in rows])
    out = {}
    for s in sorted(set(src)):
        sel = src == s
        if sel.sum() < 5:
            continue
        f1 = f1_score(y[sel], (p[sel] >= 0.5).astype(int), average="macro")
        auc = roc_auc_score(y[sel], p[sel]) if len(set(y[sel])) == 2 else float("nan")
        out[s] = {"macro_f1": round(float(f1), 4), "auroc": round(float(auc), 4), "n": int(sel.sum())}
    return out


def predict(model, rows, torch, device):
    model.eval()
    out = np.zeros((len(rows), 2), dtype=np.float32)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        for b in batches(rows, EVAL_BATCH, None):
            ids, types, mask, _ = collate(rows, b, torch, device)
            out[b] = logits_of(model, model(input_ids=ids, token_type_ids=types, attention_mask=mask)).float().cpu().numpy()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True, help="base encoder directory (config.json, model.safetensors, tokenizer.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=290.0)
    ap.add_argument("--recipes", default="", help="comma-separated names (default: all, in order)")
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--limit-rows", type=int, default=0, help="smoke tests: keep this many rows per split")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    logf = open(out_dir / "log.txt", "a", encoding="utf-8")

    def log(msg):
        line = f"[{time.perf_counter() - t_start:7.1f}s] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    import torch

    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    # suffice.serving importable without installing the project: a namespace folder linking serving/
    import tempfile

    repo = tempfile.mkdtemp(prefix="suffice-pkg-")
    os.makedirs(Path(repo) / "suffice")
    os.symlink(Path(__file__).resolve().parents[2] / "serving", Path(repo) / "suffice" / "serving")
    splits, manifest = load_and_pack(args.data, str(Path(args.model) / "tokenizer.json"), repo, args.procs, args.limit_rows)
    log(f"packed: {({s: len(r) for s, r in splits.items()})}; device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}")
    val, test = splits["validation"], splits["test"]
    results = {"manifest": manifest, "config": {"lr": LR, "head_lr": HEAD_LR, "lora_lr": LORA_LR, "lora_head_lr": LORA_HEAD_LR,
                                                "batch": BATCH, "max_length": MAX_LEN, "warmup": WARMUP, "precision": "bf16 autocast"},
               "recipes": {}, "skipped": []}
    logits_store: dict[str, np.ndarray] = {
        "val_label": np.asarray([r["label"] for r in val]), "test_label": np.asarray([r["label"] for r in test]),
        "val_source": np.asarray([r["source"] for r in val]), "test_source": np.asarray([r["source"] for r in test]),
        "val_kind": np.asarray([r["kind"] for r in val]), "test_id": np.asarray([r["id"] for r in test]),
        "val_id": np.asarray([r["id"] for r in val])}
    stage0_cache: dict[tuple, tuple[dict, float, list]] = {}
    best = (-1.0, None)
    wanted = [r for r in RECIPES if not args.recipes or r["name"] in args.recipes.split(",")]
    per_example_s = None

    def save():
        (out_dir / "results.json").write_text(json.dumps(results, indent=1))
        np.savez_compressed(out_dir / "logits.npz", **logits_store)

    for rec in wanted:
        rows = splits["train"]
        if rec.get("drop_variant"):
            rows = [r for r in rows if r["variant"] != rec["drop_variant"]]
        if rec.get("drop_source"):
            rows = [r for r in rows if r["source"] != rec["drop_source"] and not r["source"].startswith(rec["drop_source"])]
        key = (rec["seed"], rec["pool"])
        torch.manual_seed(rec["seed"])
        n_examples = len(rows) * rec["epochs"] + (len(splits["stage0"]) * rec["s0"] if rec["s0"] and key not in stage0_cache else 0)
        left = args.budget_s - (time.perf_counter() - t_start)
        if per_example_s is not None and n_examples * per_example_s + 20 > left:
            results["skipped"].append({"name": rec["name"], "needed_s": round(n_examples * per_example_s, 1), "left_s": round(left, 1)})
            log(f"skip {rec['name']}: needs ~{n_examples * per_example_s:.0f}s, {left:.0f}s left")
            continue
        t0 = time.perf_counter()
        log(f"recipe {rec['name']}: {len(rows)} train rows")
        curve: list = []
        s0_log, s0_seconds = [], 0.0
        if rec["s0"]:
            if key not in stage0_cache:
                model = build_model(args.model, rec["pool"], torch).to(device)
                ts = time.perf_counter()
                s0_log = train_stage(model, splits["stage0"], rec["s0"], LR, HEAD_LR, rec["seed"], torch, device, log=log)
                stage0_cache[key] = ({k: v.detach().clone() for k, v in model.state_dict().items()}, time.perf_counter() - ts, s0_log)
            state, s0_seconds, s0_log = stage0_cache[key]
            model = build_model(args.model, rec["pool"], torch)
            model.load_state_dict(state)
            torch.manual_seed(rec["seed"])
            model.to(device)
        else:
            model = build_model(args.model, rec["pool"], torch).to(device)
        lr, head_lr = LR, HEAD_LR
        if rec["ft"] == "lora":
            from peft import LoraConfig, get_peft_model

            targets = ["query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense"]
            model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets,
                                                     modules_to_save=["classifier", "pooler"]))
            lr, head_lr = LORA_LR, LORA_HEAD_LR
        name = rec["name"]

        def evaluate(ep):
            vl, tl = predict(model, val, torch, device), predict(model, test, torch, device)
            logits_store[f"{name}__val__{ep}"] = vl.astype(np.float16)
            logits_store[f"{name}__test__{ep}"] = tl.astype(np.float16)
            vm = quick_metrics(vl, val)
            mean = float(np.mean([vm[s]["macro_f1"] for s in VAL_SOURCES if s in vm]))
            return {"val": vm, "val_source_mean_f1": round(mean, 4), "test": quick_metrics(tl, test)}

        ts = time.perf_counter()
        logs = train_stage(model, rows, rec["epochs"], lr, head_lr, rec["seed"], torch, device, evaluate=evaluate, log=log, curve=curve)
        s1_seconds = time.perf_counter() - ts
        train_seconds = s0_seconds + s1_seconds
        per_example_s = (s1_seconds) / (len(rows) * rec["epochs"])
        best_ep = max(logs, key=lambda e: e["val_source_mean_f1"])
        results["recipes"][name] = {"recipe": rec, "train_rows": len(rows), "stage0_rows": len(splits["stage0"]) if rec["s0"] else 0,
                                    "stage0_seconds": round(s0_seconds, 1), "stage1_seconds": round(s1_seconds, 1),
                                    "train_seconds": round(train_seconds, 1), "stage0_log": s0_log, "epochs": logs,
                                    "best_epoch_by_validation": best_ep["epoch"], "loss_curve": curve,
                                    "wall_s": round(time.perf_counter() - t0, 1)}
        save()
        if rec["ft"] == "full" and rec["pool"] == "cls" and best_ep["val_source_mean_f1"] > best[0]:
            # the best full/CLS recipe's final weights come back (fp16 safetensors in <= 15 MB parts)
            best = (best_ep["val_source_mean_f1"], name)
            from safetensors.torch import save as st_save

            blob = st_save({k: v.detach().to(torch.float16).cpu().contiguous() for k, v in model.state_dict().items()},
                           metadata={"recipe": name, "epoch": str(rec["epochs"])})
            for old in out_dir.glob("model.part*"):
                old.unlink()
            part = 15 * 1024 * 1024
            for k in range(0, len(blob), part):
                (out_dir / f"model.part{k // part}").write_bytes(blob[k:k + part])
            results["returned_model"] = {"recipe": name, "epoch": rec["epochs"], "bytes": len(blob)}
            save()
        log(f"done {name} in {time.perf_counter() - t0:.1f}s; best epoch {best_ep['epoch']} val mean F1 {best_ep['val_source_mean_f1']}")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    results["total_s"] = round(time.perf_counter() - t_start, 1)
    save()
    log("finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
