"""Section VII of esa-privacy-revisited, regenerated (``esa experiment``).

A layer beside ``pipelines``: it uses the exact simulators below it and, for the message-level
check only, the pipelines themselves. One job per module:

- ``scenarios``: the datasets of Table II, the configuration and the scenario grid;
- ``budgets``: each scenario's privacy parameters (Theorems III.1 and IV.1, the Gaussian baseline);
- ``sketch``: the exact aggregate simulator of the count sketch;
- ``lab``: outcomes of scenarios, computed with the exact simulators and cached;
- ``paper``: the numbers the paper prints (the tables' paper columns and the tests read them);
- ``records``, ``utility_tables``, ``privacy_tables``, ``tables``: the table builders;
- ``render``: CSV, Markdown and report.md; ``figures``: the PNG figures;
- ``check``: one row per table re-run through the Beam pipeline; ``runner``: one whole run.

Randomness: every scenario draws from its own generator, derived from the experiment seed and the
scenario's name, so a table's numbers do not depend on which other tables ran before it, nor on
how many processes computed them.
"""
