"""Benchmark the BERTweet tokenizers: slow (transformers) vs FastBertweetTokenizer, tweets/s.

Why: the slow pure-Python tokenizer caps the embed worker's tokenisation at a
few thousand tweets/s; FastBertweetTokenizer must give the same ids, faster.
Texts are the bundled CrisisLexT26 feed (27,932 tweets). Without ``--model``
the fastBPE codes are learned from the feed's words (48,000 merges, like
bench/bench_encoder.py); with it, the model directory's ``vocab.txt`` +
``bpe.codes``.

Each setting runs in a subprocess of its own, since the Rust thread pool reads
``RAYON_NUM_THREADS`` once: ``1 thread`` (``RAYON_NUM_THREADS=1``,
``TOKENIZERS_PARALLELISM=false``) and ``default``. In each, one pass of the
slow tokenizer, then a fresh fast one over the same texts twice: ``cold`` (its
caches empty, every segment and word new to it: a lower bound for a live
stream) and ``warm`` (everything cached: the upper bound). Batches of 1024, as
``reval tokenize`` uses. Ratios are taken within one subprocess (the machine
is shared and noisy). Every pass checks that the ids are identical.

    python bench/bench_tokenizer.py                 # prints a markdown table
    python bench/bench_tokenizer.py --json          # one JSON object per setting
    python bench/bench_tokenizer.py --model DIR --limit 5000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FEED = REPO / "stream" / "data" / "crisislex-t26.jsonl.gz"
BATCH = 1024


def measure(model: str | None, limit: int | None, max_length: int) -> dict[str, object]:
    """One setting, in this process: rates of slow, fast cold and fast warm."""
    from transformers import BertweetTokenizer

    from bench.bench_encoder import load_texts  # the child runs with PYTHONPATH = the repository
    from workers.adapters.bertweet_tokenizer import FastBertweetTokenizer
    from workers.dev.tiny_models import write_bertweet_tokenizer_files

    texts = load_texts(limit)
    with tempfile.TemporaryDirectory() as tmp:
        if model is None:
            words = Counter(w for t in load_texts(None) for w in t.split())
            vocab, merges = write_bertweet_tokenizer_files(Path(tmp), words, vocab_size=48_000)
            slow = BertweetTokenizer(vocab_file=str(vocab), merges_file=str(merges), normalization=True)
        else:
            slow = BertweetTokenizer.from_pretrained(model, normalization=True, local_files_only=True)

    def run(encode: object) -> tuple[float, list[list[int]]]:
        out: list[list[int]] = []
        start = time.perf_counter()
        for i in range(0, len(texts), BATCH):
            out += encode(texts[i : i + BATCH])  # type: ignore[operator]
        return len(texts) / (time.perf_counter() - start), out

    slow_rate, expected = run(
        lambda b: [list(x) for x in slow(b, truncation=True, max_length=max_length)["input_ids"]]
    )
    fast = FastBertweetTokenizer(slow)
    cold_rate, cold = run(lambda b: fast.encode_batch(b, max_length))
    warm_rate, warm = run(lambda b: fast.encode_batch(b, max_length))
    return {
        "tweets": len(texts),
        "slow_per_s": round(slow_rate),
        "fast_cold_per_s": round(cold_rate),
        "fast_warm_per_s": round(warm_rate),
        "cold_x": round(cold_rate / slow_rate, 1),
        "warm_x": round(warm_rate / slow_rate, 1),
        "identical": cold == expected and warm == expected,
    }


SETTINGS = {
    "1 thread": {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
    "default": {},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a BERTweet model directory (default: codes learned from the feed)")
    parser.add_argument("--limit", type=int, help="only the first N feed tweets")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:  # one setting, environment already set by the parent
        print(json.dumps(measure(args.model, args.limit, args.max_length)))
        return

    results: dict[str, dict[str, object]] = {}
    for name, env in SETTINGS.items():
        cmd = [sys.executable, __file__, "--child", "--max-length", str(args.max_length)]
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
        "| cold x | warm x | identical |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['tweets']} | {r['slow_per_s']} | {r['fast_cold_per_s']} | {r['fast_warm_per_s']} "
            f"| {r['cold_x']} | {r['warm_x']} | {r['identical']} |"
        )


if __name__ == "__main__":
    main()
