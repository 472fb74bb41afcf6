"""File helpers that the drafter lint, the controller and the runtime share; standard library only.

- ``store``: where files are read and written (``Store``, which an ``ops.connection.Connection``
  satisfies over SFTP, and ``LocalStore``, the local disk with atomic writes);
- ``jsonpos``: a JSON reader that remembers the line and column of every value, so an error can
  name ``file:line`` and a patch can edit a value in place.

They sit apart from ``drafter_config`` (which uses both for checkpoints) so that ``ops/bench``
(results files) uses them without reaching into the lint's internals.
"""
