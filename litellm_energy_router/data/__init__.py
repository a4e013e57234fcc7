"""Bundled data: the RouterBench development rows (gzipped, see routerbench/NOTICE.md) and the
ML.ENERGY-derived energy profile."""
