"""The run, decided: its records and events, budgets, what a step writes, and the
engine's table. No I/O: the tasks load a run, call `decide`, and save what it returns.
"""
