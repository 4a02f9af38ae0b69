"""The client API: starting runs, and reading, deciding for, steering and cancelling
the runs that exist; schedules.
"""
