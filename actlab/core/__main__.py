"""python -m actlab.core: the activations' value table (`activations.value_table`)."""
from actlab.core import activations

print(activations.value_table())
