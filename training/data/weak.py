"""``suffice weak``: rule-based weak supervision for an intermediate training stage (FactCC-style).

From the train rows that the labels call *sufficient*, build minimal pairs for free: the same
passage with a question edited so that the passage no longer answers it, and (as positives) the
same question with a passage edited in a way that keeps the answer. A model first trained on these
pairs learns to check that what the question names is actually in the context, which is exactly
how SQuAD 2.0's adversarial "looks answerable but is not" questions were written; it is then
fine-tuned on the real labels (``--base_model=<the stage-1 model directory>``).

Rules (each pair is flagged ``variant=<rule>``, ``parent_id``, ``label_source="weak"``):

``swap_entity`` (label 0)
    A name in the question that the context contains is replaced by a name of the same length
    (in words) taken from another item's question, one the context does not contain.
``swap_number`` (label 0)
    A number or year in the question that the context contains is replaced by one the context
    does not contain (years move by 1-30 years, other numbers by a factor or an offset).
``swap_term`` (label 0)
    A content word of the question that the context contains is replaced by a word of the same
    suffix class (-ing, -ed, -s, other) from another passage that the context does not contain:
    the question now asks about an attribute or event the passage lacks.
``drop_other_sentence`` (label 1)
    One sentence that holds no answer string and shares no content term with the question is
    removed from the context; the answer is still there, so the label stays sufficient (without
    these, "the context was edited" would predict the label).

Only train rows are used (never validation or test) and every pair stays in its parent's group.
Choices are deterministic per (seed, rule, parent id). The output is one canonical JSONL file
that ``suffice train --train_file`` reads: the weak pairs and their parents (split ``train``) and
the prepared validation and test rows with their real labels, so stage 1 early-stops and is
tested on the same real items as every other run. A manifest with the counts per rule and the
input hash sits beside it (``<out>.manifest.json``).

    suffice weak --config configs/sufficiency.yaml --out data/weak/demo-weak.jsonl [--data.sources=[squad2] ...]
    suffice train --config configs/weak-pretrain.yaml            # stage 1 on the weak pairs
    suffice train --config configs/sufficiency.yaml --base_model=models/weak-stage1   # stage 2

>>> parent = {"id": "s:1", "question": "When did Chopin move to Paris?", "label": 1, "source": "s", "group": "g1",
...           "passages": [{"title": "Chopin", "text": "Chopin moved to Paris in 1831. He was a pianist."}], "answers": ["1831"]}
>>> other = {"id": "s:2", "question": "Who taught Liszt in Vienna?", "label": 1, "source": "s", "group": "g2",
...          "passages": [{"title": "Liszt", "text": "Czerny taught Liszt in Vienna from 1822."}], "answers": ["Czerny"]}
>>> pairs = make_weak_pairs([parent, other], WeakConfig(rules=["swap_entity"]))
>>> [(p["question"], p["label"]) for p in pairs if p["parent_id"] == "s:1"]
[('When did Vienna move to Paris?', 0)]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from suffice.serving.lexical import QUESTION_WORDS, STOPWORDS, entities, tokenize_words
from suffice.serving.packing import split_sentences
from suffice.training.data.records import write_jsonl_atomic

RULES = ("swap_entity", "swap_number", "swap_term", "drop_other_sentence")
POSITIVE_RULES = frozenset({"drop_other_sentence"})
_NUM = re.compile(r"^\d[\d,]*(?:\.\d+)?$")
_YEAR = re.compile(r"^(1[0-9]|20)\d\d$")
_YES_NO = {"yes", "no"}


class WeakConfigError(ValueError):
    """A weak-supervision setting is invalid; the message names the fix."""


@dataclass
class WeakConfig:
    """How many weak pairs to build and with which rules.

    rules: which rules (see the module docstring); default all four.
    per_parent: at most this many pairs per parent (one per rule, rules taken in a seeded order).
    max_pairs: keep a seeded sample of at most this many pairs (0 = all).
    include_parents: add each parent (label 1) to the stage-1 train rows, so every negative has
        its unedited twin in the same data.
    seed: seed for every choice.
    """

    rules: list[str] = field(default_factory=lambda: list(RULES))
    per_parent: int = 3
    max_pairs: int = 0
    include_parents: bool = True
    seed: int = 13

    def __post_init__(self) -> None:
        bad = [r for r in self.rules if r not in RULES]
        if bad or not self.rules:
            raise WeakConfigError(f"rules {bad or '[]'}: choose one or more of {list(RULES)}")
        if self.per_parent < 1:
            raise WeakConfigError(f"per_parent={self.per_parent} must be >= 1")
        if self.max_pairs < 0:
            raise WeakConfigError(f"max_pairs={self.max_pairs} must be >= 0 (0 = keep all)")


def _context(row: Mapping[str, Any]) -> str:
    return "\n".join(f"{p.get('title') or ''}\n{p.get('text') or ''}" for p in row["passages"])


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", text, flags=re.IGNORECASE) is not None


def _replace_first(text: str, old: str, new: str) -> str:
    return re.sub(rf"(?<![A-Za-z0-9]){re.escape(old)}(?![A-Za-z0-9])", lambda _m: new, text, count=1)


def _suffix_class(word: str) -> str:
    for suf in ("ing", "ed", "s"):
        if word.endswith(suf):
            return suf
    return ""


def _is_term(word: str) -> bool:
    return word.isalpha() and word.islower() and len(word) >= 4 and word not in STOPWORDS and word not in QUESTION_WORDS


class _Pools:
    """Replacement candidates gathered from all parents: names by source and word count, terms by suffix."""

    def __init__(self, parents: Sequence[Mapping[str, Any]]):
        names: dict[tuple[str, int], set[str]] = defaultdict(set)
        terms: dict[str, set[str]] = defaultdict(set)
        for r in parents:
            ctx = _context(r)
            for e in entities(r["question"]):
                if not _NUM.match(e) and e in ctx and e.split()[0].lower() not in STOPWORDS:
                    names[(r["source"], len(e.split()))].add(e)
            for p in r["passages"]:
                for w in tokenize_words(p.get("text") or ""):
                    if _is_term(w):
                        terms[_suffix_class(w)].add(w)
        self.names = {k: sorted(v) for k, v in names.items()}
        self.terms = {k: sorted(v) for k, v in terms.items()}

    @staticmethod
    def _pick(pool: Sequence[str], ctx: str, question: str, rng: random.Random, ok=lambda c: True) -> str | None:
        """A seeded draw (20 tries) of a candidate that neither the context nor the question contains."""
        for _ in range(20 if pool else 0):
            cand = pool[rng.randrange(len(pool))]
            if ok(cand) and not _has_word(ctx, cand) and not _has_word(question, cand):
                return cand
        return None

    def name_for(self, source: str, n_words: int, ctx: str, question: str, rng: random.Random) -> str | None:
        pool = self.names.get((source, n_words)) or self.names.get((source, 1)) or []
        return self._pick(pool, ctx, question, rng)

    def term_for(self, word: str, ctx: str, question: str, rng: random.Random) -> str | None:
        return self._pick(self.terms.get(_suffix_class(word)) or [], ctx, question, rng, ok=lambda c: c[:4] != word[:4])


def _other_number(n: str, ctx: str, rng: random.Random) -> str | None:
    plain = n.replace(",", "")
    for _ in range(20):
        if _YEAR.match(plain):
            cand = str(int(plain) + rng.choice([-1, 1]) * rng.randint(1, 30))
        elif "." in plain:
            cand = f"{float(plain) * rng.choice([0.5, 2, 3, 1.5]):.{len(plain.split('.')[1])}f}"
        else:
            v = int(plain)
            cand = str(rng.choice([v + rng.randint(1, 9), max(v - rng.randint(1, 9), 0), v * rng.choice([2, 3, 10])]))
        if cand != plain and not _has_word(ctx, cand) and not _has_word(ctx.replace(",", ""), cand):
            return cand
    return None


def _swap_entity(row, ctx, pools: _Pools, rng) -> tuple[str, dict] | None:
    names = [e for e in entities(row["question"]) if not _NUM.match(e) and e in ctx]
    rng.shuffle(names)
    for e in names:
        new = pools.name_for(row["source"], len(e.split()), ctx, row["question"], rng)
        if new:
            return _replace_first(row["question"], e, new), {"from": e, "to": new}
    return None


def _swap_number(row, ctx, pools: _Pools, rng) -> tuple[str, dict] | None:
    nums = [e for e in entities(row["question"]) if _NUM.match(e) and _has_word(ctx, e)]
    rng.shuffle(nums)
    for n in nums:
        new = _other_number(n, ctx, rng)
        if new:
            return _replace_first(row["question"], n, new), {"from": n, "to": new}
    return None


def _swap_term(row, ctx, pools: _Pools, rng) -> tuple[str, dict] | None:
    words = [w for w in dict.fromkeys(tokenize_words(row["question"])) if _is_term(w) and _has_word(ctx, w)]
    rng.shuffle(words)
    for w in words:
        new = pools.term_for(w, ctx, row["question"], rng)
        if new:
            return _replace_first(row["question"], w, new), {"from": w, "to": new}
    return None


def _drop_other_sentence(row, answers: Sequence[str], rng) -> tuple[list[dict], dict] | None:
    answers = [a for a in answers if a and a.strip().lower() not in _YES_NO]
    if not answers:
        return None
    q_terms = {w.lower() for w in tokenize_words(row["question"]) if w.lower() not in STOPWORDS and len(w) > 2}
    cands = []
    for i, p in enumerate(row["passages"]):
        sents = split_sentences(p.get("text") or "")
        if len(sents) < 2:
            continue
        for j, s in enumerate(sents):
            low = s.lower()
            if any(a.lower() in low for a in answers):
                continue
            if q_terms & {w.lower() for w in tokenize_words(s)}:
                continue
            cands.append((i, j, sents))
    if not cands:
        return None
    i, j, sents = cands[rng.randrange(len(cands))]
    passages = [dict(p) for p in row["passages"]]
    passages[i]["text"] = " ".join(s for k, s in enumerate(sents) if k != j)
    return passages, {"dropped_sentence": sents[j]}


def make_weak_pairs(parents: Sequence[Mapping[str, Any]], cfg: WeakConfig | None = None,
                    answers: Mapping[str, Sequence[str]] | None = None) -> list[dict[str, Any]]:
    """Weak pairs (canonical item dicts) built from ``parents`` (rows labelled sufficient).

    A parent row needs ``id, question, passages, source, group``; its answer strings come from
    ``answers[id]`` or the row's own ``answers`` (only ``drop_other_sentence`` needs them).
    """
    cfg = cfg or WeakConfig()
    answers = answers or {}
    parents = [p for p in parents if p["passages"]]
    pools = _Pools(parents)
    out: list[dict[str, Any]] = []
    for row in parents:
        ctx = _context(row)
        row_answers = list(answers.get(row["id"]) or row.get("answers") or [])
        rules = list(cfg.rules)
        random.Random(f"{cfg.seed}:order:{row['id']}").shuffle(rules)
        made = 0
        for rule in rules:
            if made >= cfg.per_parent:
                break
            rng = random.Random(f"{cfg.seed}:{rule}:{row['id']}")
            passages, question, label = row["passages"], row["question"], 0
            if rule == "drop_other_sentence":
                got = _drop_other_sentence(row, row_answers, rng)
                if got is None:
                    continue
                passages, edit = got
                label = 1
            else:
                fn = {"swap_entity": _swap_entity, "swap_number": _swap_number, "swap_term": _swap_term}[rule]
                got = fn(row, ctx, pools, rng)
                if got is None:
                    continue
                question, edit = got
            made += 1
            out.append({
                "id": f"{row['id']}#weak-{rule}", "question": question,
                "passages": [{"title": p.get("title") or "", "text": p.get("text") or ""} for p in passages],
                "label": label, "level": "sufficient" if label else "insufficient", "label_source": "weak",
                "split": "train", "source": row["source"], "group": row["group"], "variant": rule,
                "parent_id": row["id"], "gold": {"answers": row_answers if label else []},
                "meta": {"weak_edit": edit},
            })
    if cfg.max_pairs and len(out) > cfg.max_pairs:
        keep = sorted(random.Random(f"{cfg.seed}:sample").sample(range(len(out)), cfg.max_pairs))
        out = [out[i] for i in keep]
    return out


def _row_to_item(row: Mapping[str, Any], answers: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    label = int(row["label"])
    return {
        "id": row["id"], "question": row["question"],
        "passages": [{"title": p.get("title") or "", "text": p.get("text") or ""} for p in row["passages"]],
        "label": None if label < 0 else label, "level": row.get("level") or None,
        "label_source": row.get("label_source") or None, "split": row["split"], "source": row["source"],
        "group": row["group"], "variant": row.get("variant") or None, "parent_id": row.get("parent_id") or None,
        "gold": {"answers": list(answers.get(row["id"]) or [])},
    }


def build_weak_file(dsd, out: str | os.PathLike, cfg: WeakConfig, answers: Mapping[str, Sequence[str]],
                    source_manifest: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write the stage-1 JSONL (weak pairs + parents as train, real validation/test rows) and its manifest.

    Written beside the target and renamed, so an interrupted run never leaves half a file.
    Returns the manifest.
    """
    missing = [s for s in ("train", "validation") if s not in dsd or len(dsd[s]) == 0]
    if missing:
        raise WeakConfigError(f"the prepared data has no {missing} rows: check the config's data: section")
    train = [dict(r, split="train") for r in dsd["train"]]
    parents = [r for r in train if int(r["label"]) == 1 and not r.get("variant")]
    if not parents:
        raise WeakConfigError("no train row is labelled sufficient (label 1): weak pairs are built from sufficient parents")
    pairs = make_weak_pairs(parents, cfg, answers)
    rows: list[dict[str, Any]] = pairs + ([_row_to_item(r, answers) for r in parents] if cfg.include_parents else [])
    for split in ("validation", "test"):
        if split in dsd:
            rows += [_row_to_item(dict(r, split=split), answers) for r in dsd[split]]
    out = Path(out)
    rows_sha256 = write_jsonl_atomic(rows, out)
    by_rule = Counter(p["variant"] for p in pairs)
    manifest = {
        "file": str(out), "sha256_of_rows": rows_sha256, "config": asdict(cfg),
        "parents": len(parents), "pairs": len(pairs), "pairs_by_rule": dict(sorted(by_rule.items())),
        "pairs_by_label": dict(sorted(Counter(p["label"] for p in pairs).items())),
        "rows_by_split": dict(sorted(Counter(r["split"] for r in rows).items())),
        "source_data_hash": (source_manifest or {}).get("data_hash"), "source_data": (source_manifest or {}).get("name"),
        "examples": examples(pairs),
    }
    Path(f"{out}.manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def examples(pairs: Iterable[Mapping[str, Any]], per_rule: int = 2) -> list[str]:
    """A few edits per rule, for the command's printout."""
    seen: Counter = Counter()
    lines = []
    for p in pairs:
        if seen[p["variant"]] < per_rule:
            seen[p["variant"]] += 1
            lines.append(f"  {p['variant']:<20} {json.dumps(p['meta']['weak_edit'], ensure_ascii=False)[:110]}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="suffice weak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/sufficiency.yaml", help="training config whose data: section names the train rows")
    ap.add_argument("--out", required=True, help="output JSONL (stage-1 --train_file)")
    ap.add_argument("--rules", default=",".join(RULES), help=f"comma-separated subset of {','.join(RULES)}")
    ap.add_argument("--per-parent", type=int, default=3, help="at most this many pairs per parent")
    ap.add_argument("--max-pairs", type=int, default=0, help="keep a seeded sample of at most N pairs (0 = all)")
    ap.add_argument("--no-parents", action="store_true", help="leave the unedited parents out of the stage-1 train rows")
    ap.add_argument("--seed", type=int, default=13)
    return ap


def main(argv: list[str] | None = None) -> int:
    # unknown --key=value arguments are overrides of the training config, as for `suffice train`
    args, overrides = build_parser().parse_known_args(argv)
    from suffice.serving.config import ConfigError
    from suffice.training.data.builder import answers_by_id, prepare
    from suffice.training.fit.config import build_train_config

    try:
        wcfg = WeakConfig(rules=[r.strip() for r in args.rules.split(",") if r.strip()], per_parent=args.per_parent,
                          max_pairs=args.max_pairs, include_parents=not args.no_parents, seed=args.seed)
        tcfg = build_train_config(args.config, overrides)
        if tcfg.task != "sufficiency" or tcfg.train_file:
            raise WeakConfigError(f"{args.config} must be a sufficiency config with a data: section (task={tcfg.task}, train_file={tcfg.train_file})")
        dsd, src_manifest = prepare(tcfg.data_config(), progress=False)
        manifest = build_weak_file(dsd, args.out, wcfg, answers_by_id(dsd["train"]), src_manifest)
    except (WeakConfigError, ConfigError, FileNotFoundError) as e:
        print(f"suffice weak: {e}", file=sys.stderr)
        return 2
    print(f"{manifest['pairs']} weak pairs from {manifest['parents']} sufficient train parents -> {manifest['file']}")
    print(f"  by rule {manifest['pairs_by_rule']}, by label {manifest['pairs_by_label']}, rows by split {manifest['rows_by_split']}")
    print("\n".join(manifest["examples"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
