"""Screenshot what the MLflow UI shows of two registered versions of ``suffice-sufficiency``, in headless Chromium.

Three pages, each checked for what a user compares versions by: the experiment's runs table in
suffice's ``suffice-headline`` view (model-training mode, the headline metrics as columns), the
registered model's page (each version's description opens with its headline numbers), and MLflow's
side-by-side comparison of the two versions (their runs' params, the signature, every ``headline/``
metric).

    python benchmarks/mlflow_compare_screenshot.py                       # build a tiny store, 2 versions
    python benchmarks/mlflow_compare_screenshot.py --store /tmp/mlruns --versions 1 2   # an existing store
    python benchmarks/mlflow_compare_screenshot.py --out-dir benchmarks/results/2026-12-02   # mlflow-{runs,versions,compare}.png

Without ``--store`` it trains two tiny random models (all-MiniLM-L6-v2's tokenizer, a 2-layer
32-wide BERT: the test suite's recipe) on ``tests/fixtures/train20.jsonl`` plus one validation
row marked ``wiki-synthetic`` (the real data's validation-only source), with different ``lora.r``
and learning rates, exports and registers each (versions 1 and 2) into ``<workdir>/mlruns``. Their
numbers only show that the code paths work. Then it starts ``mlflow ui --workers 1`` on
127.0.0.1 and opens the three pages in Chromium (Debian's ``chromium`` + ``chromium-driver``,
driven by selenium: ``pip install 'suffice[screenshots]'``), closing the assistant side panel; on
the comparison it turns the Metrics section's "Show diff only" off and scrolls its table to the
``headline/`` rows (letting that 400-px box grow to hold them all). PNGs are saved as palettes.

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
    """``mlflow ui`` on the store with one worker (what ``make mlflow-ui`` runs); waits until it answers.
    Its log goes inside the store (``mlruns/`` is never committed), not beside it in the working tree."""
    log = open(store / "mlflow-ui.log", "w")
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
    raise RuntimeError(f"mlflow ui did not answer on port {port} within 120 s: see {store / 'mlflow-ui.log'}")


def compare_url(port: int, store: Path, versions: list[str]) -> str:
    """The UI's version comparison of ``versions`` (:func:`suffice.training.tracking.compare_versions_url`)."""
    from mlflow.tracking import MlflowClient

    from suffice.training.tracking import compare_versions_url

    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    return compare_versions_url(NAME, {v: client.get_model_version(NAME, v).run_id for v in versions}, f"http://127.0.0.1:{port}")


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


def chromium(width: int, height: int):
    """Headless Debian Chromium driven by selenium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},{height}"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def open_page(driver, url: str, wait_for: str) -> str:
    """Load ``url``, wait until the page shows ``wait_for``, close the "MLflow Assistant" side panel (a
    third of the width); returns the page text."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, 90).until(lambda d: wait_for in d.find_element(By.TAG_NAME, "body").text)
    for button in driver.find_elements(By.CSS_SELECTOR, "button[aria-label]"):
        label = (button.get_attribute("aria-label") or "").lower()
        if "close" in label and button.is_displayed():
            button.click()
            break
    time.sleep(2)
    return driver.find_element(By.TAG_NAME, "body").text


def screenshot_compare(driver, url: str, out: Path) -> None:
    """The comparison of two versions, with every ``headline/`` row of its Metrics table in view."""
    from selenium.webdriver.common.by import By

    body = open_page(driver, url, "headline/")
    switches = driver.find_elements(By.CSS_SELECTOR, "[role=switch]")
    if switches and switches[-1].get_attribute("aria-checked") == "true":
        switches[-1].click()  # the Metrics section's "Show diff only": every headline row, equal or not
        time.sleep(1)
    shown = driver.execute_script(HEADLINE_ROWS_JS)
    time.sleep(2)
    driver.save_screenshot(str(out))
    missing = [w for w in ("Comparing 2 Versions", "Parameters", "Run Name", "Schema") if w not in body]
    missing += [w for w in ("headline/val_source_mean_macro_f1", "headline/val_squad2_macro_f1", "headline/val_qed_macro_f1") if w not in shown]
    if missing:
        raise RuntimeError(f"the comparison page does not show {missing}: look at {out}")
    print("headline rows in view:", ", ".join(shown))


def screenshot_runs(driver, url: str, out: Path, run_names: list[str]) -> None:
    """The experiment's runs table in its ``suffice-headline`` view: the headline metrics as columns."""
    body = open_page(driver, url, run_names[0])
    driver.save_screenshot(str(out))
    missing = [w for w in (*run_names, "headline/val_source_mean_macro_f1", "Models") if w not in body]
    if "GenAI" in driver.current_url or "overview" in driver.current_url:
        missing.append("the runs table (the UI opened the GenAI overview)")
    if missing:
        raise RuntimeError(f"the runs table does not show {missing}: look at {out}")


def screenshot_versions(driver, url: str, out: Path, versions: list[str]) -> None:
    """The registered model's page: its versions, each description opening with the headline numbers."""
    body = open_page(driver, url, "Versions")
    driver.save_screenshot(str(out))
    missing = [w for w in (*(f"Version {v}" for v in versions), "val source-mean F1") if w not in body]
    if missing:
        raise RuntimeError(f"the registered model's page does not show {missing}: look at {out}")


def shrink(png: Path) -> None:
    """Re-save as a 256-colour palette PNG (the UI's flat colours survive; the file gets ~3x smaller)."""
    from PIL import Image

    Image.open(png).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(png, optimize=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", type=Path, default=None, help="an existing mlruns folder (mlflow.db inside); default: build a tiny one")
    ap.add_argument("--versions", nargs=2, default=None, help="the two versions of suffice-sufficiency to compare (with --store)")
    ap.add_argument("--workdir", type=Path, default=None, help="where the tiny store is built (default: a temporary folder)")
    ap.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results" / time.strftime("%Y-%m-%d"),
                    help="where mlflow-runs.png, mlflow-compare.png and mlflow-versions.png go")
    ap.add_argument("--size", default="1600x2300", help="browser window WIDTHxHEIGHT of the comparison (the others are 1600x900)")
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="suffice-mlflow-compare-"))
    if args.store:
        store, versions = args.store, args.versions or ["1", "2"]
    else:
        store, versions = build_store(workdir)
    from mlflow.tracking import MlflowClient

    from suffice.training.tracking import runs_table_url

    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}", registry_uri=f"sqlite:///{store / 'mlflow.db'}")
    runs = [client.get_run(client.get_model_version(NAME, v).run_id) for v in versions]
    port = free_port()
    ui = start_ui(store, port)
    outs = {k: args.out_dir / f"mlflow-{k}.png" for k in ("runs", "compare", "versions")}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{port}"
    try:
        width, height = (int(x) for x in args.size.split("x"))
        driver = chromium(width, 900)
        try:
            screenshot_runs(driver, runs_table_url(runs[0].info.experiment_id, base), outs["runs"], [r.info.run_name for r in runs])
            driver.set_window_size(width, 1700)  # both versions' rows, each as tall as its tags
            screenshot_versions(driver, f"{base}/#/models/{NAME}", outs["versions"], versions)
            driver.set_window_size(width, height)
            url = compare_url(port, store, versions)
            print(f"comparing {NAME} versions {versions}: {url}")
            screenshot_compare(driver, url, outs["compare"])
        finally:
            driver.quit()
    finally:
        ui.terminate()
        ui.wait(timeout=30)
    for png in outs.values():
        shrink(png)
        print(f"wrote {png} ({png.stat().st_size // 1024} KiB)")
    print(f"store {store}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
