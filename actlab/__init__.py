"""actlab: how the FFN activation inside a Transformer changes what it learns and how stably it
trains (README.md; the packages and their layers: docs/design.md §2)."""
