"""Multi-device cases for tests/test_parallel.py, run in a subprocess with 4 simulated CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=4 must be set before JAX starts, so these cannot
run inside the pytest process). `python tests/parallel_cases.py <tmpdir> <case> ...` prints one
JSON line per case with the measured differences; tests/test_parallel.py runs every case in one
process and asserts on them. Every step is waited for: in jaxlib 0.10.2 simulated-device
collectives can deadlock when many steps are queued.
"""

import copy
import json
import os
import pathlib
import shutil
import sys

assert "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""), \
    "run through tests/test_parallel.py (it sets XLA_FLAGS)"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from actlab import config as config_lib, core  # noqa: E402
from actlab.infra import parallel  # noqa: E402
from actlab.infra.checkpoint import Checkpoints  # noqa: E402
from actlab.run import program, train  # noqa: E402
from conftest import tiny  # noqa: E402
from tree_utils import state_bytes_per_device, tree_max_abs_diff  # noqa: E402

VOCAB = 257


def parallel_plan(c, devices):
  p = c.parallel
  return parallel.plan(c.train.batch_size, p.mode, p.num_devices, p.fsdp_min_size, devices)


def config(mode="dp", **kw):
  c = tiny(**kw)
  c.parallel.mode = mode
  c.parallel.fsdp_min_size = 0  # split everything that divides: the strictest FSDP test
  return c


def batches(c, n, seed=0):
  r = np.random.default_rng(seed)
  return [r.integers(0, VOCAB, (c.train.batch_size, c.data.seq_len + 1)).astype(np.int32)
          for _ in range(n)]


def take_steps(fns, state, bs):
  out = []
  for b in bs:
    state, m = fns.log_step(state, fns.put_batches([b]))  # every metric, norms included
    out.append(jax.device_get(fns.part(jax.block_until_ready(m), 0)))
  return state, out


def initial(c, seed=0, lr=None):
  """`c`'s initial state (with `seed`, `lr`) on the host, from its one-device program: a case's
  1-device and 4-device programs start from it, so that init compiles once per model rather than
  once per layout (case `run` compares `train.run`'s sharded init with one device's)."""
  c = copy.deepcopy(c)
  c.train.seed, c.optim.lr = seed, lr or c.optim.lr
  return jax.device_get(
      program.Program.create(c, VOCAB, plan=parallel_plan(c, jax.devices()[:1])).start([c]))


def run_on(c, devices, bs, state):
  """`c`'s program on `devices`, and 3 logged steps from the host state `state`."""
  fns = program.Program.create(c, VOCAB, plan=parallel_plan(c, devices))
  return fns, *take_steps(fns, fns.stack([state]), bs)


def relative_diff(a: float, b: float) -> float:
  return abs(a - b) / max(abs(b), 1.0)


def metric_diff(a, b):
  return max(abs(float(x[k]) - float(y[k])) / max(1.0, abs(float(x[k])))
             for x, y in zip(a, b) for k in x)


def case_step(tmp):
  """DP and FSDP over 4 devices = 1 device, for 3 steps (loss, norms, parameters, moments)."""
  devs = jax.devices()
  out = {"devices": len(devs), "xla_flags": os.environ["XLA_FLAGS"].split()}
  c1 = config("dp")
  bs = batches(c1, 3)
  init = initial(c1)
  fns1, ref_state, ref = run_on(c1, devs[:1], bs, init)
  for mode in ("dp", "fsdp"):
    c = config(mode)
    fns, state, got = run_on(c, devs, bs, init)
    run_spec = lambda x: str(P(*x.sharding.spec))
    emb = state.params["wte"]["embedding"]
    mu = state.opt_state.inner_state[1][0].mu["wte"]["embedding"]
    out[mode] = {
        "metrics": metric_diff(ref, got),
        "params": tree_max_abs_diff(ref_state.params, state.params),
        "opt_state": tree_max_abs_diff(ref_state.opt_state, state.opt_state),
        "embedding_spec": run_spec(emb), "moment_spec": run_spec(mu),
        "embedding_devices": len(emb.sharding.device_set),
        "state_bytes_per_device": state_bytes_per_device(state),
        "batch_spec": str(fns.plan.shard_batch(bs[0]).sharding.spec),
        "eval": relative_diff(
            float(fns.eval_step(state.params, fns.plan.shard_batch(bs[0]))["loss"].loss_sum),
            float(fns1.eval_step(ref_state.params, bs[0])["loss"].loss_sum)),
    }
  out["state_bytes_single"] = state_bytes_per_device(ref_state)
  return out


def case_modern(tmp):
  """The LLaMA-style block (RMSNorm, RoPE, no biases, an untied head; a plain relu2 FFN): DP and
  FSDP over 4 devices = 1 device for 3 steps; FSDP splits the untied head as the embedding."""
  kw = {**config_lib.BLOCKS["llama"], "model.ffn": "plain", "model.activation": "relu2"}
  devs = jax.devices()
  bs, init = batches(config(**kw), 3), initial(config(**kw))
  _, ref_state, ref = run_on(config("dp", **kw), devs[:1], bs, init)
  out = {}
  for mode in ("dp", "fsdp"):
    _, state, got = run_on(config(mode, **kw), devs, bs, init)
    out[mode] = {"metrics": metric_diff(ref, got),
                 "params": tree_max_abs_diff(ref_state.params, state.params),
                 "opt_state": tree_max_abs_diff(ref_state.opt_state, state.opt_state),
                 "head_spec": str(P(*state.params["lm_head"].sharding.spec)),
                 "logged": sorted(got[-1])}
  return out


def case_checkpoint(tmp):
  """Saved from FSDP on 4 devices; restored on 2 (dp) and 1 device; one more step on each
  equals one more step on 4."""
  devs = jax.devices()
  c4 = config("fsdp")
  bs = batches(c4, 3)
  fns4, state4, _ = run_on(c4, devs, bs[:2], initial(c4))
  ck = Checkpoints(pathlib.Path(tmp, "ck").absolute(), 2)
  ck.save(2, state4, {})  # its checksums must hold on 2 and 1 devices too
  ck.close()
  saved = jax.device_get(state4)  # the next step donates state4
  after4, m4 = take_steps(fns4, state4, bs[2:])
  out = {}
  for name, c, d in (("dp2", config("dp"), devs[:2]), ("single", config("dp"), devs[:1])):
    fns = program.Program.create(c, VOCAB, plan=parallel_plan(c, d))
    ck = Checkpoints(pathlib.Path(tmp, "ck").absolute(), 2)
    restored, _ = ck.restore(2, fns.run_state_like)  # abstract: everything from the checkpoint
    ck.close()
    restored_diff = tree_max_abs_diff(saved, restored)
    devices = len(restored.params["wte"]["embedding"].sharding.device_set)
    state, m = take_steps(fns, fns.stack([restored]), bs[2:])
    out[name] = {
        "restored": restored_diff,
        "devices": devices,
        "next_step_metrics": metric_diff(m4, m),
        "next_step_params": tree_max_abs_diff(after4.params, state.params),
        "step": int(state.step),
    }
  return out


def case_run(tmp):
  """train.run end to end: 1 device vs 4 (FSDP, which shards the batch as DP does and the
  parameters too; case `step` compares DP's steps): the same metrics.jsonl; then the 4-device run,
  interrupted after its first checkpoint, resumes on 1 device."""
  tmp = pathlib.Path(tmp)
  kw = {"train.steps": 6, "train.log_every": 2, "train.eval_every": 3,
        "train.checkpoint_every": 3, "metrics.tensorboard": False}
  rows, cache = {}, {}  # The resume on 1 device reuses the programs of the 1-device run.
  for name, mode, n in (("single", "dp", 1), ("fsdp", "fsdp", 4)):
    c = config(mode, **kw)
    c.parallel.num_devices = n
    train.run(c, tmp / name, cache)
    rows[name] = [json.loads(l) for l in (tmp / name / "metrics.jsonl").read_text().splitlines()]
  def diff(a, b):
    return max(abs(x[k] - y[k]) / max(1.0, abs(x[k])) for x, y in zip(a, b) for k in x
               if k != "tokens_per_sec" and isinstance(x[k], float))
  out = {"fsdp": diff(rows["single"], rows["fsdp"]), "steps": [r["step"] for r in rows["fsdp"]]}
  # Resume: the 4-device run as if killed before its second checkpoint, then on 1 device.
  shutil.copytree(tmp / "fsdp", tmp / "resume")
  shutil.rmtree(tmp / "resume" / "checkpoints" / "6")
  (tmp / "resume" / "summary.json").unlink()
  c1 = config("dp", **kw)
  c1.parallel.num_devices = 1
  train.run(c1, tmp / "resume", cache)
  resumed = [json.loads(l) for l in (tmp / "resume" / "metrics.jsonl").read_text().splitlines()]
  out["resume"] = diff(rows["single"], resumed)
  out["resume_steps"] = [r["step"] for r in resumed]
  return out


def case_vectorized(tmp):
  """A vectorized group of 2 runs on 4 devices (dp, fsdp) = on 1 device."""
  devs = jax.devices()
  bs = batches(config(), 3)
  inits = [initial(config(), 0, 3e-3), initial(config(), 1, 1e-3)]
  out = {}
  ref = None
  for name, mode, d in (("single", "dp", devs[:1]), ("dp", "dp", devs), ("fsdp", "fsdp", devs)):
    c = config(mode)
    g = program.Program.create(c, VOCAB, 2, parallel_plan(c, d))
    state = g.stack(inits)
    ms = []
    for b in bs:
      state, m = g.log_step(state, g.put_batches([b, b[::-1]]))
      ms.append(jax.device_get(jax.block_until_ready(m)))
    if ref is None:
      ref = (state, ms)
      continue
    out[name] = {"params": tree_max_abs_diff(ref[0].params, state.params),
                 "metrics": max(float(np.max(np.abs(x[k] - y[k]) / np.maximum(1.0, np.abs(x[k]))))
                                for x, y in zip(ref[1], ms) for k in x),
                 "runs_differ": float(np.max(np.abs(ms[-1]["train_loss"][0]
                                                    - ms[-1]["train_loss"][1])))}
  return out


if __name__ == "__main__":
  tmp = pathlib.Path(sys.argv[1])
  for case in sys.argv[2:]:
    (tmp / case).mkdir()
    print(f"RESULT {case} " + json.dumps(globals()[f"case_{case}"](str(tmp / case))), flush=True)
