"""FFN activation functions, their analytic derivatives, and the name registry.

Pure `jax.numpy`; no Flax. Φ and φ are the standard normal CDF and PDF, σ the logistic sigmoid.

| name        | fn(z)                                        | grad(z) = d fn / dz            |
|-------------|----------------------------------------------|--------------------------------|
| `relu`      | max(0, z)                                    | 1 if z > 0 else 0              |
| `relu2`     | max(0, z)²                                   | 2·max(0, z)                    |
| `tanh`      | tanh z                                       | 1 − tanh² z                    |
| `elu`       | z if z > 0 else eᶻ − 1   (α = 1)             | 1 if z > 0 else eᶻ             |
| `gelu`      | z·Φ(z)   (exact, erf-based = PyTorch GELU()) | Φ(z) + z·φ(z)                  |
| `gelu_tanh` | ½z(1 + tanh u) = z·σ(2u)                     | σ(2u) + z·σ(2u)·σ(−2u)·2u'     |
|             |   u = √(2/π)(z + 0.044715 z³)                |   u' = √(2/π)(1 + 0.134145 z²) |
| `silu`      | z·σ(z)   (Swish, β = 1)                      | σ(z)(1 + z·σ(−z))              |
| `sigmoid`   | σ(z)                                         | σ(z)·σ(−z)  (= σ(1 − σ))       |
| `identity`  | z                                            | 1                              |

`jax.nn.gelu` is the *tanh approximation* by default. Here `gelu` is always exact (the same
function as `jax.nn.gelu(z, approximate=False)`) and the approximation has its own name,
`gelu_tanh` (= `jax.nn.gelu(z, approximate=True)`). Both are written via erfc / σ so that their
values and derivatives keep full precision in the negative tail.

Gated (GLU) family, Shazeer 2020: `fn` is applied to the gate pre-activation and the model computes
`fn(x W_gate) * (x W_up)`. `swiglu` = silu, `geglu` = gelu (exact), `reglu` = relu,
`glu` = sigmoid, `bilinear` = identity; these entries share the plain entries' `fn` and `grad`.

Convention at kinks: ReLU'(0) = 0 and relu2'(0) = 0, which is what `jax.grad` gives for
`jax.nn.relu` (not for `jnp.maximum(z, 0)`, whose gradient at a tie is ½); ELU (α = 1) is
differentiable at 0 with ELU'(0) = 1 = `jax.grad(jax.nn.elu)(0)`. Every `grad` agrees with
`jax.grad(fn)` everywhere, z = 0 included (checked by the tests). Grads use σ(−z) for 1 − σ(z)
so that they stay accurate where σ ≈ 1.

`python -m actlab.models` prints `value_table()`: correct 4-place values of Φ, exact and tanh
GELU, GELU' and ELU at the reference inputs (GELU' is negative for z < −0.7518).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TANH_C = math.sqrt(2.0 / math.pi)
_TANH_A = 0.044715


@dataclasses.dataclass(frozen=True)
class Activation:
  name: str
  fn: Callable[[jax.Array], jax.Array]  # elementwise nonlinearity
  grad: Callable[[jax.Array], jax.Array]  # its analytic derivative d fn / dz, elementwise
  gated: bool  # True for the GLU family


def normal_cdf(z):
  """Φ(z), via erfc so that the lower tail keeps its relative precision."""
  return 0.5 * lax.erfc(-z / _SQRT_2)


def normal_pdf(z):
  """φ(z)."""
  return jnp.exp(-0.5 * z * z) * _INV_SQRT_2PI


def gelu(z):
  # z·Φ(z) with Φ via erfc: equal to jax.nn.gelu(z, approximate=False), more precise for z ≪ 0.
  return z * normal_cdf(z)


def gelu_grad(z):
  return normal_cdf(z) + z * normal_pdf(z)


def _tanh_u2(z):
  """2u = 2·√(2/π)(z + 0.044715 z³), and its derivative d(2u)/dz."""
  return 2.0 * _TANH_C * (z + _TANH_A * z**3), 2.0 * _TANH_C * (1.0 + 3.0 * _TANH_A * z * z)


def gelu_tanh(z):
  # ½(1 + tanh u) = σ(2u): the same function as jax.nn.gelu(z, approximate=True), but without
  # the cancellation in 1 + tanh u that zeroes it (and its derivative) for z below about −4.
  return z * jax.nn.sigmoid(_tanh_u2(z)[0])


def gelu_tanh_grad(z):
  u2, du2 = _tanh_u2(z)
  s = jax.nn.sigmoid(u2)
  return s + z * s * jax.nn.sigmoid(-u2) * du2


def elu(z):
  return jax.nn.elu(z, alpha=1.0)


def _sigmoid_grad(z):
  return jax.nn.sigmoid(z) * jax.nn.sigmoid(-z)


def _silu_grad(z):
  return jax.nn.sigmoid(z) * (1.0 + z * jax.nn.sigmoid(-z))


# name -> (fn, grad) for the plain (non-gated) activations.
_PLAIN = {
    "relu": (jax.nn.relu, lambda z: (z > 0).astype(z.dtype)),
    "relu2": (lambda z: jnp.square(jax.nn.relu(z)), lambda z: 2.0 * jax.nn.relu(z)),
    "tanh": (jnp.tanh, lambda z: 1.0 - jnp.tanh(z) ** 2),
    "elu": (elu, lambda z: jnp.where(z > 0, 1.0, jnp.exp(jnp.minimum(z, 0.0))).astype(z.dtype)),
    "gelu": (gelu, gelu_grad),
    "gelu_tanh": (gelu_tanh, gelu_tanh_grad),
    "silu": (jax.nn.silu, _silu_grad),
    "sigmoid": (jax.nn.sigmoid, _sigmoid_grad),
    "identity": (lambda z: z, jnp.ones_like),
}
# gated name -> the plain activation applied to the gate.
GATE_BASE = {
    "swiglu": "silu", "geglu": "gelu", "reglu": "relu", "glu": "sigmoid", "bilinear": "identity",
}

_REGISTRY = {name: Activation(name, *_PLAIN[name], gated=False) for name in _PLAIN} | {
    name: Activation(name, *_PLAIN[base], gated=True) for name, base in GATE_BASE.items()
}
NAMES: tuple[str, ...] = tuple(_REGISTRY)


def get(name: str) -> Activation:
  """The registered activation called `name`; ValueError (listing valid names) otherwise."""
  try:
    return _REGISTRY[name]
  except KeyError:
    raise ValueError(f"unknown activation {name!r}; valid names: "
                     f"{', '.join(sorted(_REGISTRY))}") from None


def value_table(zs=(-3, -1, 0, 0.5, 1, 3)) -> str:
  """Markdown table of Φ, exact GELU, tanh GELU, GELU' and ELU at `zs` (4 decimals)."""
  z = jnp.asarray(zs, jnp.float32)
  cols = [normal_cdf(z), gelu(z), gelu_tanh(z), gelu_grad(z), elu(z)]
  lines = ["| z | Φ(z) | GELU exact | GELU tanh | GELU'(z) | ELU |", "|---|---|---|---|---|---|"]
  for i, zi in enumerate(zs):
    # `+ 0.0` turns a rounded -0.0 into 0.0 so no cell reads "-0.0000".
    cells = [f"{round(float(c[i]), 4) + 0.0:.4f}" for c in cols]
    lines.append(f"| {zi:g} | " + " | ".join(cells) + " |")
  return "\n".join(lines)
