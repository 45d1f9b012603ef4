"""Tests for actlab.core.activations.

Expected values come from float64 closed forms (numpy / scipy) computed here, never from a rounded
table. JAX computes in float32; inputs are cast to float32 first and the float64 references are
evaluated at exactly those float32 points.
"""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, special

from actlab.core import activations

ANCHORS = np.array([-3.0, -1.0, 0.0, 0.5, 1.0, 3.0])
GRID = np.linspace(-8.0, 8.0, 4001)  # step 0.004; contains 0 exactly
Z32 = np.concatenate([ANCHORS, GRID]).astype(np.float32)
Z64 = Z32.astype(np.float64)

PLAIN = ("relu", "relu2", "tanh", "elu", "gelu", "gelu_tanh", "silu", "sigmoid", "identity")
# Written out independently of the module's own mapping.
GATED = {
    "swiglu": "silu", "geglu": "gelu", "reglu": "relu", "glu": "sigmoid", "bilinear": "identity",
}
ALL = PLAIN + tuple(GATED)


@functools.cache
def _jit(f):
  """jax.jit(f), compiled once per function object (gated entries share their base's)."""
  return jax.jit(f)


@functools.cache
def _jax_grad(fn):
  return jax.jit(jax.vmap(jax.grad(fn)))


# ---- float64 closed forms -------------------------------------------------------------------


def _phi(z):
  return np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def _gelu_tanh64(z):
  return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))


REF_FN = {
    "relu": lambda z: np.maximum(z, 0.0),
    "relu2": lambda z: np.maximum(z, 0.0) ** 2,
    "tanh": np.tanh,
    "elu": lambda z: np.where(z > 0, z, np.expm1(np.minimum(z, 0.0))),
    "gelu": lambda z: z * special.ndtr(z),
    "gelu_tanh": _gelu_tanh64,
    "silu": lambda z: z * special.expit(z),
    "sigmoid": special.expit,
    "identity": lambda z: z,
}


def _gelu_grad64(z):
  return special.ndtr(z) + z * _phi(z)


def _gelu_tanh_grad64(z):
  c = math.sqrt(2.0 / math.pi)
  t = np.tanh(c * (z + 0.044715 * z**3))
  return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * z * z)


# Derivatives, with the kink conventions ReLU'(0) = relu2'(0) = 0 and ELU'(0) = 1.
REF_GRAD = {
    "relu": lambda z: (z > 0).astype(np.float64),
    "relu2": lambda z: 2.0 * np.maximum(z, 0.0),
    "tanh": lambda z: 1.0 - np.tanh(z) ** 2,
    "elu": lambda z: np.where(z > 0, 1.0, np.exp(np.minimum(z, 0.0))),
    "gelu": _gelu_grad64,
    "gelu_tanh": _gelu_tanh_grad64,
    "silu": lambda z: special.expit(z) * (1.0 + z * special.expit(-z)),
    "sigmoid": lambda z: special.expit(z) * special.expit(-z),
    "identity": np.ones_like,
}


def _base(name):
  return GATED.get(name, name)


def _close(actual, expected, name):
  # relu2 reaches 64 on the grid: float32 spacing there is ~8e-6, so add a relative term.
  rtol = 1e-6 if name == "relu2" else 0.0
  np.testing.assert_allclose(np.asarray(actual, np.float64), expected, atol=1e-6, rtol=rtol)


# ---- registry -------------------------------------------------------------------------------


def test_registry_names_and_gated_flags():
  assert set(activations.NAMES) == set(ALL)
  assert len(activations.NAMES) == len(ALL)
  for name in ALL:
    act = activations.get(name)
    assert isinstance(act, activations.Activation)
    assert act.name == name
    assert act.gated is (name in GATED)
  for name, base in GATED.items():  # gated entries reuse the plain functions
    assert activations.get(name).fn is activations.get(base).fn
    assert activations.get(name).grad is activations.get(base).grad


def test_unknown_name_lists_every_valid_name_sorted():
  with pytest.raises(ValueError) as err:
    activations.get("nope")
  msg = str(err.value)
  assert "nope" in msg
  for name in ALL:
    assert re.search(rf"\b{name}\b", msg), name
  assert ", ".join(sorted(ALL)) in msg


# ---- values and derivatives -----------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_values_match_float64_closed_form(name):
  out = _jit(activations.get(name).fn)(jnp.asarray(Z32))
  _close(out, REF_FN[_base(name)](Z64), name)


@pytest.mark.parametrize("name", ALL)
def test_analytic_grad_matches_jax_grad(name):
  act = activations.get(name)
  z = jnp.asarray(Z32)
  auto = np.asarray(_jax_grad(act.fn)(z), np.float64)
  if name == "gelu_tanh":
    # Autodiff through σ'(x) = σ(x)(1 − σ(x)) cancels in float32 where σ ≈ 1 (z ≈ 2..5):
    # jax.grad is off by up to ~2e-6 there, while the analytic grad (σ(2u)·σ(−2u)) stays
    # within 2e-7 of float64 (test_analytic_grad_matches_float64_closed_form holds it to
    # 1e-6). Allow for the autodiff error only.
    np.testing.assert_allclose(np.asarray(_jit(act.grad)(z), np.float64), auto, atol=3e-6)
  else:
    _close(_jit(act.grad)(z), auto, name)


@pytest.mark.parametrize("name", PLAIN)
def test_reference_derivatives_match_finite_differences(name):
  # Pure float64: checks the derivative formulas above against central differences of the
  # value formulas, so the next test does not rest on a derivative written down twice.
  h = 1e-6
  # At 0, relu has no derivative and relu2'' / elu'' jump (central differences are O(h) off
  # there); the convention at 0 has its own test.
  z = Z64[Z64 != 0.0] if name in ("relu", "relu2", "elu") else Z64
  fd = (REF_FN[name](z + h) - REF_FN[name](z - h)) / (2 * h)
  np.testing.assert_allclose(REF_GRAD[name](z), fd, atol=1e-8, rtol=1e-8)


@pytest.mark.parametrize("name", ALL)
def test_analytic_grad_matches_float64_closed_form(name):
  out = _jit(activations.get(name).grad)(jnp.asarray(Z32))
  _close(out, REF_GRAD[_base(name)](Z64), name)


@pytest.mark.parametrize("name, expected", [("relu", 0.0), ("relu2", 0.0), ("elu", 1.0)])
def test_derivative_convention_at_zero(name, expected):
  act = activations.get(name)
  at0 = Z32 == 0.0
  assert at0.sum() == 2  # the anchor 0 and the grid's midpoint
  z = jnp.asarray(Z32)
  assert np.all(np.asarray(_jit(act.grad)(z))[at0] == expected)
  assert np.all(np.asarray(_jax_grad(act.fn)(z))[at0] == expected)


def test_gelu_pair_matches_jax_nn_gelu():
  # Same functions as jax.nn.gelu(approximate=False / True); only the float32 evaluation differs.
  z = jnp.asarray(Z32)
  exact = jax.nn.gelu(z, approximate=False)
  approx = jax.nn.gelu(z, approximate=True)
  np.testing.assert_allclose(_jit(activations.get("gelu").fn)(z), exact, atol=1e-6)
  np.testing.assert_allclose(_jit(activations.get("gelu_tanh").fn)(z), approx, atol=1e-6)


# ---- GELU facts ---------------------------------------------------------------------------------


def test_gelu_exact_vs_tanh_max_gap():
  # Also shows that `gelu` and `gelu_tanh` are different functions.
  z = jnp.asarray(Z32)
  exact, approx = _jit(activations.get("gelu").fn)(z), _jit(activations.get("gelu_tanh").fn)(z)
  gap = float(jnp.max(jnp.abs(exact - approx)))
  gap64 = np.max(np.abs(REF_FN["gelu"](Z64) - _gelu_tanh64(Z64)))
  # The grid maximum is the true supremum to well below 1e-6 (the gap is smooth, step 0.004).
  neg = optimize.minimize_scalar(
      lambda t: -abs(REF_FN["gelu"](t) - _gelu_tanh64(t)), bounds=(-8, 0), method="bounded",
      options={"xatol": 1e-10},
  )
  pos = optimize.minimize_scalar(
      lambda t: -abs(REF_FN["gelu"](t) - _gelu_tanh64(t)), bounds=(0, 8), method="bounded",
      options={"xatol": 1e-10},
  )
  sup = max(-neg.fun, -pos.fun)
  assert abs(gap64 - sup) < 1e-6
  assert abs(gap - gap64) < 1e-6
  assert 4e-4 < gap64 < 5e-4
  assert 4e-4 < gap < 5e-4


def test_gelu_grad_at_minus_half():
  expected = special.ndtr(-0.5) - 0.5 * _phi(-0.5)
  value = float(_jit(activations.get("gelu").grad)(jnp.float32(-0.5)))
  assert abs(value - expected) < 1e-6
  assert round(value, 4) == 0.1325


def test_gelu_grad_root_and_sign():
  grad = _jit(activations.get("gelu").grad)
  lo, hi = -2.0, 0.0  # grad(-2) < 0 < grad(0)
  assert float(grad(jnp.float32(lo))) < 0 < float(grad(jnp.float32(hi)))
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    if float(grad(jnp.float32(mid))) < 0:
      lo = mid
    else:
      hi = mid
  root = 0.5 * (lo + hi)
  root64 = optimize.brentq(_gelu_grad64, -2.0, 0.0, xtol=1e-14)
  assert abs(root - root64) < 1e-5
  assert round(root64, 4) == -0.7518
  z = Z32
  g = np.asarray(grad(jnp.asarray(z)))
  assert np.all(g[z < -0.7518] < 0)
  assert np.all(g[z > root64 + 1e-4] > 0)
  assert float(grad(jnp.float32(root64 + 1e-3))) > 0
  assert float(grad(jnp.float32(root64 - 1e-3))) < 0


# ---- printed table ----------------------------------------------------------------------------


def _parse_table(text):
  lines = text.strip().splitlines()
  header = [c.strip() for c in lines[0].strip("|").split("|")]
  assert set(lines[1].replace("|", "").strip()) <= {"-", " "}
  rows = [[float(c) for c in line.strip("|").split("|")] for line in lines[2:]]
  return header, np.array(rows)


@pytest.mark.parametrize("zs", [None, (-2.5, -0.7518, -0.5, 0.25, 2.0, 8.0)])
def test_value_table_matches_closed_forms(zs):
  text = activations.value_table() if zs is None else activations.value_table(zs)
  header, rows = _parse_table(text)
  assert header == ["z", "Φ(z)", "GELU exact", "GELU tanh", "GELU'(z)", "ELU"]
  zs = ANCHORS if zs is None else np.array(zs)
  assert rows.shape == (len(zs), 6)
  np.testing.assert_array_equal(rows[:, 0], zs)
  cols = [special.ndtr, REF_FN["gelu"], _gelu_tanh64, _gelu_grad64, REF_FN["elu"]]
  expected = np.stack([f(zs) for f in cols], 1)
  # Correct to 4 decimals: within half a unit in the last place (plus float32 slack).
  assert np.max(np.abs(rows[:, 1:] - expected)) <= 5e-5 + 1e-7
  assert "-0.0000" not in text


# ---- jit and dtypes ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("name", ALL)
def test_jit_preserves_dtype(name, dtype):
  act = activations.get(name)
  z = jnp.asarray(Z32, dtype)
  z64 = np.asarray(z.astype(jnp.float32), np.float64)
  # bfloat16 keeps 8 significant bits; exact GELU rounds through erfc in bfloat16 (error < 0.01).
  tol = dict(atol=1e-6, rtol=1e-6) if dtype == jnp.float32 else dict(atol=2e-2, rtol=1e-2)
  for f, ref in ((act.fn, REF_FN), (act.grad, REF_GRAD)):
    out = _jit(f)(z)
    assert out.dtype == dtype
    assert out.shape == z.shape
    out64 = np.asarray(out.astype(jnp.float32), np.float64)
    np.testing.assert_allclose(out64, ref[_base(name)](z64), **tol)
