"""What a run measures: step metrics and verdicts, evaluators, FFN histograms, FLOPs, and the
statistics the report compares runs with."""
