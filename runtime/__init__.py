"""The devices, installed as `rulec.runtime`: buffers, device names and transfers, and the CPU, CL and NUMPY
devices, leaves that compile what codegen gives them (codegen/pipeline.py) and launch it."""
