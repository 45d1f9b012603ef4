"""FFN activation functions, their analytic derivatives (`grad`, elementwise d fn / dz) and the
name registry (`get`), in pure `jax.numpy` (docs/reference.md §1.1). GELU goes through erfc and
its tanh form through σ, and grads use σ(−z) for 1 − σ(z): full precision in the tails. A gated
(GLU) name computes `fn(x W_gate) * (x W_up)` with the plain `fn` of `GATE_BASE`.
"""

import dataclasses
import difflib
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
  return jnp.exp(-0.5 * z * z) * _INV_SQRT_2PI


def gelu(z):
  return z * normal_cdf(z)


def gelu_grad(z):
  return normal_cdf(z) + z * normal_pdf(z)


def _tanh_u2(z):
  """2u = 2·√(2/π)(z + 0.044715 z³), and its derivative d(2u)/dz."""
  return 2.0 * _TANH_C * (z + _TANH_A * z**3), 2.0 * _TANH_C * (1.0 + 3.0 * _TANH_A * z * z)


def gelu_tanh(z):
  # σ(2u), not ½(1 + tanh u) as jax.nn.gelu(z, approximate=True): no cancellation for z < −4.
  return z * jax.nn.sigmoid(_tanh_u2(z)[0])


def gelu_tanh_grad(z):
  u2, du2 = _tanh_u2(z)
  s = jax.nn.sigmoid(u2)
  return s + z * s * jax.nn.sigmoid(-u2) * du2


_PLAIN = {  # name -> (fn, grad)
    "relu": (jax.nn.relu, lambda z: (z > 0).astype(z.dtype)),
    "relu2": (lambda z: jnp.square(jax.nn.relu(z)), lambda z: 2.0 * jax.nn.relu(z)),
    "tanh": (jnp.tanh, lambda z: 1.0 - jnp.tanh(z) ** 2),
    "elu": (jax.nn.elu,
            lambda z: jnp.where(z > 0, 1.0, jnp.exp(jnp.minimum(z, 0.0))).astype(z.dtype)),
    "gelu": (gelu, gelu_grad),
    "gelu_tanh": (gelu_tanh, gelu_tanh_grad),
    "silu": (jax.nn.silu, lambda z: jax.nn.sigmoid(z) * (1.0 + z * jax.nn.sigmoid(-z))),
    "sigmoid": (jax.nn.sigmoid, lambda z: jax.nn.sigmoid(z) * jax.nn.sigmoid(-z)),
    "identity": (lambda z: z, jnp.ones_like),
}
GATE_BASE = {  # gated name -> the plain activation applied to the gate
    "swiglu": "silu", "geglu": "gelu", "reglu": "relu", "glu": "sigmoid", "bilinear": "identity",
}

_REGISTRY = {name: Activation(name, *_PLAIN[name], gated=False) for name in _PLAIN} | {
    name: Activation(name, *_PLAIN[base], gated=True) for name, base in GATE_BASE.items()
}
NAMES: tuple[str, ...] = tuple(_REGISTRY)
# Other papers' and libraries' names for registered activations: suggested by `get`, not accepted
# (a run's config.json names its activation one way).
ALIASES = {"swish": "silu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
           "squared_relu": "relu2", "linear": "identity"}


def get(name: str) -> Activation:
  """The registered activation called `name`; ValueError otherwise, with the name it may mean
  (in lower case, an alias's, or the closest) and the valid names."""
  try:
    return _REGISTRY[name]
  except KeyError:
    lower = str(name).lower()
    meant = ALIASES.get(lower, lower)
    close = [meant] if meant in _REGISTRY else difflib.get_close_matches(meant, _REGISTRY, n=1)
    raise ValueError(f"unknown activation {name!r}; "
                     + (f"did you mean {close[0]!r}? " if close else "")
                     + f"valid names: {', '.join(sorted(_REGISTRY))}") from None


def value_table(zs=(-3, -1, 0, 0.5, 1, 3)) -> str:
  """Markdown table of Φ, exact GELU, tanh GELU, GELU' and ELU at `zs` (4 decimals)."""
  z = jnp.asarray(zs, jnp.float32)
  cols = [normal_cdf(z), gelu(z), gelu_tanh(z), gelu_grad(z), jax.nn.elu(z)]
  lines = ["| z | Φ(z) | GELU exact | GELU tanh | GELU'(z) | ELU |", "|---|---|---|---|---|---|"]
  for i, zi in enumerate(zs):
    # `+ 0.0` turns a rounded -0.0 into 0.0 so no cell reads "-0.0000".
    cells = [f"{round(float(c[i]), 4) + 0.0:.4f}" for c in cols]
    lines.append(f"| {zi:g} | " + " | ".join(cells) + " |")
  return "\n".join(lines)
