"""Benchmarks: `python -m bench` runs every bench_*.py module (each has main(argv) -> int)."""
