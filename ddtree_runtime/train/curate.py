"""Curation: prompts in, a deduplicated, filtered, split prompt set out, with the target's own
responses (self-distillation) and a manifest of what was done.

Sources are JSONL (`prompt`, `text`, or chat `messages` fields), plain text (one prompt per
non-empty line, or per blank-line-separated paragraph), or an HF dataset name when the host is
online. Near duplicates are found with MinHash over word 3-gram shingles and banded LSH, so the cost
stays linear in the number of prompts. The held-out split is by a hash of the normalised prompt, so
it is stable across reruns and machines.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

_WORD = re.compile(r"\w+")
_HF_NAME = re.compile(r"[\w.-]+/[\w.-]+")  # owner/name: a path that is missing is not one
_PRIME = (1 << 61) - 1


class CurationError(ValueError):
    """A prompt source that cannot be read; the message names the file, line and fix."""


@dataclass(frozen=True)
class Filters:
    min_chars: int = 8
    max_chars: int = 4000
    near_dup_threshold: float = 0.8  # estimated Jaccard of word 3-gram shingles
    held_out_fraction: float = 0.05


def _prompt_of(row: object, where: str) -> str:
    if isinstance(row, str):
        return row
    if isinstance(row, dict):
        for key in ("prompt", "text", "instruction", "question"):
            if isinstance(row.get(key), str):
                return row[key]
        messages = row.get("messages") or row.get("conversations")
        if isinstance(messages, list):
            for m in messages:
                if isinstance(m, dict) and m.get("role", m.get("from")) in ("user", "human"):
                    return str(m.get("content", m.get("value", "")))
    raise CurationError(
        f"{where}: no prompt field (fix: give 'prompt', 'text' or chat 'messages' with a user turn)"
    )


def read_prompts(source: str, split: str = "train", limit: int | None = None) -> Iterator[str]:
    """Prompts from a .jsonl/.txt file or directory of them, else an HF dataset name."""
    path = Path(source)
    if path.is_dir():
        for f in sorted(path.iterdir()):
            if f.suffix in (".jsonl", ".txt", ".py", ".md"):
                yield from read_prompts(str(f))
        return
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise CurationError(f"{path}:{n}: invalid JSON: {e.msg}") from None
                    yield _prompt_of(row, f"{path}:{n}")
        return
    if path.exists():
        text = path.read_text(encoding="utf-8", errors="replace")
        parts = text.split("\n\n") if "\n\n" in text else text.splitlines()
        yield from (p for p in parts if p.strip())
        return
    if not _HF_NAME.fullmatch(source) or path.suffix in (".jsonl", ".txt", ".json"):
        raise CurationError(f"{source}: no such file, and not an HF dataset name (fix: a path or owner/name)")
    try:
        import datasets  # optional: only for online hosts
    except ImportError:
        raise CurationError(f"{source}: reading an HF dataset needs `pip install datasets`") from None
    rows = datasets.load_dataset(source, split=split, streaming=True)
    for i, row in enumerate(rows):
        if limit is not None and i >= limit:
            return
        yield _prompt_of(row, f"{source}[{i}]")


def normalise(text: str) -> str:
    """Lower-cased words joined by single spaces: what 'the same prompt' means for exact dedup."""
    return " ".join(_WORD.findall(text.lower()))


def _shingles(norm: str) -> set[int]:
    words = norm.split()
    grams = [" ".join(words[i : i + 3]) for i in range(max(1, len(words) - 2))]
    return {int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "little") for g in grams}


class NearDuplicates:
    """MinHash signatures with banded LSH: `seen(text)` is True for a near copy of an earlier text."""

    def __init__(self, threshold: float, num_perm: int = 64) -> None:
        self.bands = next(b for b in (4, 8, 16, 32, 64) if (1 / b) ** (b / num_perm) <= threshold)
        self.rows = num_perm // self.bands
        self.threshold = threshold
        self.coeffs = [(2 * i + 1, 7919 * i + 17) for i in range(num_perm)]
        self.buckets: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(self.bands)]
        self.sigs: list[tuple[int, ...]] = []

    def seen(self, norm: str) -> bool:
        sh = _shingles(norm)
        sig = tuple(min((a * s + b) % _PRIME for s in sh) for a, b in self.coeffs)
        keys = [sig[i * self.rows : (i + 1) * self.rows] for i in range(self.bands)]
        for band, key in zip(self.buckets, keys, strict=True):
            for j in band.get(key, ()):
                other = self.sigs[j]
                if sum(x == y for x, y in zip(sig, other, strict=True)) / len(sig) >= self.threshold:
                    return True
        idx = len(self.sigs)
        self.sigs.append(sig)
        for band, key in zip(self.buckets, keys, strict=True):
            band.setdefault(key, []).append(idx)
        return False


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def curate(
    prompts: Iterable[str], filters: Filters, held_out: Iterable[str] = ()
) -> tuple[list[str], list[str], dict[str, int]]:
    """(train, held_out, counts): exact and near duplicates dropped, lengths filtered, split by hash.

    Prompts from `held_out` (e.g. files kept apart on purpose) all go to the held-out side, and
    come first, so a training prompt that duplicates one of them is the one dropped."""
    counts = dict.fromkeys(("read", "too_short", "too_long", "exact_dup", "near_dup", "train", "held_out"), 0)
    exact: set[str] = set()
    near = NearDuplicates(filters.near_dup_threshold)
    train, held = [], []
    for forced, text in [*((True, p) for p in held_out), *((False, p) for p in prompts)]:
        counts["read"] += 1
        text = text.strip()
        if len(text) < filters.min_chars:
            counts["too_short"] += 1
            continue
        if len(text) > filters.max_chars:
            counts["too_long"] += 1
            continue
        norm = normalise(text)
        key = _digest(norm)
        if key in exact:
            counts["exact_dup"] += 1
            continue
        exact.add(key)
        if near.seen(norm):
            counts["near_dup"] += 1
            continue
        if forced or int(key[:8], 16) / 0xFFFFFFFF < filters.held_out_fraction:
            held.append(text)
            counts["held_out"] += 1
        else:
            train.append(text)
            counts["train"] += 1
    return train, held, counts


def _write_jsonl(path: Path, rows: Iterable[dict[str, object]]) -> str:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    tmp.replace(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_prompt_sets(
    out: Path, sources: list[str], filters: Filters, limit: int | None = None, held_sources: list[str] = ()
) -> dict[str, object]:
    """`prompts.train.jsonl`, `prompts.held_out.jsonl` and `manifest.json` under `out`; kept when the
    manifest already records the same sources and filters (curation is then done)."""
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    wanted = {
        "sources": sources,
        "held_out_sources": list(held_sources),
        "filters": asdict(filters),
        "limit": limit,
    }
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if {k: manifest.get(k) for k in wanted} == wanted:
            return manifest

    def every() -> Iterator[str]:
        n = 0
        for s in sources:
            for p in read_prompts(s, limit=limit):
                if limit is not None and n >= limit:
                    return
                n += 1
                yield p

    held_out = (p for s in held_sources for p in read_prompts(s))
    train, held, counts = curate(every(), filters, held_out)
    manifest = {
        **wanted,
        "counts": counts,
        "sha256": {
            "prompts.train.jsonl": _write_jsonl(out / "prompts.train.jsonl", ({"prompt": p} for p in train)),
            "prompts.held_out.jsonl": _write_jsonl(
                out / "prompts.held_out.jsonl", ({"prompt": p} for p in held)
            ),
        },
    }
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def regenerate(
    prompts_file: Path,
    out_file: Path,
    generate: Callable[[list[str]], list[tuple[list[int], list[int]]]],
    batch: int = 16,
    progress: Callable[[int, int], None] | None = None,
    shard: tuple[int, int] = (0, 1),
) -> int:
    """Append `{"id", "sha256", "prompt_ids", "response_ids"}` rows for prompts not yet in `out_file`.

    `generate` maps a batch of prompts to (prompt_ids, response_ids) from the target itself. Rows
    are keyed by the prompt's hash: each batch is appended and flushed whole, and on resume a torn
    last line (a kill mid-write) and rows of prompts no longer in the set are dropped, so a rerun
    continues where the last one stopped. `shard` (rank, world) keeps the prompts whose index is
    rank modulo world: one rank's share of a job. Returns the rows written now.
    """
    lines = prompts_file.read_text(encoding="utf-8").splitlines()
    rank, world = shard
    prompts = [json.loads(line)["prompt"] for line in lines if line]
    keys = {_digest(p): i for i, p in enumerate(prompts) if i % world == rank}
    done: set[str] = set()
    if out_file.exists():
        text = out_file.read_text(encoding="utf-8")
        good = []
        for line in text.splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if keys.get(row.get("sha256")) == row.get("id"):
                done.add(row["sha256"])
                good.append(line + "\n")
        if "".join(good) != text:
            out_file.write_text("".join(good), encoding="utf-8")
    todo = [i for i, p in enumerate(prompts) if i % world == rank and _digest(p) not in done]
    written = 0
    if not todo:
        return 0
    with out_file.open("a", encoding="utf-8") as fh:
        for s in range(0, len(todo), batch):
            ids = todo[s : s + batch]
            results = generate([prompts[i] for i in ids])
            rows = (
                {"id": i, "sha256": _digest(prompts[i]), "prompt_ids": p, "response_ids": r}
                for i, (p, r) in zip(ids, results, strict=True)
            )
            fh.write("".join(json.dumps(row) + "\n" for row in rows))
            fh.flush()
            written += len(ids)
            if progress is not None:
                progress(len(done) + written, len(keys))
    return written


def read_samples(path: Path) -> list[tuple[list[int], int]]:
    """(token ids of prompt + response, prompt length) per regenerated row, in id order."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    rows.sort(key=lambda r: r["id"])
    return [(r["prompt_ids"] + r["response_ids"], len(r["prompt_ids"])) for r in rows]
