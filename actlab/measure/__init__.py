"""What a run measures: step metrics and verdicts, evaluators, FFN histograms and FLOPs."""
