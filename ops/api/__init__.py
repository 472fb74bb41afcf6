"""The step API below the steps: what a step and a domain package both build with.

pyinfra keeps its ``api/`` (commands, facts, state) apart from its ``operations/``; here too the
primitives live below the step families, so the domain packages (``ops/service``, ``ops/bench``,
``ops/gpu``) build their facts and plans with them without importing ``ops/steps``:

- ``changes``: :class:`~ops.api.changes.Fact` (a read-only command and its pure parser), the
  changes a plan lists (``Run``, ``Write``, ``Action``), ``Plan``, ``Applied`` and ``StepFailed``;
- ``args``: declared step arguments (``Arg``, ``arguments``, ``check_args``) and their converters;
- ``context``: ``StepContext``, what one step sees on one host, and the run-wide ``Progress``;
- ``templates``: ``render_template``, Jinja2 with the host's variables.

How a registered step is written on top of them: ``ops/steps/base.py``.
"""
