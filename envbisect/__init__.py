"""envbisect: which change broke the serving stack, and is it a change at all?"""
__version__ = "0.1.0"
