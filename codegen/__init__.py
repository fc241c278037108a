"""Code generation, installed as `rulec.codegen`: a scheduled kernel validated, decomposed (rules/decomp.rules),
optimized (opt/) and rendered as LLVM IR or OpenCL C, through the one pipeline the devices call (pipeline.py)."""
