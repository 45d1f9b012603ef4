"""MLM runs' loss and accuracy at the `[MASK]` inputs against the step, one line per run
(RESULTS.md, "The encoder"):

    python benchmarks/plot_mlm_curves.py docs/img/encoder_mlm_curves.png \\
        "actlab=results/encoder_reference/actlab/metrics.jsonl" \\
        "Hugging Face=results/encoder_reference/hf_bert_mlm.jsonl" [--bar=5.77]

Each PATH is an actlab run's metrics.jsonl or `benchmarks/hf_bert_mlm.py`'s output: both write
`val_mask_loss` and `val_mask_accuracy` at their evaluations. `--bar` draws a horizontal line
at that loss (the unigram model's at `[MASK]`, `mask_unigram_loss` in an MLM run's summary).
"""

import argparse
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


def curve(path: str) -> tuple[list[int], list[float], list[float]]:
  rows = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]
  rows = [r for r in rows if r.get("val_mask_loss") is not None]
  return ([r["step"] for r in rows], [r["val_mask_loss"] for r in rows],
          [r["val_mask_accuracy"] for r in rows])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("out")
  parser.add_argument("runs", nargs="+", help="LABEL=PATH")
  parser.add_argument("--bar", type=float, default=None)
  args = parser.parse_args()
  fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
  for run in args.runs:
    label, _, path = run.partition("=")
    steps, loss, acc = curve(path)
    loss_ax.plot(steps, loss, marker="o", markersize=3, label=label)
    acc_ax.plot(steps, [100 * a for a in acc], marker="o", markersize=3, label=label)
  if args.bar is not None:
    loss_ax.axhline(args.bar, color="grey", linestyle="--", linewidth=1,
                    label="unigram at [MASK]")
  loss_ax.set(xlabel="step", ylabel="val loss at [MASK] (nats)", ylim=(None, 6.5))
  acc_ax.set(xlabel="step", ylabel="val accuracy at [MASK] (%)")
  for ax in (loss_ax, acc_ax):
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
  main()
