"""Hugging Face's `BertForMaskedLM` trained on an actlab MLM config's data: the reference an actlab
encoder run is held against (RESULTS.md, "The encoder").

    python benchmarks/hf_bert_mlm.py configs/bert_gelu.py:cpu_past_plateau \\
        --out=runs/hf_bert_mlm.jsonl [--overrides=data.manual_dir=manual,...] [--threads=2]

Needs actlab, torch and transformers ≥ 4.46 in one environment (on CPU: `pip install -e '.[hf]'` and
`pip install torch --index-url https://download.pytorch.org/whl/cpu`).

The same as actlab's run of the config: the sizes (layers, d_model, heads, d_ff, post-LN,
exact GELU, dropout, LayerNorm ε), the vocabulary (actlab's WordPiece as a Hugging Face
tokenizer), each step's sequences (`Dataset.train_batch(step)` cut to `[CLS] … [SEP]` as
`core/encoder.encoder_sequences` cuts them), the batch, the peak LR, linear warm-up then a cosine to
`optim.min_lr_ratio`, AdamW's β, ε and weight decay (matrices and embeddings only), gradient
clipping, and the validation windows. Hugging Face's own: the initialisation (`_init_weights`),
the masking (`DataCollatorForLanguageModeling`: each maskable position selected with probability
`data.mlm_prob` independently, where actlab selects exactly that share of each sequence) and the
MLM head. Every `train.eval_every` steps it writes one JSON line: the step, the training loss,
and on the validation windows (masked once, by a fixed seed) the loss and accuracy at positions
whose input is `[MASK]` (`val_mask_loss`, `val_mask_accuracy`) and at every selected one.
"""

import argparse
import json
import math
import pathlib
import time

import numpy as np
import torch
import transformers

from actlab import config as config_lib
from actlab import data
from actlab.data.hf_tokenizer import hf_tokenizer
from actlab.infra import errors
from actlab import tasks
from actlab.core import encoder


def encoder_sequences(windows: np.ndarray, specials: encoder.Specials) -> torch.Tensor:
  return torch.from_numpy(np.array(encoder.encoder_sequences(windows, specials))).long()


def multiplier(step: int, warmup: int, total: int, floor: float) -> float:
  """actlab's schedule (`steps.schedule`): 0 → 1 over warm-up, then a cosine to `floor`."""
  if step < warmup:
    return step / warmup
  progress = min(1.0, (step - warmup) / max(1, total - warmup))
  return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def evaluate(model, batches: list[dict]) -> dict:
  """Loss and accuracy over the selected positions, and apart over those whose input is [MASK]."""
  sums = np.zeros(6)  # loss, correct, count; then the same at [MASK] inputs
  model.eval()
  with torch.no_grad():
    for b in batches:
      logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
      selected = b["labels"] != -100
      losses = torch.nn.functional.cross_entropy(logits[selected], b["labels"][selected],
                                                 reduction="none")
      correct = logits[selected].argmax(-1) == b["labels"][selected]
      at_mask = b["input_ids"][selected] == b["mask_id"]
      sums += [losses.sum(), correct.sum(), selected.sum(),
               losses[at_mask].sum(), correct[at_mask].sum(), at_mask.sum()]
  model.train()
  return {"val_loss": sums[0] / sums[2], "val_accuracy": sums[1] / sums[2],
          "val_mask_loss": sums[3] / sums[5], "val_mask_accuracy": sums[4] / sums[5]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("config", help="an MLM config, e.g. configs/bert_gelu.py:cpu_past_plateau")
  parser.add_argument("--out", required=True, help="the JSON-lines curve to write")
  parser.add_argument("--overrides", default="", help="dotted overrides: a=1,b.c=x")
  parser.add_argument("--threads", type=int, default=2)
  args = parser.parse_args()
  path, colon, arg = args.config.partition(":")
  c = errors.call_file(path, "get_config", *([arg] if colon else []), kind="config")
  c = config_lib.override(c, config_lib.parse_overrides(args.overrides))
  torch.manual_seed(int(c.train.seed))
  torch.set_num_threads(args.threads)
  dataset = data.load(c)
  tok, specials = dataset.tokenizer, tasks.specials(c)
  hf_tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=hf_tokenizer(tok), unk_token="[UNK]",
      pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
  m, o = c.model, c.optim
  model = transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=tok.vocab_size, hidden_size=m.d_model, num_hidden_layers=m.num_layers,
      num_attention_heads=m.num_heads, intermediate_size=m.d_ff, hidden_act="gelu",
      hidden_dropout_prob=m.dropout, attention_probs_dropout_prob=m.dropout,
      max_position_embeddings=m.max_len, type_vocab_size=m.type_vocab_size,
      layer_norm_eps=m.norm_eps))
  collator = transformers.DataCollatorForLanguageModeling(
      hf_tok, mlm_probability=c.data.mlm_prob, mask_replace_prob=c.data.mlm_mask_frac,
      random_replace_prob=c.data.mlm_random_frac, return_tensors="pt")

  def masked(windows: np.ndarray) -> dict:
    batch = collator([{"input_ids": ids} for ids in encoder_sequences(windows, specials)])
    return {**batch, "attention_mask": (batch["input_ids"] != specials.pad).long(),
            "mask_id": specials.mask}

  torch.manual_seed(0)  # the validation mask, fixed for every evaluation
  val = [masked(w) for w in dataset.val_batches()]
  decayed = [p for n, p in model.named_parameters() if p.ndim > 1]  # matrices and embeddings
  kept = [p for n, p in model.named_parameters() if p.ndim <= 1]
  adamw = torch.optim.AdamW([{"params": decayed, "weight_decay": o.weight_decay},
                             {"params": kept, "weight_decay": 0.0}],
                            lr=o.lr, betas=(o.b1, o.b2), eps=o.eps)
  total = int(c.train.steps)
  schedule = torch.optim.lr_scheduler.LambdaLR(
      adamw, lambda k: multiplier(k, o.warmup_steps, total, o.min_lr_ratio))
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  torch.manual_seed(int(c.train.seed))
  with out.open("w") as f:
    f.write(json.dumps({"step": 0, **evaluate(model, val)}) + "\n")
    t0, losses = time.perf_counter(), []
    for step in range(total):
      batch = masked(dataset.train_batch(step))
      loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   labels=batch["labels"]).loss
      adamw.zero_grad()
      loss.backward()
      if o.clip_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_norm)
      adamw.step()
      schedule.step()
      losses.append(loss.item())
      if (step + 1) % c.train.eval_every == 0 or step + 1 == total:
        row = {"step": step + 1, "train_loss": float(np.mean(losses)), **evaluate(model, val),
               "wall_time_sec": time.perf_counter() - t0}
        f.write(json.dumps(row) + "\n")
        f.flush()
        print(json.dumps(row), flush=True)
        losses = []


if __name__ == "__main__":
  main()
