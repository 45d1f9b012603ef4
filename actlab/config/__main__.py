"""python -m actlab.config: every field with its default and meaning, or with --config=FILE[:arg]
the config it resolves to (config/fields.py)."""

from actlab.config import fields

fields.main()
