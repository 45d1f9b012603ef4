"""Data pipeline throughput: tokenization (MB/s of UTF-8 text) and batch-draw latency.

  python benchmarks/data_bench.py [--text FILE] [--gpt2-dir DIR] [--threads 2] [--bpe-size 4096]

Defaults use the reference sample beside the repository (../shared/data: TinyStories train.txt
and the GPT-2 files); without it, the synthetic corpus and (if reachable) tiktoken's GPT-2.
Reports, per tokenizer: encode throughput of the story texts (tokenizer.encode_batch, with
--threads threads), and the full cache-chunk path (Tokenizer.encode_docs: encode +
flatten + eot insertion), in MB/s of wall time and of CPU time (the machine may be shared). Then the median time of Dataset.train_batch for a 32 x 129 batch drawn from the
memory-mapped GPT-2 (or byte) cache, and of Dataset.val_batches().
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = (REPO / ".." / "shared" / "data").resolve()


def best_of(fn, repeats):
  """(best wall seconds, CPU seconds of that run: all threads of this process)."""
  best = (float("inf"), 0.0)
  for _ in range(repeats):
    c, t = time.process_time(), time.perf_counter()
    fn()
    best = min(best, (time.perf_counter() - t, time.process_time() - c))
  return best


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--text", default=str(SHARED / "tinystories" / "train.txt"),
                 help="a TinyStories-format text file (default: the shared sample)")
  p.add_argument("--gpt2-dir", default=os.environ.get("ACTLAB_GPT2_DIR") or str(SHARED / "gpt2"))
  p.add_argument("--threads", type=int, default=2, help="tokenizer threads (tiktoken, Rayon)")
  p.add_argument("--bpe-size", type=int, default=4096)
  p.add_argument("--repeats", type=int, default=3, help="best of N for throughput")
  p.add_argument("--draws", type=int, default=2000, help="batches drawn for the latency median")
  args = p.parse_args()
  # HF tokenizers sizes its thread pool from this on first use.
  os.environ["RAYON_NUM_THREADS"] = str(args.threads)
  sys.path.insert(0, str(REPO))

  import numpy as np

  from actlab import data
  from actlab.data import cache, gpt2, synthetic, tinystories
  from actlab.data import tokenizer
  from actlab import data as tokenizer_store

  if Path(args.text).is_file():
    texts = list(tinystories.parse_stories(args.text))
    source = args.text
  else:
    texts = synthetic.texts("train")
    source = "synthetic train split (shared sample not found)"
  mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
  print(f"corpus: {source}: {len(texts):,} stories, {mb:.2f} MB UTF-8")
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  print(f"threads: {args.threads} (of {os.cpu_count()} CPUs; load average {load:.1f} at start)")
  print("MB/s = MB of UTF-8 text per wall-clock second (per CPU-second in brackets)\n")

  toks = {"byte": tokenizer.ByteTokenizer()}
  try:
    gdir = args.gpt2_dir if Path(args.gpt2_dir, "encoder.json").is_file() else None
    toks["gpt2"] = gpt2.gpt2(gdir, threads=args.threads)
  except data.DataError as e:
    print(f"gpt2: skipped ({str(e).splitlines()[0]})")
  with tempfile.TemporaryDirectory() as tmp:
    t = time.perf_counter()
    toks[f"bpe:{args.bpe_size}"] = tokenizer_store.tokenizer_of(
        f"bpe:{args.bpe_size}", directory=tmp, train_texts=lambda: texts)
    print(f"bpe:{args.bpe_size}: trained on the corpus in {time.perf_counter() - t:.1f} s")
    print()
    print(f"{'tokenizer':<12} {'vocab':>7} {'tokens':>10} {'encode_batch MB/s':>20} "
          f"{'cache path MB/s':>20}")
    for name, tok in toks.items():
      dtype = cache.token_dtype(tok.vocab_size)
      enc = best_of(lambda: tok.encode_batch(texts), args.repeats)
      full = best_of(lambda: tok.encode_docs(texts, dtype), args.repeats)
      n = tok.encode_docs(texts, dtype).size
      cols = [f"{mb / w:.1f} ({mb / max(c, 1e-9):.1f})" for w, c in (enc, full)]
      print(f"{name:<12} {tok.vocab_size:>7,} {n:>10,} {cols[0]:>20} {cols[1]:>20}")

    tok = toks.get("gpt2", toks["byte"])
    path = Path(tmp) / f"train.{tok.name}.bin"
    arr = cache.build_or_open(path, lambda: texts, tok, "bench", progress=False)
    ds = data.Dataset(tokenizer=tok, train_tokens=arr, val_tokens=arr, seq_len=128, batch_size=32,
                      seed=1337, num_val_batches=8)
    ds.train_batch(0)
    lat = []
    for k in range(args.draws):
      t = time.perf_counter()
      ds.train_batch(k)
      lat.append(time.perf_counter() - t)
    val = best_of(ds.val_batches, args.repeats)[0]
    print()
    print(f"train_batch 32 x 129 from the {tok.name} memmap cache ({arr.size:,} tokens): "
          f"median {statistics.median(lat) * 1e6:.0f} us, p99 {np.percentile(lat, 99) * 1e6:.0f} us "
          f"over {args.draws} draws")
    print(f"val_batches() (8 x 32 x 129): {val * 1e3:.2f} ms")


if __name__ == "__main__":
  main()
