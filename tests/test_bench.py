"""The benchmark harness (actlab/bench/): the peak table and MFU, a short end-to-end
`bench.run` (one run and vectorized runs), and the PyTorch reference (the same model as actlab's,
GPT-2's block or the LLaMA-style one, and its worker). The FLOP formula is in
tests/test_flops.py, the fused loss in tests/test_kernels.py, scan/remat/bf16/attention in
tests/test_model_execution.py."""

import importlib.util
import math
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest

from actlab import bench, core, tasks
from actlab import config as config_lib
from actlab.infra import parallel
from actlab.infra.errors import UserError
from actlab.measure import flops
from conftest import REPO, tiny

PEAKS = {name: peaks for names, peaks in bench.PEAK_TFLOPS for name in names}


# --- The peak table and MFU -------------------------------------------------------------------

def test_every_table_entry_resolves_to_its_own_peak():
  """First match wins: an entry listed after a shorter name it contains (H100 PCIe after H100,
  L40S after L4, TPU v5p after TPU v5) would get the other's peak."""
  for name, peaks in PEAKS.items():
    for dtype, peak in peaks.items():
      assert bench.peak_tflops(name, dtype)[0] == peak, (name, dtype)
      assert bench.peak_tflops(name.upper(), dtype)[0] == peak, (name, dtype)  # any case


@pytest.mark.parametrize("device_kind, entry", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"), ("NVIDIA A100-SXM4-80GB", "A100"),
    ("TPU v4", "TPU v4"), ("TPU v5 lite", "TPU v5 lite"), ("TPU v5p", "TPU v5p"),
    ("TPU v6 lite", "TPU v6 lite")])
def test_device_kinds_as_jax_reports_them_find_their_entry(device_kind, entry):
  assert bench.peak_tflops(device_kind, "bfloat16") == (PEAKS[entry]["bfloat16"],
                                                        f"{entry} bfloat16 dense peak")


def test_unknown_device_or_dtype_has_no_peak():
  assert bench.peak_tflops("cpu", "float32") == (None, "unknown peak")
  assert bench.peak_tflops("Tesla V100-SXM2-16GB", "bfloat16") == (None, "unknown peak")
  assert bench.peak_tflops("Tesla V100-SXM2-16GB", "float16")[0] == PEAKS["V100"]["float16"]


class FixedTimes:
  """A bench whose step takes 4 ms timed and 2 ms queued: `bench.run`'s arithmetic, no compile."""
  name = "actlab (JAX)"

  def __init__(self, config, runs=1):
    del config, runs

  def setup(self, warmup):
    return {"compile_s": 1.0, "warmup_s": 0.1}

  def timed(self, n):
    return {"times": [4e-3] * n, "cpu": 0.0}

  def queued(self, n):
    return {"wall": 2e-3 * n}

  def memory(self):
    return {}


def test_mfu_is_achieved_over_peak_flops_of_all_devices(tiny_config, monkeypatch):
  """On a device kind of the table, `bench.run` takes that entry's peak for the compute dtype,
  times the device count (3, pretended), and MFU = FLOPs per token · tokens per step / step time
  / peak, step by step and back to back; on a CPU (no peak) it claims no MFU."""
  environment = bench.environment
  monkeypatch.setattr(bench, "environment",
                      lambda: {**environment(), "device_kind": "NVIDIA H100 PCIe"})
  monkeypatch.setattr(bench.jax, "device_count", lambda: 3)
  monkeypatch.setattr(bench, "JaxBench", FixedTimes)
  (r,) = bench.run(tiny_config, steps=2, warmup=1)
  dtype = tiny_config.model.dtype
  assert r["peak_tflops"] == PEAKS["H100 PCIe"][dtype] * 3
  assert r["peak_source"] == f"H100 PCIe {dtype} dense peak"
  per_step = flops.for_config(tiny_config, 257).total * 8 * 32
  assert (r["step_ms"], r["queued_step_ms"]) == (pytest.approx(4.0), pytest.approx(2.0))
  assert r["tflops"] == pytest.approx(per_step / 4e-3 / 1e12, rel=1e-9)
  assert r["mfu"] == pytest.approx(per_step / 4e-3 / 1e12 / r["peak_tflops"], rel=1e-9)
  assert r["queued_mfu"] == pytest.approx(per_step / 2e-3 / 1e12 / r["peak_tflops"], rel=1e-9)
  monkeypatch.setattr(bench, "environment", lambda: {**environment(), "device_kind": "cpu"})
  (r,) = bench.run(tiny_config, steps=2, warmup=1)
  assert r["peak_tflops"] is None and r["mfu"] is None and r["queued_mfu"] is None


def test_the_torch_row_is_summarized_with_the_config_it_runs(tiny_config, monkeypatch):
  """With a variant that changes the batch, the PyTorch reference (which runs the base config)
  reports the base config's tokens per step, not the variant's."""
  class FixedTorch(FixedTimes):
    name = "PyTorch"

    info = {"torch": "fixed", "threads": 2}

    def __init__(self, config, mode, device):
      del config, mode, device

  monkeypatch.setattr(bench, "JaxBench", FixedTimes)
  monkeypatch.setattr(bench, "TorchBench", FixedTorch)
  rows = bench.run(tiny_config, steps=2, warmup=1, torch=True,
                   variants=["train.batch_size=16"])
  base, variant, torch = (r["tokens_per_s"] for r in rows)
  assert torch == pytest.approx(base) and variant == pytest.approx(2 * base)


# --- The harness end to end -------------------------------------------------------------------

@pytest.mark.slow
def test_bench_run_reports_every_field(tiny_config, monkeypatch):
  """On a CPU (as it reports itself: the step may run on a GPU here)."""
  environment = bench.environment
  monkeypatch.setattr(bench, "environment",
                      lambda: {**environment(), "platform": "cpu", "device_kind": "cpu"})
  rows = bench.run(tiny_config, steps=2, warmup=1, peak=1.0)
  (r,) = rows
  assert r["tokens_per_step"] == 8 * 32 and r["tokens_per_s"] > 0 and r["compile_s"] > 0
  assert r["flops_per_token"] == flops.for_config(tiny_config, 257).total
  assert r["mfu"] == pytest.approx(r["tflops"] / 1.0)
  # Back to back: the same steps queued as the training loop queues them.
  assert r["queued_tokens_per_s"] == pytest.approx(r["tokens_per_step"] / r["queued_step_ms"] * 1e3)
  assert r["queued_mfu"] == pytest.approx(r["queued_tokens_per_s"] * r["flops_per_token"] / 1e12)
  assert r["env"]["versions"]["jax"] == jax.__version__
  assert "actlab.bench" in r["env"]["command"]
  row = bench.markdown_rows(rows)
  assert row.startswith("| CPU") and row.count("|") == 13


@pytest.mark.slow
def test_bench_command_shows_no_tpu_probe_line():
  """JAX probes for a TPU wherever JAX_PLATFORMS lets it choose, and logs the failure at INFO,
  which absl shows: `python -m actlab.bench` drops that one line."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  proc = subprocess.run([sys.executable, "-m", "actlab.bench",
                         f"--config={REPO / 'tests' / 'tiny_config.py'}", "--steps=1",
                         "--warmup=0"], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert "backend 'tpu'" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_bench_vectorized_runs(tiny_config):
  (r,) = bench.run(tiny_config, steps=1, warmup=1, runs=3)
  assert r["runs"] == 3 and r["tokens_per_step"] == 3 * 8 * 32


def torch_state(params, c) -> dict:
  """actlab's decoder parameters under benchmarks/torch_ref.py's names: q, k, v in the fused
  `c_attn`, Linear weights transposed, norm scales as `weight`, the head tied or `lm_head`."""
  import torch
  t = lambda *arrays: torch.tensor(np.concatenate([np.asarray(a) for a in arrays], axis=-1))
  norm = lambda name, p: {f"{name}.{k}": t(v) for k, v in (("weight", p["scale"]),
                                                           ("bias", p.get("bias")))
                          if v is not None}
  linear = lambda name, *ps: {f"{name}.weight": t(*(p["kernel"] for p in ps)).T,
                              **({f"{name}.bias": t(*(p["bias"] for p in ps))} if "bias" in ps[0]
                                 else {})}
  out = {"wte.weight": t(params["wte"]["embedding"]), **norm("ln_f", params["ln_f"])}
  out["lm_head.weight"] = t(params["lm_head"]) if "lm_head" in params else out["wte.weight"]
  if "wpe" in params:
    out["wpe.weight"] = t(params["wpe"]["embedding"])
  for i in range(c.model.num_layers):
    b, h = params[f"block_{i}"], f"h.{i}"
    attn, ffn = b["attn"], b["ffn"]
    out.update({**norm(f"{h}.ln_1", b["ln_attn"]), **norm(f"{h}.ln_2", b["ln_ffn"]),
                **linear(f"{h}.attn.c_attn", attn["query"], attn["key"], attn["value"]),
                **linear(f"{h}.attn.c_proj", attn["out"]), **linear(f"{h}.mlp.c_fc", ffn["up"]),
                **linear(f"{h}.mlp.c_proj", ffn["down"])})
    if "gate" in ffn:
      out.update(linear(f"{h}.mlp.c_gate", ffn["gate"]))
    if "query_norm" in attn:
      out.update({**norm(f"{h}.attn.q_norm", attn["query_norm"]),
                  **norm(f"{h}.attn.k_norm", attn["key_norm"])})
  return out


MODERN = {**config_lib.BLOCKS["llama"], "model.qk_norm": True}


def load_torch_ref():
  spec = importlib.util.spec_from_file_location("torch_ref", REPO / "benchmarks" / "torch_ref.py")
  torch_ref = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(torch_ref)
  return torch_ref


def test_the_torch_reference_takes_every_field_of_the_block():
  """`TorchBench` passes the block's fields (`config.BLOCK_FIELDS`) to torch_ref, which builds
  each at actlab's defaults but the norms' placement (pre-LN only: `TorchBench` refuses post)."""
  pytest.importorskip("torch")
  c = tiny(**config_lib.BLOCKS["llama"])
  assert {k: bench.TorchBench(c).spec[k] for k in config_lib.BLOCK_FIELDS} == {
      k: c.model[k] for k in config_lib.BLOCK_FIELDS}
  assert load_torch_ref().GPT2_BLOCK == {k: getattr(core.Spec, k) for k in config_lib.BLOCK_FIELDS
                                         if k != "norm"}


@pytest.mark.parametrize("first", [1.0, 0.0])
def test_torch_reference_clips_spikes_as_actlab(first):
  """torch_ref's spike-only clipping scales the gradients as actlab's `clip_spikes` over steps
  whose norms are 1, 5, 20 and 0.5 × a base (the third above 10× the first: clipped), and with a
  zero first gradient (the next step's norm becomes the reference, as in actlab)."""
  torch = pytest.importorskip("torch")
  torch_ref = load_torch_ref()
  rng = np.random.default_rng(0)
  base = [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=5).astype(np.float32)]
  tx = core.step.clip_spikes(10.0)
  state = tx.init(base)
  params = [torch.nn.Parameter(torch.zeros(g.shape)) for g in base]
  initial = None
  for scale in (first, 5.0, 20.0, 0.5):
    grads = [scale * g for g in base]
    expected, state = tx.update(grads, state)
    for p, g in zip(params, grads):
      p.grad = torch.tensor(g)
    initial = torch_ref.clip_spikes(params, 10.0, initial)
    for p, e in zip(params, expected):
      np.testing.assert_allclose(p.grad.numpy(), np.asarray(e), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("scale", ["rms", "width"])
def test_the_torch_reference_builds_muon_on_the_blocks_matrices_and_adamw_on_the_rest(scale):
  """With `optim.name` "muon" torch_ref steps torch's Muon (its factor `muon_scale`'s) on the
  blocks' matrices (the LLaMA-style block's gate too) and AdamW on the rest (embeddings, the
  untied head, norm scales) at `muon_adam_lr_ratio` · lr; the default builds AdamW alone."""
  torch = pytest.importorskip("torch")
  torch_ref = load_torch_ref()
  c = tiny(**MODERN, **{"optim.name": "muon", "optim.lr": 0.02, "optim.muon_scale": scale,
                        "optim.muon_adam_lr_ratio": 0.1})
  assert " muon " in bench.config_summary(c)  # a bench row says so
  trainer = torch_ref.Trainer({**bench.TorchBench(c).spec, "threads": 1})
  muon, adamw = trainer.opts
  assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
  matrices = {id(p) for group in muon.param_groups for p in group["params"]}
  names = {n for n, p in trainer.model.named_parameters() if id(p) in matrices}
  assert names == {f"h.0.{m}.weight" for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                               "mlp.c_gate", "mlp.c_proj")}
  assert muon.param_groups[0]["adjust_lr_fn"] == torch_ref.MUON_SCALES[scale]
  assert muon.param_groups[0]["lr"] == 0.02 and adamw.param_groups[0]["lr"] == pytest.approx(2e-3)
  assert math.isfinite(trainer.step())
  (alone,) = torch_ref.Trainer({**bench.TorchBench(tiny()).spec, "threads": 1}).opts
  assert isinstance(alone, torch.optim.AdamW)


def test_the_torch_worker_says_in_one_line_what_it_cannot_build():
  """A config torch_ref cannot build (here an activation its table lacks) is one line from
  `actlab.bench --torch`, not a worker's traceback and a guess that torch is missing."""
  pytest.importorskip("torch")
  tb = bench.TorchBench(tiny())
  tb.spec = {**tb.spec, "activation": "softsign"}
  try:
    with pytest.raises(UserError, match=r"^actlab.bench --torch: torch_ref has no activation "
                                        r"'softsign'; choose one of"):
      tb.setup(1)
  finally:
    tb.close()


@pytest.mark.slow
@pytest.mark.parametrize("activation, block", [
    ("gelu", {}), ("swiglu", {}), ("relu2", {**MODERN, "model.ffn": "plain"}), ("silu", MODERN)])
def test_torch_reference_is_the_same_model(activation, block):
  """GPT-2's block and the LLaMA-style one (RMSNorm, RoPE, no biases, an untied head, qk-norm;
  plain and gated FFN): the same parameter count and, from the same random weights (norm scales
  and biases too, far from initialisation so that the logits are not near uniform), the loss
  actlab computes; and a step from torch_ref's own initialisation starts near uniform."""
  torch = pytest.importorskip("torch")
  torch_ref = load_torch_ref()
  c = tiny(activation, **block)
  assert ("rms rope no-bias untied" in bench.config_summary(c)) == bool(block)  # the rows say so
  tb = bench.TorchBench(c)
  trainer = torch_ref.Trainer({**tb.spec, "threads": 1})
  model = tasks.get(c).objective(config_lib.typed(c), 257).model
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), trainer.x.numpy())["params"]
  assert trainer.params == core.count_params(shapes)["total"]
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: rng.normal(0.5 if len(s.shape) == 1 else 0, 0.3, s.shape)
                        .astype(np.float32), shapes)
  model_t = torch_ref.GPT(tb.spec["vocab"], c.model.max_len, c.model.num_layers,
                          c.model.d_model, c.model.num_heads, core.ffn_width(
                              activation, c.model.d_ff, c.model.gated_match_params, c.model.ffn),
                          activation, {k: tb.spec[k] for k in torch_ref.GPT2_BLOCK})
  model_t.load_state_dict(torch_state(params, c))  # strict: every tensor named, none left over
  x, y = trainer.x.numpy(), trainer.y.numpy()
  logits = jax.jit(model.apply)({"params": params}, x)
  expected = float(optax.softmax_cross_entropy_with_integer_labels(logits, y).mean())
  with torch.no_grad():
    assert model_t(trainer.x, trainer.y).item() == pytest.approx(expected, rel=2e-5)
  assert abs(expected - math.log(tb.spec["vocab"])) > 0.2  # the weights make a difference
  assert abs(trainer.step() - math.log(tb.spec["vocab"])) < 0.5  # starts near uniform, as actlab


@pytest.mark.slow
@pytest.mark.parametrize("mode", bench.TORCH_MODES)
def test_torch_reference_runs_side_by_side_step_by_step_and_back_to_back(tiny_config, mode):
  """The PyTorch reference in its worker, eager or torch.compile (on a CPU the GPU comparator's
  compile mode still runs: what `--torch_mode=compile` times), answers both kinds of timing."""
  pytest.importorskip("torch")
  if mode == "compile" and not shutil.which("cc"):
    pytest.skip("torch.compile on a CPU needs a C compiler")
  if mode == "compile" and not os.environ.get("ACTLAB_TEST_TORCH_COMPILE"):
    pytest.skip("torch.compile builds C++ for about 100 s on 2 CPU cores, half the suite's "
                "budget: ACTLAB_TEST_TORCH_COMPILE=1 runs it")
  rows = bench.run(tiny_config, steps=2, warmup=1, rounds=2, torch=True, torch_mode=mode)
  jax_row, torch_row = rows
  assert torch_row["impl"] == f"PyTorch {mode} (nanoGPT)" and mode in torch_row["config"]
  for r in rows:
    assert r["steps_timed"] == 2 and r["queued_step_ms"] > 0
  assert jax_row["queued_speedup_vs_torch"] == pytest.approx(
      jax_row["queued_tokens_per_s"] / torch_row["queued_tokens_per_s"])


def test_unknown_torch_mode_is_refused(tiny_config):
  with pytest.raises(ValueError, match="--torch_mode='jit'"):
    bench.TorchBench(tiny_config, "jit")


def test_the_torch_reference_refuses_mup_in_one_line():
  c = tiny(**{"model.parametrization": "mup", "model.mup_base_width": 16})
  with pytest.raises(UserError, match="standard parametrization only") as e:
    bench.TorchBench(c)
  assert "\n" not in str(e.value)


def test_a_variant_cannot_change_the_process_devices(tiny_config):
  """Devices are set up once per process: a variant with other CPU devices would silently time
  the base config's devices, so it is refused."""
  with pytest.raises(parallel.ParallelError, match="--variant=parallel.cpu_devices=2"):
    bench.run(tiny_config, steps=1, warmup=1, variants=["parallel.cpu_devices=2"])
