"""The benchmark's cases, one module each, named NN_name.py and run in the order of NN.

A case module's docstring says what it measures and against which peer. The module has
    CASES = (N, …)       the case numbers it reports: `Benchmarks/run --only N` runs it (alone)
    DATA = ("big", …)    the data sets it shares with other cases (harness/data.py), if any
    make_data(b)         makes its own data under b.site, if it has any
    run(b)               measures, and adds rows (sections, notes) to b.report
    NGINX_LOCATION       optional: location blocks for the server of every run ({site}: the served folder)
where b is the run's harness.bench.Bench. A case raises harness.measure.Failure when something breaks: it is
reported, and the other cases still run.
"""
import importlib
import os


def modules():
    """Every case module, in the order of their numbers."""
    here = os.path.dirname(os.path.abspath(__file__))
    names = sorted(n[:-3] for n in os.listdir(here) if n[:1].isdigit() and n.endswith(".py"))
    return [importlib.import_module(f"{__name__}.{name}") for name in names]
