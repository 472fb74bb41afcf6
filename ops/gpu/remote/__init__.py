"""Scripts that run ON a host, fed to its Python on stdin; standard library only at import time.

They print one JSON object each and never write anything: the controller decides what the facts
mean (`ops.gpu.facts`, `ops.gpu.policy`), so the decisions stay testable without a GPU.
"""
