"""actlab's core: the model, its loss and its step from typed specs alone (never a config, a
task, a run directory or a measurement). Read model.py top-down with activations.py, then
kernels.py (the fused loss and cuDNN attention model.py chooses) and step.py; encoder.py is the
BERT-style encoder. docs/notebook.md trains the decoder in 15 lines.
"""

from actlab.core.encoder import Classifier, Encoder, MaskedLM, Specials
from actlab.core.model import (AttentionStats, CausalLM, Decoder, Execution, FFNStats, Objective,
                               Spec, Sums, apply, count_params, ffn_width, gated, pad_vocab,
                               param_count, per_layer)
from actlab.core.step import EVAL_SEED, OptimSpec, Step, TrainState, optimizer

__all__ = ["AttentionStats", "CausalLM", "Classifier", "Decoder", "EVAL_SEED", "Encoder",
           "Execution", "FFNStats", "MaskedLM", "Objective", "OptimSpec", "Spec", "Specials",
           "Step", "Sums", "TrainState", "apply", "count_params", "ffn_width", "gated",
           "optimizer", "pad_vocab", "param_count", "per_layer"]
