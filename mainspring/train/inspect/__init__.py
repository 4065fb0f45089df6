"""Environment quality inspection (`mainspring inspect`): checks of a training domain's verifier,
reward, data and difficulty before RL amplifies what is wrong with them.

    findings = inspect_domains(domains, InspectOptions(), source=None)  # None: model-free checks only
    write_report(findings, out_dir, list(domains))

findings.py holds the shared types; runner.py runs the checks; report.py writes report.md, PNG plots
and findings.json; cli.py is the command and the gate of `mainspring train`.
"""

from mainspring.train.inspect.findings import CompletionSource, Finding, InspectOptions, Severity, items
from mainspring.train.inspect.runner import Check, builtin_checks, counts, has_errors, inspect_domain, inspect_domains

__all__ = ["Check", "CompletionSource", "Finding", "InspectOptions", "Severity", "builtin_checks", "counts",
           "has_errors", "inspect_domain", "inspect_domains", "items"]
