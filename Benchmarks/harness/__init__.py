"""The shared half of the benchmark (Benchmarks/run calls `python3 -m harness`): nginx and `packs serve`
(servers), measuring one command (measure), running commands alternately (bench), the data (data), the
report (tables) and --profile (profile). The cases are in Benchmarks/cases/."""
