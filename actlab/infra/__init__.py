"""What everything else stands on: user errors as one line (`errors`), the devices (`parallel`),
the run directory (`workdir`, and the paths it records: `recorded`), checkpoints (`checkpoint`)
and the metrics log (`metrics_log`). No engine, model or measurement: the lowest layer."""
