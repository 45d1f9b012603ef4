"""python -m actlab.models: the activations' value table (`activations.value_table`)."""
from actlab.models import activations

print(activations.value_table())
