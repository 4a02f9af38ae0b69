"""Run state in Redis: the map of keys, the Lua scripts and their arguments, the codec,
the stored snapshots and the agent cache, the index shards, and the sub-stores.
"""
