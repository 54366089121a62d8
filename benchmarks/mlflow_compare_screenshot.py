"""Screenshot MLflow's comparison of two registered versions of ``suffice-sufficiency`` in headless Chromium.

It checks what issue 20 asks of the registry: two versions side by side show their runs' params
(what differs), the signature, and the per-source ``headline/`` metrics.

    python benchmarks/mlflow_compare_screenshot.py                       # build a tiny store, 2 versions
    python benchmarks/mlflow_compare_screenshot.py --store /tmp/mlruns --versions 1 2   # an existing store
    python benchmarks/mlflow_compare_screenshot.py --out benchmarks/results/2026-11-28/mlflow-compare.png

Without ``--store`` it trains two tiny random models (all-MiniLM-L6-v2's tokenizer, a 2-layer
32-wide BERT: the test suite's recipe) on ``tests/fixtures/train20.jsonl`` plus one validation
row marked ``wiki-synthetic`` (the real data's validation-only source), with different ``lora.r``
and learning rates, exports and registers each (versions 1 and 2) into ``<workdir>/mlruns``. Their
numbers only show that the code paths work. Then it starts ``mlflow ui --workers 1`` on
127.0.0.1, opens ``#/compare-model-versions`` for the two versions in Chromium (Debian's
``chromium`` + ``chromium-driver``, driven by selenium: ``pip install 'suffice[screenshots]'``),
closes the assistant side panel, turns the Metrics section's "Show diff only" off, scrolls its
table to the ``headline/`` rows (letting that 400-px box grow to hold them all) and saves a palette PNG.

Needs: the ``train`` extra, selenium, ``/usr/bin/chromium`` and ``/usr/bin/chromedriver``
(``apt-get install -y chromium chromium-driver``). Takes ~2 minutes on 2 busy cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "train20.jsonl"
NAME = "suffice-sufficiency"
RUNS = (("4", "1e-3"), ("8", "3e-3"))  # (lora.r, learning_rate) of the two tiny runs


def tiny_base(out: Path) -> Path:
    """A 2-layer, 32-wide random BERT with all-MiniLM-L6-v2's tokenizer (tests/conftest.py's tiny_bert_dir)."""
    import torch
    import transformers

    from suffice.training.paths import resolve_base_model

    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                   intermediate_size=64, max_position_embeddings=512, type_vocab_size=2)
                           ).save_pretrained(out, safe_serialization=True)
    minilm = Path(resolve_base_model("minilm-l6"))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (minilm / name).is_file():
            shutil.copy(minilm / name, out / name)
    return out


def training_rows(out: Path) -> Path:
    """The 20-row fixture plus a copy of one validation row as a ``wiki-synthetic`` item (validation only)."""
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
    extra = dict(next(r for r in rows if r["split"] == "validation"))
    extra.update(id="wiki-synth:screenshot-1", source="wiki-synthetic", label_source="synthetic")
    out.write_text("".join(json.dumps(r) + "\n" for r in [*rows, extra]))
    return out


def build_store(workdir: Path) -> tuple[Path, list[str]]:
    """Train, export and register two tiny models into ``workdir/mlruns``; returns (store folder, versions)."""
    store = workdir / "mlruns"
    store.mkdir(parents=True, exist_ok=True)
    os.environ.update({"SUFFICE_MLRUNS_DIR": str(store), "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}",
                       "SUFFICE_PREPARED_DIR": str(workdir / "prepared"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                       "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    from suffice.training.fit.config import build_train_config
    from suffice.training.fit.run import run

    base = tiny_base(workdir / "tiny-bert")
    data = training_rows(workdir / "train21.jsonl")
    versions = []
    for i, (rank, lr) in enumerate(RUNS, 1):
        summary = run(build_train_config(None, [
            f"--train_file={data}", f"--base_model={base}", f"--output_dir={workdir / f'model-{i}'}", "--max_length=64",
            "--per_device_train_batch_size=4", "--num_train_epochs=2", f"--lora.r={rank}", f"--lora.alpha={2 * int(rank)}",
            f"--learning_rate={lr}", "--torch_threads=1", "--export=true", "--baselines=[]", f"--tracking.run_name=screenshot-{i}"]))
        versions.append(summary["registered"].rsplit("/", 1)[-1])
    return store, versions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(store: Path, port: int) -> subprocess.Popen:
    """``mlflow ui`` on the store with one worker (what ``make mlflow-ui`` runs); waits until it answers."""
    log = open(store.parent / "mlflow-ui.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(1)
    proc.terminate()
    raise RuntimeError(f"mlflow ui did not answer on port {port} within 120 s: see {store.parent / 'mlflow-ui.log'}")


def compare_url(port: int, store: Path, versions: list[str]) -> str:
    """The UI's version comparison: ``name`` and ``runs`` ({version: run id}) are JSON in the query."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    runs = {v: client.get_model_version(NAME, v).run_id for v in versions}
    query = urllib.parse.urlencode({"name": json.dumps(NAME), "runs": json.dumps(runs)})
    return f"http://127.0.0.1:{port}/#/compare-model-versions?{query}"


# The metrics table scrolls inside a 400-px box: scroll it to the first headline/ row and let the box
# grow to hold every headline/ row (what a user sees after scrolling, in one image); returns their names.
HEADLINE_ROWS_JS = """
const rows = [...document.querySelectorAll('tbody.scrollable-table tr')];
const head = rows.filter(r => r.textContent.trim().startsWith('headline/'));
if (!head.length) return [];
const box = head[0].closest('tbody');
box.style.maxHeight = (head.reduce((h, r) => h + r.getBoundingClientRect().height, 0) + 8) + 'px';
box.scrollTop += head[0].getBoundingClientRect().top - box.getBoundingClientRect().top;
return head.map(r => r.querySelector('th, td').textContent.trim());
"""


def screenshot(url: str, out: Path, width: int, height: int) -> None:
    """Open ``url`` in headless Chromium, close the assistant panel, wait for the headline rows, save a PNG."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},{height}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        driver.get(url)
        WebDriverWait(driver, 90).until(lambda d: "headline/" in d.find_element(By.TAG_NAME, "body").text)
        for button in driver.find_elements(By.CSS_SELECTOR, "button[aria-label]"):
            label = (button.get_attribute("aria-label") or "").lower()
            if "close" in label and button.is_displayed():  # the "MLflow Assistant" side panel takes a third of the width
                button.click()
                break
        switches = driver.find_elements(By.CSS_SELECTOR, "[role=switch]")
        if switches and switches[-1].get_attribute("aria-checked") == "true":
            switches[-1].click()  # the Metrics section's "Show diff only": every headline row, equal or not
            time.sleep(1)
        shown = driver.execute_script(HEADLINE_ROWS_JS)
        time.sleep(2)
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
        body = driver.find_element(By.TAG_NAME, "body").text
    finally:
        driver.quit()
    missing = [w for w in ("Comparing 2 Versions", "Parameters", "lora.r", "Schema") if w not in body]
    missing += [w for w in ("headline/test_macro_f1", "headline/test_squad2_macro_f1", "headline/test_qed_macro_f1") if w not in shown]
    if missing:
        raise RuntimeError(f"the comparison page does not show {missing}: look at {out}")
    print("headline rows in view:", ", ".join(shown))


def shrink(png: Path) -> None:
    """Re-save as a 256-colour palette PNG (the UI's flat colours survive; the file gets ~3x smaller)."""
    from PIL import Image

    Image.open(png).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(png, optimize=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", type=Path, default=None, help="an existing mlruns folder (mlflow.db inside); default: build a tiny one")
    ap.add_argument("--versions", nargs=2, default=None, help="the two versions of suffice-sufficiency to compare (with --store)")
    ap.add_argument("--workdir", type=Path, default=None, help="where the tiny store is built (default: a temporary folder)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "2026-11-28" / "mlflow-compare.png")
    ap.add_argument("--size", default="1500x2300", help="browser window WIDTHxHEIGHT (the screenshot's size)")
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="suffice-mlflow-compare-"))
    if args.store:
        store, versions = args.store, args.versions or ["1", "2"]
    else:
        store, versions = build_store(workdir)
    port = free_port()
    ui = start_ui(store, port)
    try:
        url = compare_url(port, store, versions)
        print(f"comparing {NAME} versions {versions}: {url}")
        width, height = (int(x) for x in args.size.split("x"))
        screenshot(url, args.out, width, height)
    finally:
        ui.terminate()
        ui.wait(timeout=30)
    shrink(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB); store {store}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
