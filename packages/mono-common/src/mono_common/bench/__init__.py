"""Benchmarks of mono-common: the stage library alone (`mono bench stages`) and the read ceiling
every floor is measured against. GPU only; torch is imported when a benchmark runs."""
