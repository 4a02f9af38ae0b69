"""What the tasks do, with no Celery in it: advance a run, make a call (claim, run,
keep), continue in place, the tick; what each task reports and counts.
"""
