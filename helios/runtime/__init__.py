"""The runtime: the one step loop (step.py) and the hosts that drive it: the threaded server
runtime (runtime.py, with its streams and publication) and the synchronous driver (driver.py)."""
