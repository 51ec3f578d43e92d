"""Microbenchmarks, one module per family; each exposes `items(ctx) -> list[BenchItem]`."""
