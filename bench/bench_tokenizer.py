"""Benchmark the BERTweet tokenizers: slow (transformers) vs FastBertweetTokenizer, tweets/s.

Why: the slow pure-Python tokenizer caps the embed worker's tokenisation at a
few thousand tweets/s; FastBertweetTokenizer must give the same ids, faster.
Texts are the bundled CrisisLexT26 feed (27,932 tweets). Without ``--model``
the fastBPE codes are learned from the feed's words (48,000 merges, like
bench/bench_encoder.py); with it, the model directory's ``vocab.txt`` +
``bpe.codes``.

Each setting runs in a subprocess of its own, since the Rust thread pool reads
``RAYON_NUM_THREADS`` once: ``1 thread`` (``RAYON_NUM_THREADS=1``,
``TOKENIZERS_PARALLELISM=false``) and ``default``. In each, a fresh slow
tokenizer over the texts twice, then a fresh fast one twice: ``cold`` (caches
empty, every segment and word new: a lower bound for a live stream) and
``warm`` (everything cached: the upper bound). The slow tokenizer caches its
BPE per word too, so ``warm x`` (fast warm / slow cold, the historical column)
is flattering: ``warm/warm x`` compares like with like. Batches of 1024, as
``reval tokenize`` uses. Ratios are taken within one subprocess (the machine
is shared and noisy); ``--repeat N`` runs all four passes N times, alternating,
and keeps each one's best. Every pass checks that the ids are identical.

    python bench/bench_tokenizer.py                 # prints a markdown table
    python bench/bench_tokenizer.py --json          # one JSON object per setting
    python bench/bench_tokenizer.py --model DIR --limit 5000 --repeat 3
    python -m bench.bench_tokenizer --command --repeat 3   # as a user runs it: `reval tokenize`

``--command`` times the command, not the tokenizer object: ``reval tokenize --model DIR`` and
``reval tokenize --model DIR --slow`` over the feed's texts (one per line), each a fresh
process -- cold as a user meets it: its imports, its tokenizer's load, every cache empty.
Runs alternate (fast, slow, slow, fast, ...); wall and CPU time of each (the child's own
rusage), the outputs' digests compared.
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FEED = REPO / "stream" / "data" / "crisislex-t26.jsonl.gz"
BATCH = 1024


def _slow_ids(slow: Any, max_length: int, batch: list[str]) -> list[list[int]]:
    return [list(x) for x in slow(batch, truncation=True, max_length=max_length)["input_ids"]]


def measure(model: str | None, limit: int | None, max_length: int, repeat: int = 1) -> dict[str, object]:
    """One setting, in this process: best rates of slow cold and warm, fast cold and warm."""
    from transformers import BertweetTokenizer

    from bench.bench_encoder import load_texts  # the child runs with PYTHONPATH = the repository
    from workers.adapters.encoding.bertweet_tokenizer import FastBertweetTokenizer
    from workers.dev.tiny_models import write_bertweet_tokenizer_files

    texts = load_texts(limit)
    with tempfile.TemporaryDirectory() as tmp:
        if model is None:
            words = Counter(w for t in load_texts(None) for w in t.split())
            vocab, merges = write_bertweet_tokenizer_files(Path(tmp), words, vocab_size=48_000)
            # Read while the files exist; each repetition gets a fresh copy (empty BPE cache).
            fresh = BertweetTokenizer(vocab_file=str(vocab), merges_file=str(merges), normalization=True)
        else:
            fresh = BertweetTokenizer.from_pretrained(model, normalization=True, local_files_only=True)

    def run(encode: object) -> tuple[float, list[list[int]]]:
        out: list[list[int]] = []
        start = time.perf_counter()
        for i in range(0, len(texts), BATCH):
            out += encode(texts[i : i + BATCH])  # type: ignore[operator]
        return len(texts) / (time.perf_counter() - start), out

    rates: dict[str, list[float]] = {"slow": [], "slow_warm": [], "cold": [], "warm": []}
    identical = True
    for _ in range(repeat):
        slow = copy.deepcopy(fresh)  # its BPE cache empty again
        slow_encode = functools.partial(_slow_ids, slow, max_length)
        rate, expected = run(slow_encode)
        rates["slow"].append(rate)
        rate, again = run(slow_encode)
        rates["slow_warm"].append(rate)
        fast_encode = functools.partial(
            FastBertweetTokenizer(copy.deepcopy(fresh)).encode_batch, max_length=max_length
        )
        rate, cold = run(fast_encode)
        rates["cold"].append(rate)
        rate, warm = run(fast_encode)
        rates["warm"].append(rate)
        identical = identical and again == expected and cold == expected and warm == expected
    best = {name: max(values) for name, values in rates.items()}
    return {
        "tweets": len(texts),
        "repeat": repeat,
        "slow_per_s": round(best["slow"]),
        "fast_cold_per_s": round(best["cold"]),
        "fast_warm_per_s": round(best["warm"]),
        "cold_x": round(best["cold"] / best["slow"], 1),
        "warm_x": round(best["warm"] / best["slow"], 1),
        "identical": identical,
        "slow_warm_per_s": round(best["slow_warm"]),
        "warm_warm_x": round(best["warm"] / best["slow_warm"], 1),
    }


def _timed(cmd: list[str], stdin: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """Run ``cmd`` with ``stdin``: its wall seconds, its CPU seconds (user + system, from the
    child's rusage) and the SHA-256 of its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with stdin.open("rb") as src:
        done = subprocess.run(cmd, stdin=src, capture_output=True, env=env, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, hashlib.sha256(done.stdout).hexdigest()


def command_mode(limit: int | None, repeat: int) -> dict[str, object]:
    """``reval tokenize`` fast against ``--slow``, each run a fresh process (module docstring)."""
    from bench.bench_encoder import load_texts
    from workers.dev.tiny_models import build_bertweet_like

    texts = load_texts(limit)
    reval = str(Path(sys.executable).with_name("reval"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    runs: dict[str, list[tuple[float, float]]] = {"fast": [], "slow": []}
    digests: dict[str, set[str]] = {"fast": set(), "slow": set()}
    with tempfile.TemporaryDirectory() as tmp:
        words = Counter(w for t in load_texts(None) for w in t.split())
        model = build_bertweet_like(Path(tmp) / "model", words=words, bpe_vocab_size=48_000)
        lines = Path(tmp) / "texts.txt"
        lines.write_text("".join(" ".join(t.splitlines()) + "\n" for t in texts), encoding="utf-8")
        order = ["fast", "slow", "slow", "fast"] * repeat
        for name in order[: 2 * repeat]:
            cmd = [reval, "tokenize", "--model", str(model), *(["--slow"] if name == "slow" else [])]
            wall, cpu, digest = _timed(cmd, lines, env)
            runs[name].append((wall, cpu))
            digests[name].add(digest)
    out: dict[str, object] = {"tweets": len(texts), "runs_each": repeat}
    for name, values in runs.items():
        out[f"{name}_wall_s"] = [round(w, 2) for w, _ in values]
        out[f"{name}_cpu_s"] = [round(c, 2) for _, c in values]
    for measure, at in (("wall", 0), ("cpu", 1)):
        fast = [v[at] for v in runs["fast"]]
        slow = [v[at] for v in runs["slow"]]
        out[f"{measure}_x_best"] = round(min(slow) / min(fast), 1)
        out[f"{measure}_x_median"] = round(statistics.median(slow) / statistics.median(fast), 1)
    out["identical"] = len(digests["fast"] | digests["slow"]) == 1
    return out


SETTINGS = {
    "1 thread": {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
    "default": {},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a BERTweet model directory (default: codes learned from the feed)")
    parser.add_argument("--limit", type=int, help="only the first N feed tweets")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=1, help="run every pass N times, keep each one's best")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    parser.add_argument("--command", action="store_true", help="time `reval tokenize` processes, cold")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.command:
        print(json.dumps(command_mode(args.limit, args.repeat), indent=1))
        return

    if args.child:  # one setting, environment already set by the parent
        print(json.dumps(measure(args.model, args.limit, args.max_length, args.repeat)))
        return

    results: dict[str, dict[str, object]] = {}
    for name, env in SETTINGS.items():
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--max-length",
            str(args.max_length),
            "--repeat",
            str(args.repeat),
        ]
        if args.model:
            cmd += ["--model", args.model]
        if args.limit:
            cmd += ["--limit", str(args.limit)]
        child_env = {
            k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")
        }
        child_env.update(env, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
        done = subprocess.run(cmd, env=child_env, capture_output=True, text=True, check=True)
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])

    if args.json:
        for name, row in results.items():
            print(json.dumps({"setting": name, **row}))
        return
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    print(f"## Tokenizer: slow BertweetTokenizer vs FastBertweetTokenizer ({machine})\n")
    print(
        "| setting | tweets | slow tweets/s | fast cold tweets/s | fast warm tweets/s "
        "| cold x | warm x | identical | slow warm tweets/s | warm/warm x |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['tweets']} | {r['slow_per_s']} | {r['fast_cold_per_s']} | {r['fast_warm_per_s']} "
            f"| {r['cold_x']} | {r['warm_x']} | {r['identical']} "
            f"| {r['slow_warm_per_s']} | {r['warm_warm_x']} |"
        )


if __name__ == "__main__":
    main()
