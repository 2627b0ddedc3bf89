"""Pure renderers: model (and `now`) to bytes, one module per tree."""
