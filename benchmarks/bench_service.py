"""Load test of `suffice serve` on loopback: good clients alone, then good clients under a flood.

Phase 1: ``--clients`` concurrent clients (default 64) POST ``/v1/sufficiency`` for
``--duration`` seconds (default 60) with realistic ~256-token inputs (a question plus passages,
measured with the bundle's tokenizer). Phase 2: the same while a second *process* floods the
port with malformed requests (invalid JSON, wrong content type, oversized bodies, schema
errors, raw garbage). The good clients must see zero errors in both phases; the report gives
throughput and p50/p95/p99 latency per phase, and the flood's rate and status codes.

    python benchmarks/bench_service.py --bundle /tmp/minilm-bundle                 # the full 2 x 60 s run
    python benchmarks/bench_service.py --bundle /tmp/minilm-bundle --duration 10 --out bench-service.json

The service runs as its own process (``suffice serve``), exactly as in production; ``--set``
passes config overrides (e.g. ``--set runtime.workers=2 --set runtime.intra_op_threads=1``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

FACTS = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
    "It is named after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.",
    "Locally nicknamed the Iron Lady, it was constructed as the centrepiece of the 1889 World's Fair.",
    "The tower is 330 metres tall, about the same height as an 81-storey building, and the tallest structure in Paris.",
    "Chopin left Warsaw in November 1830, shortly before the outbreak of the November Uprising.",
    "He settled in Paris in 1831 and never returned to Poland, supporting himself as a composer and teacher.",
    "Mars has two small moons, Phobos and Deimos, which are thought to be captured asteroids.",
    "Phobos orbits Mars three times a day and is slowly spiralling inward towards the planet.",
    "Kilimanjaro, at 5,895 metres above sea level, is the highest mountain in Africa.",
    "The mountain is a dormant volcano in Tanzania with three volcanic cones: Kibo, Mawenzi and Shira.",
    "Bram Stoker was an Irish author best known for the 1897 Gothic horror novel Dracula.",
    "The Berlin Wall fell on 9 November 1989, after the East German government opened the border crossings.",
    "The Danube flows through Vienna, Bratislava, Budapest and Belgrade before reaching the Black Sea.",
    "The Louvre in Paris is the world's most-visited art museum and home of the Mona Lisa.",
]
QUESTIONS = [
    "How tall is the Eiffel Tower and who designed it?", "When did Chopin leave Warsaw?", "How many moons does Mars have?",
    "What is the highest mountain in Africa?", "Who wrote Dracula and when was it published?", "When did the Berlin Wall fall?",
    "Which capitals does the Danube flow through?", "Where is the Mona Lisa displayed?",
]


def make_inputs(tokenizer_path: Path | None, target_tokens: int, n: int = 64, seed: int = 0) -> tuple[list[dict], float]:
    """``n`` request bodies of about ``target_tokens`` tokens each (question + passages)."""
    rng = random.Random(seed)
    tok = None
    if tokenizer_path and tokenizer_path.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer_path))

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids) if tok else int(len(text.split()) * 1.3)

    bodies, sizes = [], []
    for _ in range(n):
        q = rng.choice(QUESTIONS)
        passages, used = [], count(q) + 3
        while used < target_tokens:
            sents = rng.sample(FACTS, 3)
            text = " ".join(sents)
            c = count(text)
            if used + c > target_tokens + 20:
                text = sents[0]
                c = count(text)
            passages.append({"title": sents[0].split(" ")[1], "text": text})
            used += c + 2
        bodies.append({"question": q, "passages": passages})
        sizes.append(used)
    return bodies, sum(sizes) / len(sizes)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the service exited with code {proc.returncode} before it was ready")
        try:
            if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the service at {base} was not ready after {timeout_s} s")


def percentiles(lat_ms: list[float]) -> dict:
    if not lat_ms:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}
    s = sorted(lat_ms)

    def q(p: float) -> float:
        return round(s[min(len(s) - 1, int(round(p * (len(s) - 1))))], 2)

    return {"p50_ms": q(0.50), "p95_ms": q(0.95), "p99_ms": q(0.99), "max_ms": round(s[-1], 2)}


async def good_clients(base: str, bodies: list[dict], clients: int, duration_s: float) -> dict:
    import httpx

    lat: list[float] = []
    statuses: dict[str, int] = {}
    errors: list[str] = []
    payloads = [json.dumps(b).encode() for b in bodies]
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=60.0, limits=limits) as client:
        t_end = time.perf_counter() + duration_s

        async def one(i: int) -> None:
            k = i
            while time.perf_counter() < t_end:
                body = payloads[k % len(payloads)]
                k += clients
                t0 = time.perf_counter()
                try:
                    r = await client.post("/v1/sufficiency", content=body, headers={"content-type": "application/json"})
                    statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
                    if r.status_code == 200:
                        lat.append((time.perf_counter() - t0) * 1e3)
                    elif len(errors) < 5:
                        errors.append(f"HTTP {r.status_code}: {r.text[:200]}")
                except httpx.HTTPError as e:
                    statuses["exception"] = statuses.get("exception", 0) + 1
                    if len(errors) < 5:
                        errors.append(f"{type(e).__name__}: {e}")

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(clients)))
        wall = time.perf_counter() - t0
    n_ok = statuses.get("200", 0)
    return {"requests": sum(statuses.values()), "ok": n_ok, "errors": sum(statuses.values()) - n_ok, "statuses": statuses,
            "error_samples": errors, "wall_s": round(wall, 2), "throughput_rps": round(n_ok / wall, 1), **percentiles(lat)}


MALFORMED = [
    ("application/json", b'{"question": "Where is', "invalid JSON"),
    ("text/plain", b'{"question": "q?", "passages": []}', "wrong content type"),
    ("application/json", b'{"question": 42, "passages": "x"}', "schema error"),
    ("application/json", b'{"question": "q?", "passages": [' + b'"p",' * 80 + b'"p"]}', "too many passages"),
    ("application/json", b'{"question": "' + b"a" * (1_100_000) + b'"}', "body over 1 MiB"),
    ("application/json", b"\xff\xfe\x00garbage", "not UTF-8"),
    ("application/json", b"", "empty body"),
]


def flood(port: int, duration_s: float, conns: int, out_q: "mp.Queue") -> None:
    """A separate process hammering the port with malformed requests over raw sockets."""
    statuses: dict[str, int] = {}
    sent = 0
    t_end = time.monotonic() + duration_s

    def worker(seed: int) -> None:
        nonlocal sent
        rng = random.Random(seed)
        sock = None
        while time.monotonic() < t_end:
            ctype, body, _ = rng.choice(MALFORMED)
            req = (f"POST /v1/sufficiency HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            try:
                if sock is None:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                sock.sendall(req)
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = sock.recv(65536)
                    if not chunk:
                        raise ConnectionError("closed")
                    head += chunk
                status = head.split(b" ", 2)[1].decode()
                statuses[status] = statuses.get(status, 0) + 1
                sent += 1
                hdr, _, rest = head.partition(b"\r\n\r\n")
                length = 0
                for line in hdr.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(rest) < length:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    rest += chunk
                if b"connection: close" in hdr.lower():
                    sock.close()
                    sock = None
            except (OSError, ConnectionError, IndexError, ValueError):
                statuses["conn_error"] = statuses.get("conn_error", 0) + 1
                if sock is not None:
                    sock.close()
                sock = None

    import threading

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out_q.put({"requests": sent, "rps": round(sent / duration_s, 1), "statuses": statuses})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=float, default=60.0, help="seconds per phase")
    p.add_argument("--tokens", type=int, default=256, help="target tokens per input (question + passages)")
    p.add_argument("--flood-connections", type=int, default=8)
    p.add_argument("--no-flood", action="store_true", help="skip phase 2")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="service config override, e.g. runtime.workers=2")
    p.add_argument("--config", default=None, help="service YAML (default: built-in defaults)")
    p.add_argument("--out", default=None, help="write the report as JSON here")
    args = p.parse_args(argv)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "suffice.training.cli", "serve", "--bundle", args.bundle, "--port", str(port),
           "--server.log_level=warning", f"--limits.queue_size={max(128, 2 * args.clients)}", *(f"--{s}" for s in args.set)]
    if args.config:
        cmd += ["--config", args.config]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    report: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
                    "bundle": args.bundle, "clients": args.clients, "duration_s": args.duration, "overrides": args.set}
    try:
        wait_ready(base, proc)
        bodies, mean_tokens = make_inputs(Path(args.bundle) / "tokenizer.json", args.tokens)
        report["mean_input_tokens"] = round(mean_tokens, 1)
        report["ready"] = json.loads(__import__("httpx").get(base + "/readyz").text)
        asyncio.run(good_clients(base, bodies[:4], min(4, args.clients), 2.0))  # warm connections and caches
        print(f"phase 1: {args.clients} clients x {args.duration:g} s, ~{mean_tokens:.0f} tokens per input", file=sys.stderr)
        report["good_only"] = asyncio.run(good_clients(base, bodies, args.clients, args.duration))
        if not args.no_flood:
            print(f"phase 2: the same while another process floods with malformed requests ({args.flood_connections} connections)", file=sys.stderr)
            q: mp.Queue = mp.get_context("spawn").Queue()
            fl = mp.get_context("spawn").Process(target=flood, args=(port, args.duration + 1.0, args.flood_connections, q))
            fl.start()
            time.sleep(0.5)
            report["good_under_flood"] = asyncio.run(good_clients(base, bodies, args.clients, args.duration))
            fl.join(args.duration + 30)
            report["flood"] = q.get(timeout=10) if not q.empty() else {"error": "the flood process reported nothing"}
        import httpx

        report["metrics_sample"] = [l for l in httpx.get(base + "/metrics").text.splitlines()
                                    if l.startswith(("sufficient_context_queue_rejections_total", "http_requests_total{"))][:20]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    phases = [report.get("good_only", {}), report.get("good_under_flood", {})]
    failed = any(ph.get("errors", 0) for ph in phases if ph)
    for name, ph in (("good clients alone", phases[0]), ("good clients under flood", phases[1])):
        if ph:
            print(f"{name:26s}: {ph['ok']} ok, {ph['errors']} errors, {ph['throughput_rps']} req/s, "
                  f"p50 {ph['p50_ms']} ms, p95 {ph['p95_ms']} ms, p99 {ph['p99_ms']} ms", file=sys.stderr)
    if report.get("flood"):
        print(f"flood: {report['flood'].get('requests')} malformed requests ({report['flood'].get('rps')} req/s), "
              f"statuses {report['flood'].get('statuses')}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
