"""Cost as the work grows: `suffice score` and the HTTP service at batch 1, 8 and 32 on mixed lengths.

The same items go through both, as a user sends them: one JSONL file to ``suffice score --batch-size B``
(a fresh process each time; its start-up, measured on a one-row file, is reported and taken out), and
lists of B items to ``POST /v1/sufficiency`` of one ``suffice serve`` process from one client (the
batch form), plus batch 1 from 8 concurrent clients. Lengths are mixed: each item is a question plus
passages of about 64, 128, 256, 512 or 1,300 tokens (the last: a RAG context of ~10 retrieved
paragraphs, which the packing cuts to the bundle's window), in equal shares and shuffled, counted
with the bundle's tokenizer. Items/s is the figure; the service's request p50/p95 are per batch.
The CPU model and ISA class (``suffice.serving.cpu``) are in the report.

    python benchmarks/bench_workload.py --bundle models/x/bundle --out workload.json
    python benchmarks/bench_workload.py --bundle models/x/bundle --items 96 --batches 1,8    # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_service import free_port, make_inputs, percentiles, wait_ready  # noqa: E402

LENGTHS = (64, 128, 256, 512, 1300)  # target tokens per item (question + passages), equal shares


def mixed_items(bundle: Path, n: int, seed: int = 0) -> tuple[list[dict], dict[int, int]]:
    """``n`` items over :data:`LENGTHS` in equal shares, shuffled; returns (items, {length: count})."""
    per = -(-n // len(LENGTHS))
    items: list[dict] = []
    for i, length in enumerate(LENGTHS):
        bodies, _ = make_inputs(bundle / "tokenizer.json", length, n=per, seed=seed + i)
        items += [{**b, "target_tokens": length} for b in bodies]
    random.Random(seed).shuffle(items)
    items = items[:n]
    return items, {length: sum(1 for it in items if it["target_tokens"] == length) for length in LENGTHS}


def score_cli(bundle: Path, src: Path, out: Path, batch: int, threads: int) -> float:
    """Wall seconds of one ``suffice score`` process over ``src``."""
    cmd = [sys.executable, "-m", "suffice.training.cli", "score", "--input", str(src), "--output", str(out), "--model", str(bundle),
           "--batch-size", str(batch), "--threads", str(threads), "--no-progress", "--overwrite"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"suffice score failed ({p.returncode}): {p.stderr[-2000:]}")
    return wall


def bench_cli(bundle: Path, items: list[dict], batches: list[int], threads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="suffice-workload-") as tmp:
        src, one = Path(tmp) / "items.jsonl", Path(tmp) / "one.jsonl"
        rows = [{"id": f"w{i}", "question": it["question"], "passages": it["passages"]} for i, it in enumerate(items)]
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
        one.write_text(json.dumps(rows[0]) + "\n")
        startup = min(score_cli(bundle, one, Path(tmp) / "one.out.jsonl", 1, threads) for _ in range(2))
        out = {"startup_s": round(startup, 3)}
        for b in batches:
            wall = score_cli(bundle, src, Path(tmp) / f"out-{b}.jsonl", b, threads)
            work = max(wall - startup, 1e-9)
            out[f"batch_{b}"] = {"wall_s": round(wall, 3), "scoring_s": round(work, 3), "items_per_s": round(len(rows) / work, 2)}
    return out


async def post_batches(base: str, items: list[dict], batch: int, clients: int) -> dict:
    import httpx

    bodies = [[{"question": it["question"], "passages": it["passages"]} for it in items[i:i + batch]] for i in range(0, len(items), batch)]
    if batch == 1:
        bodies = [b[0] for b in bodies]  # the single-item form
    lat: list[float] = []
    errors = 0
    queue = list(bodies)

    async def client() -> None:
        nonlocal errors
        async with httpx.AsyncClient(base_url=base, timeout=120) as c:
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                r = await c.post("/v1/sufficiency", json=body)
                lat.append((time.perf_counter() - t0) * 1000)
                errors += r.status_code != 200

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {"requests": len(bodies), "errors": errors, "wall_s": round(wall, 3), "items_per_s": round(len(items) / wall, 2),
            **percentiles(lat)}


def bench_service(bundle: Path, items: list[dict], batches: list[int], threads: int) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "suffice.training.cli", "serve", "--bundle", str(bundle), "--port", str(port),
           "--server.log_level=warning", f"--runtime.intra_op_threads={threads}", "--limits.queue_size=256"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        import httpx

        variant = httpx.get(base + "/readyz", timeout=5).json()
        asyncio.run(post_batches(base, items[:16], 8, 1))  # warm-up
        out: dict = {"readyz": variant}
        for b in batches:
            out[f"batch_{b}"] = asyncio.run(post_batches(base, items, b, 1))
        out["batch_1_clients_8"] = asyncio.run(post_batches(base, items, 1, 8))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--items", type=int, default=160, help="items per measurement (equal shares of each length)")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (the service's runtime.intra_op_threads)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from suffice.serving.cpu import detect

    batches = [int(b) for b in args.batches.split(",")]
    items, mix = mixed_items(args.bundle, args.items)
    cpu = detect()
    report = {"machine": {**cpu.as_dict(), "load_avg_1m_at_start": os.getloadavg()[0]},
              "items": len(items), "target_tokens_mix": mix, "threads": args.threads,
              "suffice_score": bench_cli(args.bundle, items, batches, args.threads),
              "service": bench_service(args.bundle, items, batches, args.threads)}
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
