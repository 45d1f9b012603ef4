"""python -m actlab.sweep: the command line of a sweep (actlab/sweep/__init__.py)."""
from absl import flags

from actlab.infra import errors
from actlab.sweep import main

errors.define_config_file("config", "Base config file, e.g. configs/x.py.")
flags.DEFINE_string("sweep", None, "Sweep file[:arg], e.g. experiments/x.py:smoke.")
flags.DEFINE_string("workdir", None, "Sweep directory: one subdirectory per cell.")
flags.DEFINE_integer("workers", 1, "Cells trained at once on this host, each in a child "
                     "process with its share of the CPUs (or one GPU).", lower_bound=1)
flags.DEFINE_string("shard", "0/1", "i/N: train only cells i, i+N, i+2N, ... (a job array: "
                    "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT).")
errors.require("config", "sweep", "workdir")
errors.run(main)
