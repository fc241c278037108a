"""Autograd over tensor-level graphs: the gradient of each op is a rule (rules/gradient.rules), the driver here only
walks the graph and adds up what the rules give."""
from rulec.engine.autograd.driver import NoGradientRule, gradients

__all__ = ["gradients", "NoGradientRule"]
