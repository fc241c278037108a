"""The compiler proper, installed as `rulec.engine`, in layers that import only downwards (docs/architecture.md):
ir/ (the IR) and diskcache.py, lang/ (the rule language), sched/ (the scheduler), realize.py, tensor/ and
autograd/ (the front end), jit.py and verify/. Code generation and the devices, `rulec.codegen` and
`rulec.runtime`, sit between the rule language and the scheduler."""
